"""How far a configuration's logits are from its reference's on the same tokens: token flips
and logit drift per position, per item and per run (docs/recompute.md)."""

from __future__ import annotations

import math

import numpy as np

from ..engine.generation.cache_free import greedy

ROWS = 32  # positions compared at a time

# name -> higher is better; every one is a per-item value paired with the control's.
METRICS = {"flip_rate": False, "flipped": False, "first_flip": True, "max_dlogit": False, "kld": False}


def compare(own: np.ndarray, reference: np.ndarray) -> dict[str, float]:
    """One item: ``own`` and ``reference`` are ``(positions, n_vocab)`` logits at the same
    positions of the same tokens. ``flip_rate``: share of positions whose greedy tokens differ;
    ``flipped``: 1 if any does; ``first_flip``: the first such position (NaN if none);
    ``max_dlogit``: the largest |own - reference| of any logit; ``kld``: KL(reference || own)
    per position, in nats, averaged over positions."""
    if own.shape != reference.shape or not len(own):
        raise ValueError(f"logits to compare must have the same, non-empty shape: {own.shape} and {reference.shape}")
    flips = np.flatnonzero(greedy(own) != greedy(reference))
    kld, dlogit = [], 0.0
    for start in range(0, len(own), ROWS):  # float64 copies of a few rows at a time, not of all
        a, b = own[start : start + ROWS].astype(np.float64), reference[start : start + ROWS].astype(np.float64)
        log_p = b - np.logaddexp.reduce(b, axis=1, keepdims=True)
        log_q = a - np.logaddexp.reduce(a, axis=1, keepdims=True)
        with np.errstate(invalid="ignore"):  # NaN/Inf logits give NaN, not a warning
            kld.append((np.exp(log_p) * (log_p - log_q)).sum(axis=1))
            dlogit = float(np.maximum(dlogit, np.abs(a - b).max()))  # NaN stays NaN
    return {
        "flip_rate": len(flips) / len(own),
        "flipped": float(len(flips) > 0),
        "first_flip": float(flips[0]) if len(flips) else math.nan,
        "max_dlogit": dlogit,
        "kld": float(np.concatenate(kld).mean()),
    }


def summarize(per_item: list[dict[str, float]]) -> tuple[dict[str, float], dict[str, list[float]]]:
    """(the run's values: each metric's mean over items, ``first_flip`` over the items that
    flip; the per-item values)."""
    items = {m: [d[m] for d in per_item] for m in METRICS}
    means = {}
    for m, values in items.items():
        arr = np.asarray(values, dtype=np.float64)
        means[m] = float(np.nanmean(arr)) if np.isfinite(arr).any() else math.nan
    return means, items
