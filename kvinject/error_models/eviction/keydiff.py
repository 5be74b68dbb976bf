"""``keydiff``: KeyDiff (kvpress ``KeyDiffPress``; Park et al., "KeyDiff: Key Similarity-Based
KV Cache Eviction for Long-Context LLM Inference in Resource-Constrained Environments", 2025):
each token's score is minus the cosine similarity of its key to the anchor, the mean of the
held tokens' unit keys, in each layer and KV head, then the mean over them; the keys least like
the others are kept. The anchor moves as tokens come and go, so the unit keys are kept as they
arrive and the scores taken where the cache is cut."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import HeadScored, Rows, register


@register
@dataclass(frozen=True)
class KeyDiff(HeadScored):
    name = "keydiff"
    summary = "keys least like the mean key"
    reads = "keys"

    def observe(self, cache, seq, held, n0, n1):
        keys = cache.keys(seq, np.arange(n0, n1)).transpose(1, 0, 2, 3)  # (tokens, layers, heads, dim)
        unit = keys / np.maximum(np.linalg.norm(keys, axis=-1, keepdims=True), 1e-8)  # torch's cosine_similarity eps
        cache.state(seq).setdefault("unit", Rows()).append(unit)

    def head_scores(self, cache, seq, held):
        units = cache.state(seq)["unit"][held]
        anchor = units.mean(axis=0)  # (layers, heads, dim)
        cosine = np.einsum("tlhd,lhd->lht", units, anchor) / np.maximum(np.linalg.norm(anchor, axis=-1), 1e-8)[..., None]
        return -cosine.astype(np.float64)
