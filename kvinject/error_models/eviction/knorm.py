"""``knorm``: key norm (kvpress ``KnormPress``; Devoto et al., "A Simple and Effective L2
Norm-Based Strategy for KV Cache Compression", 2024): each token's score is minus the L2 norm of
its key (as the cache holds it, after RoPE), the mean over layers and KV heads; the lowest
norms are kept. A key does not change once cached, so its score is taken when it arrives."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import Method, newest_kept, register, scored_on_arrival


@register
@dataclass(frozen=True)
class KNorm(Method):
    name = "knorm"
    summary = "lowest key norms"
    reads = "keys"

    def observe(self, cache, seq, held, n0, n1):
        norms = np.linalg.norm(cache.keys(seq, np.arange(n0, n1)), axis=-1)  # (layers, tokens, heads)
        scored_on_arrival(cache, seq, -norms.mean(axis=(0, 2), dtype=np.float64))

    def keep(self, cache, seq, held, budget):
        return newest_kept(cache.state(seq)["scores"][held], budget)
