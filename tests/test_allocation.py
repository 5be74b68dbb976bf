"""The knapsack over a profile against brute force on small problems: every allocation of up
to 3^5 is tried."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from kvinject.experiments.allocation import Problem, hull, within


def problems(seed: int) -> Problem:
    rng = np.random.default_rng(seed)
    cells, choices = 5, 3
    bits = np.array([2.5, 4.5, 8.5])
    # Loss falls with bits in every cell (a quantizer's does), by a cell's own sensitivity.
    sensitivity = rng.lognormal(0, 1.5, cells)
    cost = sensitivity[:, None] * np.exp(-rng.uniform(0.5, 1.2, (cells, 1)) * bits) * rng.uniform(0.8, 1.2, (cells, choices))
    weight = rng.choice([64.0, 128.0], cells)
    return Problem(cost, bits, weight)


def every(problem: Problem) -> list[np.ndarray]:
    cells, choices = problem.cost.shape
    return [np.array(p) for p in itertools.product(range(choices), repeat=cells)]


@pytest.mark.parametrize("seed", range(8))
def test_each_hull_allocation_is_the_cheapest_at_its_bits(seed):
    problem = problems(seed)
    everything = every(problem)
    points = hull(problem)
    assert len(points) >= 3
    for pick in points:
        bits = problem.average_bits(pick)
        best = min(problem.total_cost(p) for p in everything if problem.average_bits(p) <= bits + 1e-12)
        assert problem.total_cost(pick) == pytest.approx(best, rel=1e-12)


@pytest.mark.parametrize("seed", range(8))
def test_within_fits_the_budget_and_improves_on_the_hull_point_below_it(seed):
    problem = problems(seed)
    everything = every(problem)
    for budget in (3.0, 4.0, 5.5, 7.0):
        pick = within(problem, budget)
        below = [p for p in hull(problem) if problem.average_bits(p) <= budget]
        assert problem.average_bits(pick) <= budget + 1e-12
        assert problem.total_cost(pick) <= problem.total_cost(below[-1])
        best = min(problem.total_cost(p) for p in everything if problem.average_bits(p) <= budget + 1e-12)
        assert problem.total_cost(pick) >= best  # no allocation beats the true optimum
    assert within(problem, 2.0) is None  # below every choice
