"""``knorm``: key norm (kvpress ``KnormPress``; Devoto et al., "A Simple and Effective L2
Norm-Based Strategy for KV Cache Compression", 2024): each token's score is minus the L2 norm of
its key (as the cache holds it, after RoPE) in each layer and KV head, the mean over them; the
lowest norms are kept. A key does not change once cached, so its norms are taken when it arrives."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import HeadScored, Rows, register


@register
@dataclass(frozen=True)
class KNorm(HeadScored):
    name = "knorm"
    summary = "lowest key norms"
    reads = "keys"

    def observe(self, cache, seq, held, n0, n1):
        norms = np.linalg.norm(cache.keys(seq, np.arange(n0, n1)), axis=-1)  # (layers, tokens, heads)
        cache.state(seq).setdefault("norms", Rows()).append(norms.transpose(1, 0, 2))

    def head_scores(self, cache, seq, held):
        return -cache.state(seq)["norms"][held].transpose(1, 2, 0).astype(np.float64)
