"""Statistics: known values from hand computation or textbooks, not from the implementation."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats as st

from kvinject.analysis.report import study_table
from kvinject.analysis.stats import (
    PairedTest,
    RunSummary,
    across_runs,
    bootstrap_ci,
    compare_to_control,
    item_means,
    mcnemar_exact,
    paired_bootstrap,
    paired_t,
    percent_of_control,
    proportion_ci,
    wilcoxon_paired,
)
from kvinject.jsonutil import dumps

T_975_4 = 2.7764451051977987  # t_{0.975} with 4 degrees of freedom


# --- across runs ---------------------------------------------------------------------------


def test_across_runs_t_ci_by_hand() -> None:
    s = across_runs([1, 2, 3, 4, 5])
    assert (s.n, s.n_nan) == (5, 0)
    assert s.mean == pytest.approx(3.0)
    assert s.std == pytest.approx(math.sqrt(2.5))
    half = T_975_4 * math.sqrt(2.5) / math.sqrt(5)
    assert s.ci_low == pytest.approx(3 - half, rel=1e-12)
    assert s.ci_high == pytest.approx(3 + half, rel=1e-12)


def test_across_runs_other_confidence() -> None:
    s = across_runs([1, 2, 3, 4, 5], confidence=0.90)
    half = 2.1318467863266495 * math.sqrt(2.5) / math.sqrt(5)  # t_{0.95}, 4 df
    assert (s.ci_low, s.ci_high) == (pytest.approx(3 - half), pytest.approx(3 + half))
    with pytest.raises(ValueError):
        across_runs([1, 2], confidence=1.0)


def test_across_runs_single_run_has_undefined_ci() -> None:
    s = across_runs([0.42])
    assert (s.n, s.mean, s.std) == (1, 0.42, 0.0)
    assert math.isnan(s.ci_low) and math.isnan(s.ci_high)


def test_across_runs_drops_nan() -> None:
    s = across_runs([1, float("nan"), 2, 3, 4, float("nan"), 5])
    assert (s.n, s.n_nan) == (5, 2)
    assert s.mean == pytest.approx(3.0)
    assert s.ci_high == pytest.approx(3 + T_975_4 * math.sqrt(0.5))
    empty = across_runs([float("nan")])
    assert (empty.n, empty.n_nan) == (0, 1)
    assert math.isnan(empty.mean) and math.isnan(empty.ci_low)


def test_across_runs_identical_runs_zero_width() -> None:
    s = across_runs([0.5] * 4)
    assert (s.std, s.ci_low, s.ci_high) == (0.0, 0.5, 0.5)


def test_run_summary_to_dict_json() -> None:
    d = across_runs([7.0]).to_dict()
    assert d["n"] == 1 and d["mean"] == 7.0 and math.isnan(d["ci_low"])
    assert '"ci_low": null' in dumps(d)
    assert set(d) >= {"n", "n_nan", "mean", "std", "ci_low", "ci_high"}
    assert isinstance(across_runs([1, 2]), RunSummary)


# --- McNemar -------------------------------------------------------------------------------


def _pairs(b: int, c: int, both_pass: int = 0, both_fail: int = 0) -> tuple[np.ndarray, np.ndarray]:
    control = np.array([1] * b + [0] * c + [1] * both_pass + [0] * both_fail, dtype=bool)
    treated = np.array([0] * b + [1] * c + [1] * both_pass + [0] * both_fail, dtype=bool)
    return control, treated


def test_mcnemar_textbook() -> None:
    # b=10, c=2: p = 2 * P(X <= 2), X ~ Bin(12, 0.5) = 2 * (1 + 12 + 66) / 4096
    r = mcnemar_exact(*_pairs(10, 2, both_pass=30, both_fail=8))
    assert (r.test, r.b, r.c, r.n) == ("mcnemar_exact", 10, 2, 50)
    assert r.p_value == pytest.approx(0.03857421875, rel=1e-12)
    assert r.mean_diff == pytest.approx((2 - 10) / 50)
    # symmetric: swapping the arms gives the same p, the opposite difference
    s = mcnemar_exact(*_pairs(10, 2, both_pass=30, both_fail=8)[::-1])
    assert (s.b, s.c, s.p_value, s.mean_diff) == (2, 10, r.p_value, -r.mean_diff)


def test_mcnemar_no_discordant_pairs() -> None:
    r = mcnemar_exact(*_pairs(0, 0, both_pass=5, both_fail=5))
    assert (r.b, r.c, r.p_value, r.mean_diff) == (0, 0, 1.0, 0.0)


def test_mcnemar_accepts_01_and_drops_nan_rejects_non_binary() -> None:
    r = mcnemar_exact([1, 1, 0, float("nan")], [0, 1, 0, 1])
    assert (r.n, r.b, r.c) == (3, 1, 0)
    assert r.p_value == pytest.approx(1.0)  # 2 * P(X <= 0), X ~ Bin(1, 0.5), capped at 1
    with pytest.raises(ValueError, match="needs pass/fail"):
        mcnemar_exact([0.5, 1], [1, 1])
    with pytest.raises(ValueError, match="the same number of items: 3 != 2"):
        mcnemar_exact([0, 1, 1], [1, 1])


# --- Wilcoxon ------------------------------------------------------------------------------


def test_wilcoxon_all_positive_exact() -> None:
    # 6 positive differences without ties: exact two-sided p = 2 / 2**6
    r = wilcoxon_paired(np.zeros(6), [1, 2, 3, 4, 5, 6])
    assert (r.test, r.n, r.statistic) == ("wilcoxon", 6, 0.0)
    assert r.p_value == pytest.approx(2 / 64)
    assert r.mean_diff == pytest.approx(3.5)


def test_wilcoxon_zero_difference_kept_in_n() -> None:
    # a zero difference (Pratt) changes no sign: the exact p is still 2 / 2**6
    r = wilcoxon_paired(np.zeros(7), [0, 1, 2, 3, 4, 5, 6])
    assert r.n == 7
    assert r.p_value == pytest.approx(2 / 64)


def test_wilcoxon_identical_is_one() -> None:
    x = [0.1, 0.5, 0.9, 0.3]
    r = wilcoxon_paired(x, x)
    assert (r.p_value, r.statistic, r.mean_diff, r.n) == (1.0, 0.0, 0.0, 4)


def test_wilcoxon_clear_shift_small_p() -> None:
    rng = np.random.default_rng(0)
    control = rng.normal(size=80)
    treated = control - 1.0 + 0.1 * rng.normal(size=80)
    r = wilcoxon_paired(control, treated)
    assert r.p_value < 1e-10
    assert r.mean_diff == pytest.approx(-1.0, abs=0.05)


def test_wilcoxon_matches_scipy_and_drops_nan() -> None:
    control = np.array([1.83, 0.50, 1.62, 2.48, 1.68, 1.88, 1.55, 3.06, 1.30, np.nan])
    treated = np.array([0.878, 0.647, 0.598, 2.05, 1.06, 1.29, 1.06, 3.14, 1.29, 5.0])
    r = wilcoxon_paired(control, treated)
    ref = st.wilcoxon(treated[:9] - control[:9], zero_method="pratt")
    assert r.n == 9
    assert r.statistic == pytest.approx(ref.statistic)
    assert r.p_value == pytest.approx(ref.pvalue)
    # Hollander & Wolfe's depression data: the smaller rank sum is 5, exact two-sided p = 0.039
    assert r.statistic == 5.0
    assert r.p_value == pytest.approx(0.0390625)


def test_wilcoxon_ties_of_pass_rates_stay_ties() -> None:
    """A control run once against 5 runs: 40 items fall from 1 to 0.8, 40 rise from 0 to 0.2,
    100 are unchanged. The differences are symmetric about 0, so the two-sided p is 1; in
    floating point 0.8 - 1 is not -(0.2 - 0), which had split the tied ranks (p = 0.21)."""
    control = np.concatenate([np.ones(40), np.zeros(40), np.full(100, 0.5)])[np.newaxis, :]
    treated = np.tile(np.concatenate([np.full(40, 0.8), np.full(40, 0.2), np.full(100, 0.5)]), (5, 1))
    treated[:, :40] = np.array([1, 1, 1, 1, 0])[:, np.newaxis]  # 4 of 5 runs pass: 0.8
    treated[:, 40:80] = np.array([0, 0, 0, 0, 1])[:, np.newaxis]  # 1 of 5: 0.2
    r = compare_to_control(control, treated, binary=True)
    assert r.test == "wilcoxon" and r.mean_diff == pytest.approx(0.0, abs=1e-15)
    assert r.p_value == pytest.approx(1.0)


# --- proportions ---------------------------------------------------------------------------


@pytest.mark.parametrize("k,n", [(0, 100), (100, 100), (9, 10), (37, 120)])
def test_proportion_ci_is_wilson_s_score_interval(k, n) -> None:
    """The score interval written out: (p + z²/2n ± z·sqrt(p(1-p)/n + z²/4n²)) / (1 + z²/n)."""
    z = 1.959963984540054
    p = k / n
    center = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    lo, hi = proportion_ci(np.r_[np.ones(k), np.zeros(n - k), np.nan])
    assert lo == pytest.approx(max(0.0, center - half), abs=1e-12) and hi == pytest.approx(min(1.0, center + half), abs=1e-12)
    if k == 0:
        assert hi == pytest.approx(0.0370, abs=1e-4), "no failures seen is not a rate of exactly 0"
    assert all(math.isnan(v) for v in proportion_ci([np.nan]))


# --- paired bootstrap of the difference -------------------------------------------------------


def test_paired_bootstrap_of_a_few_flips_matches_normal_theory() -> None:
    """200 pass/fail items, 120 passing under the control, 8 of them failing under the
    configuration: each side's own interval overlaps the other's, the paired one of the
    difference excludes 0. Its bounds are those of the mean of 200 differences in {-1, 0}
    (mean -0.04, sd sqrt(0.04 * 0.96 / 200)) to within the bootstrap's 1/200 grid."""
    control = np.r_[np.ones(120), np.zeros(80)]
    treated = control.copy()
    treated[:8] = 0
    (d_lo, d_hi), (p_lo, p_hi) = paired_bootstrap(control, treated)
    se = math.sqrt(0.04 * 0.96 / 200)
    assert d_lo == pytest.approx(-0.04 - 1.96 * se, abs=0.006) and d_hi == pytest.approx(-0.04 + 1.96 * se, abs=0.006)
    assert d_hi < 0 and p_hi < 100
    assert p_lo <= 100 * 112 / 120 <= p_hi
    c_lo, c_hi = bootstrap_ci(control)
    t_lo, t_hi = bootstrap_ci(treated)
    assert t_hi > c_lo and c_hi > t_lo, "each side's own interval overlaps the other's"


def test_paired_bootstrap_applies_the_transform_to_each_side() -> None:
    """Perplexity: each item's NLL higher by 0.1 nats makes exp(mean NLL) e^0.1 times the
    control's in every resample, so the ratio's interval is that single value."""
    rng = np.random.default_rng(0)
    control = rng.uniform(2, 3, size=30)
    diff, percent = paired_bootstrap(control, control + 0.1, transform=np.exp)
    assert percent == pytest.approx((100 * math.exp(0.1),) * 2, rel=1e-9)
    assert diff[0] < diff[1], "exp(mean) - exp(mean) varies with the resampled items"


def test_a_few_resamples_without_control_passes_leave_the_ratio_defined() -> None:
    """5 of 20 items pass under the control, 4 under the configuration: about 0.3% of the
    resamples hold none of the 5 (0.75^20), whose ratio is +inf or undefined; the interval
    stands, around 80%, rather than turning undefined."""
    control, treated = np.r_[np.ones(5), np.zeros(15)], np.r_[np.ones(4), np.zeros(16)]
    _, (lo, hi) = paired_bootstrap(control, treated)
    assert math.isfinite(lo) and math.isfinite(hi) and lo <= 80 <= hi


def test_paired_bootstrap_edge_cases() -> None:
    nan_pair = paired_bootstrap([1.0], [0.0])
    assert all(math.isnan(v) for ci in nan_pair for v in ci), "fewer than 2 pairs"
    diff, percent = paired_bootstrap(np.zeros(10), np.r_[np.ones(3), np.zeros(7)])
    assert all(math.isnan(v) for v in percent), "a control of 0 has no ratio"
    assert diff[0] <= 0.3 <= diff[1]
    # Pairs with a missing side are dropped; runs of an item are averaged first.
    same = paired_bootstrap(np.array([[1, 0, 1, 0, np.nan]]), np.array([[1, 1, 1, 0, 1], [1, 0, 1, 0, 1]]))
    assert same == paired_bootstrap([1, 0, 1, 0], [1, 0.5, 1, 0])


# --- paired t ------------------------------------------------------------------------------


def test_paired_t_by_hand() -> None:
    # d = [1, 2, 2, 1]: mean 1.5, sd sqrt(1/3), t = 1.5 / (sqrt(1/3) / 2) = 3 sqrt(3), 3 df
    r = paired_t([1, 2, 3, 4, np.nan], [2, 4, 5, 5, 9])
    assert (r.test, r.n) == ("paired_t", 4)
    assert r.statistic == pytest.approx(3 * math.sqrt(3))
    assert r.p_value == pytest.approx(2 * st.t.sf(3 * math.sqrt(3), 3))
    assert r.p_value == pytest.approx(0.013846832988859, rel=1e-9)
    assert r.mean_diff == pytest.approx(1.5)
    assert paired_t([1, 2], [1, 2]).p_value == 1.0
    assert math.isnan(paired_t([1], [2]).p_value)


# --- bootstrap -----------------------------------------------------------------------------


def test_bootstrap_deterministic_and_contains_estimate() -> None:
    rng = np.random.default_rng(1)
    scores = rng.integers(0, 2, size=(5, 60)).astype(float)
    a = bootstrap_ci(scores, seed=3)
    assert a == bootstrap_ci(scores, seed=3)
    assert a != bootstrap_ci(scores, seed=4)
    point = scores.mean()
    assert a[0] < point < a[1]


def test_bootstrap_width_matches_normal_theory_and_narrows() -> None:
    rng = np.random.default_rng(2)
    small = rng.integers(0, 2, size=(1, 20)).astype(float)
    large = rng.integers(0, 2, size=(1, 2000)).astype(float)
    w_small = np.subtract(*bootstrap_ci(small)[::-1])
    w_large = np.subtract(*bootstrap_ci(large, n_resamples=1000)[::-1])
    # normal theory for Bernoulli(0.5): width ~ 2 * 1.96 * 0.5 / sqrt(items)
    assert w_large == pytest.approx(2 * 1.96 * 0.5 / math.sqrt(2000), rel=0.15)
    assert w_small > 5 * w_large


def test_bootstrap_keeps_runs_of_an_item_together() -> None:
    rng = np.random.default_rng(3)
    one = rng.integers(0, 2, size=(1, 50)).astype(float)
    five = np.repeat(one, 5, axis=0)  # every item scores the same in all 5 runs
    assert bootstrap_ci(five, seed=7) == bootstrap_ci(one, seed=7)
    # runs that disagree within items but agree on every item mean: no item-level uncertainty
    # (resampling cells instead of items would give a CI of width ~0.2 here)
    alternating = np.array([[0, 1] * 25, [1, 0] * 25], dtype=float)
    assert bootstrap_ci(alternating) == (0.5, 0.5)


def test_weighted_bootstrap_is_about_the_pooled_rate() -> None:
    """100 prompts of one instruction, all followed, and 100 of four, half followed: the pooled
    rate is 300 of 500 = 0.6, the mean of the per-prompt rates 0.75. The weighted interval is
    the pooled rate's (its spread about sqrt(0.6 * 0.4 / 500) and more, from the unequal
    prompts), far from 0.75; equal weights give the plain mean's interval."""
    x = np.r_[np.ones(100), np.full(100, 0.5)]
    w = np.r_[np.ones(100), np.full(100, 4.0)]
    lo, hi = bootstrap_ci(x, weights=w)
    assert lo < 0.6 < hi and hi < 0.7
    assert bootstrap_ci(x, weights=np.ones(200)) == pytest.approx(bootstrap_ci(x), abs=0.01)
    diff, percent = paired_bootstrap(x, x, weights=w)
    assert diff == (0.0, 0.0) and percent == pytest.approx((100.0, 100.0))


def test_bootstrap_edge_cases() -> None:
    assert all(math.isnan(v) for v in bootstrap_ci(np.ones((5, 1))))
    # an item with no valid run is dropped, leaving one item
    assert all(math.isnan(v) for v in bootstrap_ci(np.array([[1.0, np.nan], [0.0, np.nan]])))
    lo, hi = bootstrap_ci(np.array([[1.0, 0.0, np.nan, 1.0, 0.0]] * 2), statistic=np.median)
    assert lo <= 0.5 <= hi


# --- compare to control --------------------------------------------------------------------


def test_compare_single_run_binary_uses_mcnemar() -> None:
    control, treated = _pairs(10, 2, both_pass=30, both_fail=8)
    r = compare_to_control(control[None, :].astype(float), treated[None, :].astype(float), binary=True)
    assert (r.test, r.b, r.c) == ("mcnemar_exact", 10, 2)
    assert r.p_value == pytest.approx(0.03857421875)


def test_compare_multi_run_binary_uses_wilcoxon_on_item_means() -> None:
    control = np.array([[1.0] * 20 + [0.0, 1.0] * 10])  # deterministic control: one run
    treated = np.repeat(control, 5, axis=0)
    treated[:, :15] = 0.0  # fifteen items break in every run
    treated[0, 30] = np.nan  # a run without a score for one item
    r = compare_to_control(control, treated, binary=True)
    assert r.test == "wilcoxon" and r.b is None and r.c is None
    assert r.n == 40
    d = item_means(treated) - control[0]
    assert r.mean_diff == pytest.approx(d.mean())
    assert r.mean_diff == pytest.approx(-15 / 40)
    assert r.p_value < 1e-3


def test_compare_continuous_and_run_counts() -> None:
    rng = np.random.default_rng(5)
    control = rng.normal(size=(1, 30))
    treated = control + rng.normal(-0.5, 0.1, size=(3, 30))
    r = compare_to_control(control, treated, binary=False)
    assert r.test == "wilcoxon"
    assert r.mean_diff == pytest.approx(-0.5, abs=0.05)
    assert r.p_value == pytest.approx(2 / 2**30)  # every item lower: exact two-sided minimum
    # binary single-run per side but flagged continuous: still Wilcoxon
    assert compare_to_control([[1, 0, 1]], [[0, 0, 1]], binary=False).test == "wilcoxon"
    with pytest.raises(ValueError, match="must score the same items: 3 != 4"):
        compare_to_control(np.zeros((2, 3)), np.zeros((2, 4)), binary=False)


def test_paired_test_to_dict() -> None:
    d = mcnemar_exact([1, 0], [1, 0]).to_dict()
    assert d == {"test": "mcnemar_exact", "statistic": 0.0, "p_value": 1.0, "n": 2, "mean_diff": 0.0, "b": 0, "c": 0}
    w = wilcoxon_paired([1, 2, 3], [3, 2, 1]).to_dict()
    assert w["b"] is None and w["test"] == "wilcoxon"
    assert isinstance(mcnemar_exact([1], [1]), PairedTest)


# --- percent of control --------------------------------------------------------------------


def test_percent_of_control() -> None:
    assert percent_of_control(0.3, 0.6) == pytest.approx(50.0)
    assert percent_of_control(12.0, 10.0) == pytest.approx(120.0)
    assert math.isnan(percent_of_control(1.0, 0.0))
    assert math.isnan(percent_of_control(1.0, float("nan")))
    assert math.isnan(percent_of_control(float("nan"), 1.0))


def test_report_q_values_are_benjamini_hochberg_over_a_table() -> None:
    """A bench's configurations against one control: q_(i) = min over j >= i of p_(j) m / j,
    written out for p = 0.01, 0.04, 0.02 (m = 3): 0.03, 0.04, 0.03; none for the control."""
    rows = [
        {
            "model": "m",
            "bench": "nexttoken",
            "metric": "accuracy",
            "label": label,
            "configuration": label,
            "n": 1,
            "mean": 0.5,
            "std": 0.0,
            "ci_low": math.nan,
            "ci_high": math.nan,
            "items_ci": None,
            "percent_of_control": 100.0,
            "percent_ci": None,
            "test": None if p is None else {"p_value": p},
            "nonfinite_items": 0,
        }
        for label, p in [("none", None), ("a", 0.01), ("b", 0.04), ("c", 0.02)]
    ]
    table = study_table(pd.DataFrame(rows))
    assert list(table["q"]) == [None, pytest.approx(0.03), pytest.approx(0.04), pytest.approx(0.03)]
