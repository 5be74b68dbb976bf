"""Budgets per layer and per KV head over a method's scores, as kvpress allocates them:
``alloc=heads`` (B per KV head of every layer, each head its own best: what kvpress's
``ScorerPress`` does by itself), ``alloc=ada`` (``AdaKVPress``; Feng et al., "Ada-KV", 2024) and
``alloc=pyramid`` (``PyramidKVPress``; Cai et al., "PyramidKV", 2024). Each takes the scores of a sequence's held
tokens per layer and KV head, (layers, heads, tokens), and a budget of B tokens, and returns
which each layer's heads keep (the same shape, bool): in all, B per layer and head on average.
Every head keeps the sequence's newest token (llama.cpp requires its positions to follow on).
A token no head keeps leaves the cache; the others are hidden from the heads that drop them
(kvinject/engine/graph/hidden.py)."""

from __future__ import annotations

import numpy as np

from . import top


def _newest_first(scores: np.ndarray) -> np.ndarray:
    scores = scores.astype(np.float64, copy=True)
    scores[..., -1] = np.inf
    return scores


def ada(scores: np.ndarray, budget: int, alpha: float) -> np.ndarray:
    """In each layer, the heads x B highest scores over all its heads, after each head's
    int(alpha x B) best are raised above the rest (kvpress's safeguard: no head keeps less)."""
    scores = _newest_first(scores)
    heads, n = scores.shape[1:]
    kept = np.zeros(scores.shape, bool)
    for layer, x in enumerate(scores):
        for h in range(heads):
            x[h, top(x[h], int(budget * alpha))] = np.finfo(np.float64).max
        chosen = top(x.ravel(), heads * budget)
        kept[layer, chosen // n, chosen % n] = True
    return kept


def layer_budgets(layers: int, n: int, budget: int, window: int, beta: int) -> list[int]:
    """PyramidKV's budget of each layer for B of n tokens (kvpress ``get_layer_budget``, from
    KVCache-Factory): from ``2 B - B / beta`` in the first layer down to ``B / beta`` in the last,
    in equal steps, B a layer on average; capped at n - window; where the pyramid cannot fit
    (a budget under the window), B in every layer, as SnapKV."""
    low = budget / beta
    high = 2 * budget - low
    if high >= n - window:
        high = n - window
        low = 2 * budget - high
    if layers == 1 or not n >= high >= low >= window:
        return [budget] * layers
    step = (high - low) / (layers - 1)
    return [round(high - layer * step) for layer in range(layers)]


def pyramid(scores: np.ndarray, budget: int, window: int, beta: int) -> np.ndarray:
    """Each head of layer l keeps its ``layer_budgets()[l]`` highest scores."""
    return per_layer(scores, layer_budgets(len(scores), scores.shape[2], budget, window, beta))


def per_layer(scores: np.ndarray, budgets: list[int]) -> np.ndarray:
    """Each head of layer l keeps its ``budgets[l]`` highest scores (``alloc=heads``: B in every
    layer, as kvpress's ScorerPress keeps each KV head's top B)."""
    scores = _newest_first(scores)
    kept = np.zeros(scores.shape, bool)
    for layer, (x, b) in enumerate(zip(scores, budgets)):
        for h in range(len(x)):
            kept[layer, h, top(x[h], b)] = True
    return kept


ALLOCATIONS = {"heads": "", "ada": "alpha", "pyramid": "window,beta"}  # each allocation's options (of evict)
