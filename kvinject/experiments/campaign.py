"""How many injections a fault campaign needs, and the runs that give them.

Leveugle, Hubert, Cimonnet and Nicolaidis, "Statistical fault injection: quantified error and
confidence", DATE 2009: for a rate estimated within ±e at a confidence whose normal quantile is
t, from a population of N fault sites, n = N / (1 + e^2 (N - 1) / (t^2 p (1 - p))), with p = 0.5
the most cautious. Each item of each run of a single-fault configuration is one injection.
"""

from __future__ import annotations

import math
from statistics import NormalDist

from ..exceptions import KvinjectError

# The normal quantile by the standard library (Wichura's AS241, within 1e-15 of scipy's): scipy.stats
# would load 0.7 s and about 70 MB into every sweep and run for this one number.
_NORMAL = NormalDist()


def campaign_size(margin: float, confidence: float = 0.95, population: int | None = None, p: float = 0.5) -> int:
    """Injections for an estimated rate within ±``margin`` at ``confidence``, drawn from a fault
    population of ``population`` sites (None: so many that it does not matter, as the KV cache's
    bits of a run are), the rate taken as ``p``."""
    if not 0 < margin < 1:
        raise KvinjectError(f"the margin is a share in (0, 1), e.g. 0.03 for ±3%, got {margin}")
    if not 0 < confidence < 1:
        raise KvinjectError(f"the confidence is in (0, 1), e.g. 0.95, got {confidence}")
    t2pq = _NORMAL.inv_cdf(0.5 + confidence / 2) ** 2 * p * (1 - p)
    if population is None:
        return math.ceil(t2pq / margin**2)
    return math.ceil(population / (1 + margin**2 * (population - 1) / t2pq))


def campaign_runs(margin: float, confidence: float, items: int) -> int:
    """Runs of ``items`` items each that make at least :func:`campaign_size` injections."""
    return math.ceil(campaign_size(margin, confidence) / items)


def campaign_margin(injections: int, confidence: float = 0.95) -> float:
    """The margin ``injections`` reach at ``confidence`` (p = 0.5, a population that does not matter)."""
    return float(_NORMAL.inv_cdf(0.5 + confidence / 2) * math.sqrt(0.25 / injections))
