"""Statistics for repeated benchmark runs compared with an unmodified control.

Shapes: for one (benchmark, configuration) and one metric, ``scores`` is a ``(runs, items)``
matrix of per-item values (pass/fail 0/1, a log-probability, ...); NaN marks a missing value.
Runs vary only through the random error draws; items are the unit of every paired test and of
the bootstrap. See ``docs/statistics.md`` for what each number means and why.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import asdict, dataclass
from typing import Any, Callable, Optional, Sequence

import numpy as np
from scipy import stats as _st

__all__ = [
    "PairedTest",
    "RunSummary",
    "WILCOXON_ZERO_METHOD",
    "across_runs",
    "bootstrap_ci",
    "compare_to_control",
    "item_means",
    "mcnemar_exact",
    "paired_bootstrap",
    "paired_t",
    "percent_of_control",
    "proportion_ci",
    "wilcoxon_paired",
]

# Pratt: zero differences take part in the ranking (so they push the non-zero ones to higher
# ranks) but not in the signed sum, and scipy corrects the null mean and variance for them
# (Cureton 1967). "zsplit" keeps the null variance of the full count, which is conservative.
WILCOXON_ZERO_METHOD = "pratt"
# Differences are rounded to this many decimals before ranking: pass rates over runs differ in
# the last bit by the order of subtraction (0.8 - 1 is -0.19999999999999996, 0.2 - 0 is 0.2),
# which would break their ties, always in favour of one sign, and hide ties from scipy's
# choice of method (a symmetric 40/40 split of ±0.2 among 180 items gave p = 0.21, not 1).
DIFFERENCE_DECIMALS = 12


def _check_confidence(confidence: float) -> None:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")


@dataclass(frozen=True)
class RunSummary:
    """Mean, std (ddof=1) and t-based CI of one metric across runs; NaN runs dropped, counted in n_nan."""

    n: int
    n_nan: int
    mean: float
    std: float
    ci_low: float
    ci_high: float
    confidence: float = 0.95

    def to_dict(self) -> dict[str, Any]:
        """Plain-Python dict (NaN kept; ``jsonutil.clean`` turns it into null)."""
        return asdict(self)


@dataclass(frozen=True)
class PairedTest:
    """A paired test of treated vs control over items; mean_diff = treated - control, b/c for McNemar only."""

    test: str
    statistic: float
    p_value: float
    n: int
    mean_diff: float
    b: Optional[int] = None
    c: Optional[int] = None

    def to_dict(self) -> dict[str, Any]:
        """Plain-Python dict (NaN kept; ``jsonutil.clean`` turns it into null)."""
        return asdict(self)


def across_runs(values: Sequence[float], confidence: float = 0.95) -> RunSummary:
    """Summarize one per-run metric: mean, std (ddof=1, 0 for one run) and t-CI of the mean (NaN for n < 2)."""
    _check_confidence(confidence)
    x = np.asarray(values, dtype=np.float64).ravel()
    nan = np.isnan(x)
    x = x[~nan]
    n, n_nan = int(x.size), int(nan.sum())
    if n == 0:
        return RunSummary(0, n_nan, math.nan, math.nan, math.nan, math.nan, confidence)
    mean = float(x.mean())
    if n == 1:
        return RunSummary(1, n_nan, mean, 0.0, math.nan, math.nan, confidence)
    std = float(x.std(ddof=1))
    half = float(_st.t.ppf(0.5 + confidence / 2.0, df=n - 1)) * std / math.sqrt(n)
    return RunSummary(n, n_nan, mean, std, mean - half, mean + half, confidence)


def _as_matrix(scores: np.ndarray | Sequence[Any], name: str = "scores") -> np.ndarray:
    m = np.asarray(scores, dtype=np.float64)
    if m.ndim == 1:
        m = m[np.newaxis, :]
    if m.ndim != 2:
        raise ValueError(f"{name} must have shape (runs, items), got {m.shape}")
    return m


def item_means(scores: np.ndarray | Sequence[Any]) -> np.ndarray:
    """Per-item mean over runs of a (runs, items) matrix, ignoring NaN; NaN where an item has no value."""
    m = _as_matrix(scores)
    valid = ~np.isnan(m)
    count = valid.sum(axis=0)
    total = np.where(valid, m, 0.0).sum(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(count > 0, total / np.maximum(count, 1), np.nan)


def _weighted_mean(x: np.ndarray, w: np.ndarray, axis: int = -1) -> np.ndarray:
    return (x * w).sum(axis=axis) / w.sum(axis=axis)


def bootstrap_ci(
    scores: np.ndarray,
    statistic: Callable[..., Any] = np.mean,
    confidence: float = 0.95,
    n_resamples: int = 2000,
    seed: int = 0,
    weights: np.ndarray | Sequence[float] | None = None,
) -> tuple[float, float]:
    """Percentile bootstrap CI resampling items (all runs of an item together); (nan, nan) below 2 items.

    ``statistic(item_means, axis=-1)`` is applied to the vector of per-item run-means (items
    with no valid value dropped), as ``scipy.stats.bootstrap`` requires. With ``weights`` (one
    per item) the statistic is the weighted mean of the resampled items, a pooled rate such as
    followed instructions over given ones.
    """
    _check_confidence(confidence)
    x = item_means(scores)
    keep = ~np.isnan(x)
    if keep.sum() < 2:
        return (math.nan, math.nan)
    data = (x[keep],) if weights is None else (x[keep], np.asarray(weights, dtype=np.float64)[keep])
    res = _st.bootstrap(
        data,
        statistic if weights is None else _weighted_mean,
        paired=weights is not None,
        n_resamples=n_resamples,
        confidence_level=confidence,
        method="percentile",
        rng=np.random.default_rng(seed),
    )
    return (float(res.confidence_interval.low), float(res.confidence_interval.high))


def proportion_ci(scores: np.ndarray | Sequence[Any], confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval of the share of 1s among pass/fail values (NaN dropped); (nan,
    nan) without values. Unlike a percentile bootstrap it does not shrink to a point at 0 of n
    or n of n (0 of 100: 0 to 0.037), and it covers near 0 and 1 as it says (Brown, Cai and
    DasGupta 2001)."""
    _check_confidence(confidence)
    x = np.asarray(scores, dtype=np.float64).ravel()
    x = x[~np.isnan(x)]
    if x.size == 0:
        return (math.nan, math.nan)
    ci = _st.binomtest(int(x.sum()), int(x.size)).proportion_ci(confidence_level=confidence, method="wilson")
    return (float(ci.low), float(ci.high))


def paired_bootstrap(
    control_scores: np.ndarray,
    treated_scores: np.ndarray,
    transform: Callable[[np.ndarray], np.ndarray] | None = None,
    confidence: float = 0.95,
    n_resamples: int = 2000,
    seed: int = 0,
    weights: np.ndarray | Sequence[float] | None = None,
) -> tuple[tuple[float, float], tuple[float, float]]:
    """Percentile bootstrap CIs of treated - control and of 100 * treated / control, resampling
    items as pairs (the same items on both sides; each item's runs averaged first, pairs with a
    missing side dropped). ``transform`` (vectorized, e.g. ``np.exp`` of a mean NLL) is applied
    to each side's mean over items, weighted by ``weights`` (one per item) if given. Both
    intervals from the same resamples; (nan, nan) below 2 pairs. A resample whose control is 0
    has a ratio of +inf (its tail) where the configuration's is not, none where both are 0: those
    are left out while they are under 1% of the resamples, else the ratio's interval is (nan, nan)."""
    _check_confidence(confidence)
    c, t = item_means(_as_matrix(control_scores, "control_scores")), item_means(_as_matrix(treated_scores, "treated_scores"))
    if c.shape != t.shape:
        raise ValueError(f"control and treated must have the same number of items: {c.size} != {t.size}")
    keep = ~(np.isnan(c) | np.isnan(t))
    w = np.ones(c.shape) if weights is None else np.asarray(weights, dtype=np.float64)
    nan = (math.nan, math.nan)
    if keep.sum() < 2:
        return nan, nan
    f = transform or (lambda x: x)

    def both(c: np.ndarray, t: np.ndarray, w: np.ndarray, axis: int = -1) -> np.ndarray:
        mc, mt = f(_weighted_mean(c, w, axis)), f(_weighted_mean(t, w, axis))
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.stack([mt - mc, 100.0 * mt / mc])

    with np.errstate(invalid="ignore"), warnings.catch_warnings():  # a control of 0 in a resample: NaN, said below
        warnings.simplefilter("ignore", _st.DegenerateDataWarning)
        res = _st.bootstrap(
            (c[keep], t[keep], w[keep]),
            both,
            paired=True,
            n_resamples=n_resamples,
            confidence_level=confidence,
            method="percentile",
            rng=np.random.default_rng(seed),
        )
    ratios = res.bootstrap_distribution[1]
    defined = ratios[~np.isnan(ratios)]
    tail = 50 * (1 - confidence)
    with np.errstate(invalid="ignore"):  # interpolating between two +inf: not finite, so no interval
        percent = tuple(float(x) for x in np.percentile(defined, [tail, 100 - tail])) if defined.size >= 0.99 * ratios.size else nan
    diff = (float(res.confidence_interval.low[0]), float(res.confidence_interval.high[0]))
    return diff, percent if all(map(math.isfinite, percent)) else nan


def _paired(control: Any, treated: Any) -> tuple[np.ndarray, np.ndarray]:
    a = np.asarray(control, dtype=np.float64).ravel()
    b = np.asarray(treated, dtype=np.float64).ravel()
    if a.shape != b.shape:
        raise ValueError(f"control and treated must have the same number of items: {a.size} != {b.size}")
    keep = ~(np.isnan(a) | np.isnan(b))
    return a[keep], b[keep]


def mcnemar_exact(control: np.ndarray, treated: np.ndarray) -> PairedTest:
    """Exact McNemar test on paired pass/fail: two-sided binomial test of b out of b + c at 0.5 (statistic = b)."""
    a, t = _paired(control, treated)
    if not (np.isin(a, (0.0, 1.0)).all() and np.isin(t, (0.0, 1.0)).all()):
        raise ValueError("mcnemar_exact needs pass/fail (0/1 or bool) values")
    ctrl, trt = a.astype(bool), t.astype(bool)
    b = int(np.count_nonzero(ctrl & ~trt))  # control pass, treated fail
    c = int(np.count_nonzero(~ctrl & trt))  # control fail, treated pass
    n = int(a.size)
    mean_diff = (c - b) / n if n else math.nan
    p = 1.0 if b + c == 0 else float(_st.binomtest(b, b + c, 0.5, alternative="two-sided").pvalue)
    return PairedTest("mcnemar_exact", float(b), p, n, mean_diff, b=b, c=c)


def wilcoxon_paired(control: np.ndarray, treated: np.ndarray) -> PairedTest:
    """Two-sided Wilcoxon signed-rank test on treated - control (Pratt zeros; p = 1 if all equal)."""
    a, t = _paired(control, treated)
    d = np.round(t - a, DIFFERENCE_DECIMALS)
    n = int(d.size)
    if n == 0:
        return PairedTest("wilcoxon", math.nan, math.nan, 0, math.nan)
    mean_diff = float(d.mean())
    if not np.any(d):
        return PairedTest("wilcoxon", 0.0, 1.0, n, mean_diff)
    res = _st.wilcoxon(d, zero_method=WILCOXON_ZERO_METHOD, alternative="two-sided")
    return PairedTest("wilcoxon", float(res.statistic), float(res.pvalue), n, mean_diff)


def paired_t(control: np.ndarray, treated: np.ndarray) -> PairedTest:
    """Paired t-test (scipy.stats.ttest_rel) of treated vs control; NaN below 2 pairs, p = 1 if all equal."""
    a, t = _paired(control, treated)
    n = int(a.size)
    if n < 2:
        return PairedTest("paired_t", math.nan, math.nan, n, float((t - a).mean()) if n else math.nan)
    d = t - a
    mean_diff = float(d.mean())
    if not np.any(d):
        return PairedTest("paired_t", 0.0, 1.0, n, mean_diff)
    res = _st.ttest_rel(t, a)
    return PairedTest("paired_t", float(res.statistic), float(res.pvalue), n, mean_diff)


def compare_to_control(control_scores: np.ndarray, treated_scores: np.ndarray, binary: bool) -> PairedTest:
    """The reported test, items as the unit: exact McNemar for single-run pass/fail, else Wilcoxon on item means."""
    ctrl, trt = _as_matrix(control_scores, "control_scores"), _as_matrix(treated_scores, "treated_scores")
    if ctrl.shape[1] != trt.shape[1]:
        raise ValueError(f"control and treated must score the same items: {ctrl.shape[1]} != {trt.shape[1]}")
    if binary and ctrl.shape[0] == 1 and trt.shape[0] == 1:
        return mcnemar_exact(ctrl[0], trt[0])
    return wilcoxon_paired(item_means(ctrl), item_means(trt))


def percent_of_control(value: float, control_value: float) -> float:
    """100 * value / control_value; NaN when the control is 0, NaN or infinite."""
    value, control_value = float(value), float(control_value)
    if not math.isfinite(control_value) or control_value == 0.0:
        return math.nan
    return 100.0 * value / control_value
