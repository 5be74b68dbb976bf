"""``snapkv``: SnapKV (kvpress ``SnapKVPress``): once a prompt ends, the attention of its last
``window`` queries on the earlier tokens, averaged over those queries and pooled over
``kernel`` neighbouring tokens (zero-padded mean); the window and the best B - window earlier
tokens are kept. Generated tokens are never evicted."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import Method, register, top


@register
@dataclass(frozen=True)
class SnapKV(Method):
    window: int = 64
    kernel: int = 5
    name = "snapkv"
    summary = "prompt's last window, pooled, once per prompt"
    reads = "attention"

    def observe(self, cache, seq, held, n0, n1):
        # The attention of the latest `window` queries on every token, kept across a prompt's pieces.
        state = cache.state(seq)
        rows = np.zeros((n1 - n0, n1))
        rows[:, held] = cache.attention(seq)
        earlier = state.get("window", np.zeros((0, n1)))
        state["window"] = np.concatenate([np.pad(earlier, ((0, 0), (0, n1 - earlier.shape[1]))), rows])[-self.window :]

    def keep(self, cache, seq, held, budget):
        if not cache.prompt_ended(seq):
            return None
        w = min(self.window, len(held))
        if budget <= w:  # the window alone is over the budget: its last B
            return np.arange(len(held) - budget, len(held))
        scores = cache.state(seq)["window"][:, held[: len(held) - w]].mean(0)
        half = self.kernel // 2  # zero-padded, as F.avg_pool1d(padding=kernel // 2); "same" would widen fewer than kernel scores
        pooled = np.convolve(scores, np.ones(self.kernel) / self.kernel, "full")[half : half + len(scores)]
        return np.concatenate([top(pooled, budget - w), np.arange(len(held) - w, len(held))])
