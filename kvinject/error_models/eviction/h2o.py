"""``h2o``: H2O (github.com/FMInference/H2O, h2o_hf/utils_real_drop/modify_llama.py,
``H2OKVCache_LayerWise``): each token's attention summed over every query since it arrived; the
last ``recent`` share of B kept (at least one token), the rest of B the highest sums among the
older tokens."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import Method, register, top


@register
@dataclass(frozen=True)
class H2O(Method):
    recent: float = 0.5
    name = "h2o"
    summary = "accumulated attention + recent share"
    reads = "attention"

    def observe(self, cache, seq, held, n0, n1):
        state = cache.state(seq)
        sums = np.zeros(n1)
        sums[: len(state.get("sums", ()))] = state.get("sums", ())
        sums[held] += cache.attention(seq).sum(0)
        state["sums"] = sums

    def keep(self, cache, seq, held, budget):
        sums = cache.state(seq)["sums"]
        recent = max(1, int(budget * self.recent))
        older = len(held) - recent
        return np.concatenate([top(sums[held[:older]], budget - recent), np.arange(older, len(held))])
