"""Bits allocated per layer and K/V: a multiple-choice knapsack over a sensitivity profile.

Each cell (a layer's K or V) takes one of several choices (``quant:2``, ``quant:4``, ...), each
with its bits per element and its cost, the metric the profile measured with that choice in that
cell alone. Costs are taken as adding up over cells (small errors do, to first order; the real
runs that follow check it). Minimizing the summed cost at a budget of average bits is a
multiple-choice knapsack: its Lagrangian, ``cost + λ · bits`` minimized cell by cell, gives for
every λ an allocation on the lower convex hull of (bits, cost), each optimal at its own bits;
between two hull points a greedy pass spends what a budget leaves (the best cost saved per bit
first), as knapsack heuristics do.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Problem:
    cost: np.ndarray  # (cells, choices): the metric's loss with that choice in that cell alone
    bits: np.ndarray  # (choices,) or (cells, choices): bits per element of each choice
    weight: np.ndarray  # (cells,): each cell's elements (its row width), which its bits count by

    def __post_init__(self) -> None:
        object.__setattr__(self, "bits", np.broadcast_to(np.asarray(self.bits, float), self.cost.shape))

    def average_bits(self, pick: np.ndarray) -> float:
        """The mean bits per element of allocation ``pick`` (a choice per cell)."""
        rows = np.arange(len(pick))
        return float((self.bits[rows, pick] * self.weight).sum() / self.weight.sum())

    def total_cost(self, pick: np.ndarray) -> float:
        return float(self.cost[np.arange(len(pick)), pick].sum())


def hull(problem: Problem) -> list[np.ndarray]:
    """The allocations that minimize ``cost + λ · bits`` for some λ ≥ 0, cheapest in bits first:
    each is the least cost any allocation reaches at its bits or fewer, on the convex hull."""
    weighted = problem.bits * problem.weight[:, None]
    # Each cell's choice changes only where λ crosses a slope between two of its choices.
    gaps = weighted[:, :, None] - weighted[:, None, :]
    slopes = (problem.cost[:, None, :] - problem.cost[:, :, None]) / np.where(gaps > 0, gaps, np.nan)
    crossings = np.unique(slopes[np.isfinite(slopes) & (slopes > 0)])
    # Between crossings the argmin is constant: probe midpoints, both ends, and a λ past the last.
    probes = np.concatenate([[0.0], (crossings[1:] + crossings[:-1]) / 2, crossings * (1 + 1e-9), [crossings.max(initial=1.0) * 2 + 1]])
    found: dict[bytes, np.ndarray] = {}
    for lam in probes:
        # Ties: fewer bits first, so that a λ on a slope picks one end consistently.
        score = problem.cost + lam * weighted + 1e-15 * weighted
        pick = score.argmin(axis=1)
        found.setdefault(pick.tobytes(), pick)
    return sorted(found.values(), key=lambda p: (problem.average_bits(p), problem.total_cost(p)))


def within(problem: Problem, budget: float) -> np.ndarray | None:
    """The allocation of least cost found at ``budget`` average bits or fewer: the hull's last
    point within it, then upgrades by cost saved per bit while they fit. None: nothing fits."""
    points = [p for p in hull(problem) if problem.average_bits(p) <= budget + 1e-12]
    if not points:
        return None
    pick = points[-1].copy()
    rows = np.arange(len(pick))
    while True:
        saved = problem.cost[rows, pick][:, None] - problem.cost
        extra = (problem.bits - problem.bits[rows, pick][:, None]) * problem.weight[:, None] / problem.weight.sum()
        fits = (extra > 0) & (saved > 0) & (problem.average_bits(pick) + extra <= budget + 1e-12)
        if not fits.any():
            return pick
        rate = np.where(fits, saved / np.where(extra > 0, extra, 1), -np.inf)
        cell, choice = np.unravel_index(rate.argmax(), rate.shape)
        pick[cell] = choice


def pareto(bits: np.ndarray, score: np.ndarray, higher_is_better: bool) -> np.ndarray:
    """Indices of the points no other point beats at no more bits, by increasing bits."""
    order = np.lexsort((-score if higher_is_better else score, bits))
    front, best = [], None
    for i in order:
        s = score[i] if higher_is_better else -score[i]
        if best is None or s > best:
            front.append(i)
            best = s
    return np.array(front, dtype=int)
