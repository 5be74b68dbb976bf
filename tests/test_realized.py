"""Realized-error statistics: the fast path over whole decodes against the masked path and a
float64 reference."""

from __future__ import annotations

import math
from dataclasses import asdict

import numpy as np
import pytest

from kvinject.engine.realized_error import RealizedStats, Workspace

from .cli_runs import kvinject


def reference(b: np.ndarray, a: np.ndarray) -> dict[str, float]:
    b64, a64 = b.astype(np.float64), a.astype(np.float64)
    finite = np.isfinite(a64)
    keep = finite & (b64 != 0)
    rel = (a64[keep] - b64[keep]) / b64[keep]
    return {
        "changed": int(np.count_nonzero((a != b) & ~(np.isnan(a) & np.isnan(b)))),  # a NaN that stays NaN did not change
        "nonfinite": int(np.count_nonzero(~finite)),
        "rel_n": int(keep.sum()),
        "rel_sum": rel.sum(),
        "rel_sumsq": (rel**2).sum(),
        "signal": (b64[finite] ** 2).sum(),
        "noise": ((a64[finite] - b64[finite]) ** 2).sum(),
        "sign_flips": int(np.count_nonzero(a64[keep] * b64[keep] < 0)),
    }


def check(stats: RealizedStats, expected: dict[str, float]) -> None:
    for key, value in expected.items():
        assert getattr(stats, key) == pytest.approx(value, rel=1e-5, abs=1e-9), key


@pytest.fixture
def values():
    rng = np.random.default_rng(3)
    b = rng.standard_normal(50_000).astype(np.float32)
    a = (b * (1 + 0.5 * rng.standard_normal(b.size))).astype(np.float32)
    a[:100] = b[:100]  # unchanged components
    return b, a


def test_fast_path_matches_the_reference(values):
    b, a = values
    stats, work = RealizedStats(), Workspace()
    stats.add(b[:20_000], a[:20_000], 3, work)
    stats.add(b[20_000:], a[20_000:], 2, work)  # the workspace is reused, smaller than before
    assert (stats.values, stats.sites) == (b.size, 5)
    assert stats.sign_flips > 0 and stats.nonfinite == 0
    check(stats, reference(b, a))


def test_zeros_and_non_finite_values_take_the_masked_path_with_the_same_meaning(values):
    b, a = (x.copy() for x in values)
    b[200] = 0  # no relative error for a zero
    a[300] = np.inf  # an exponent flipped to Inf
    a[301] = np.nan
    b[302] = a[302] = np.nan  # a NaN in the cache already, left alone
    stats = RealizedStats()
    stats.add(b, a)
    assert stats.nonfinite == 3 and stats.rel_n == b.size - 4
    assert stats.changed == np.count_nonzero(a != b) - 1
    check(stats, reference(b, a))


def test_both_paths_agree_on_finite_values(values):
    b, a = values
    fast, masked = RealizedStats(), RealizedStats()
    fast.add(b, a)
    masked._add_masked(b, a)
    masked.values, masked.sites = b.size, 1
    for key, value in asdict(masked).items():
        assert getattr(fast, key) == pytest.approx(value, rel=1e-9), key


def test_an_overflowing_relative_error_is_an_infinite_spread():
    """A flipped top exponent bit of a small fp32 value makes it about 1e35 times larger: the
    relative error overflows float32, and the spread reads inf, not inf - inf = NaN."""
    b = np.full(8, 1e-3, np.float32)
    a = b.copy()
    a[0] = (b[:1].view(np.uint32) ^ np.uint32(1 << 30)).view(np.float32)[0]
    stats = RealizedStats()
    stats.add(b, a)
    assert np.isfinite(a[0]) and stats.changed == 1
    assert stats.rel_err_mean == math.inf and stats.rel_err_std == math.inf


def test_values_that_all_became_nan_or_inf_read_as_unbounded_error_not_as_none():
    """normal:0,1e300 turns every value into NaN or Inf: the SNR had read +inf, as if nothing changed."""
    stats = RealizedStats()
    before = np.array([0.5, -1.0, 2.0], np.float32)
    stats.add(before, np.array([np.inf, np.nan, -np.inf], np.float32))
    assert stats.nonfinite == 3 and stats.snr_db == -math.inf
    untouched = RealizedStats()
    untouched.add(before, before.copy())
    assert untouched.snr_db == math.inf


def test_generate_says_when_its_completion_came_from_nan_logits(tiny_path):
    out = kvinject("generate", "Hi there", "--model", tiny_path, "--error", "normal:0,1e300", "-n", "3")
    assert out.returncode == 0, out.stderr
    assert "reached the cache as NaN or Inf" in out.stdout and "-inf / -inf" in out.stdout
