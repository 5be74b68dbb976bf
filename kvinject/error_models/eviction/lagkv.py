"""``lagkv``: LagKV (kvpress ``LagKVPress``; Liang et al., "LagKV: Lag-Relative Information of
the KV Cache Tells Which Tokens Are Important", 2025): after ``sinks`` tokens, the held tokens
are cut into partitions of ``lag``; each partition is scored against the next, its reference:
every K (and V) channel min-max normalized by the reference's range, the standard deviation
over channels, a softmax over the partition's tokens, K's and V's averaged and ranked within the
partition (rank / lag). The sinks, the last whole partition and the tokens after it score 1,
above every rank, so they stay. Scores are taken per layer and KV head, then their mean. Fewer
than sinks + 2 lag tokens: the sinks, then the most recent (kvpress's short-prompt scores)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import HeadScored, register


def lag_scores(x: np.ndarray, sinks: int, lag: int) -> np.ndarray:
    """Each partitioned token's score, (layers, partitions - 1, lag, heads), from rows ``x`` of
    shape (layers, tokens, heads, dim) after the sinks, whole partitions only."""
    parts = x.reshape(x.shape[0], -1, lag, *x.shape[2:]).astype(np.float64)
    ref = parts[:, 1:]
    low, high = ref.min(axis=2, keepdims=True), ref.max(axis=2, keepdims=True)
    spread = ((parts[:, :-1] - low) / (high - low)).std(axis=-1, ddof=1)  # torch.std: unbiased
    e = np.exp(spread - spread.max(axis=2, keepdims=True))
    return e / e.sum(axis=2, keepdims=True)


@register
@dataclass(frozen=True)
class LagKV(HeadScored):
    sinks: int = 4
    lag: int = 128
    name = "lagkv"
    summary = "lag-relative spread of K and V, per partition"
    reads = "keys and values"

    def head_scores(self, cache, seq, held):
        n = len(held)
        layers, _, heads, _ = (keys := cache.keys(seq, held[:1])).shape
        scores = np.ones((layers, heads, n))
        if n < self.sinks + 2 * self.lag:
            scores[..., self.sinks :] = np.arange(n - self.sinks) / (n - self.sinks)
            return scores
        end = self.sinks + (n - self.sinks) // self.lag * self.lag
        rows = held[self.sinks : end]  # the last whole partition is every other's reference, never scored
        both = (lag_scores(cache.keys(seq, rows), self.sinks, self.lag) + lag_scores(cache.values(seq, rows), self.sinks, self.lag)) / 2
        ranks = both.argsort(axis=2, kind="stable").argsort(axis=2, kind="stable") / self.lag  # within each partition
        scores[..., self.sinks : end - self.lag] = ranks.transpose(0, 3, 1, 2).reshape(layers, heads, -1)
        return scores
