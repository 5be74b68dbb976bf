"""The counter-based generator of the multiplicative models (kvinject/engine/variates.py): its ziggurat
against the definition of its layers, its laws against their distributions, its streams
against how they are sliced, and the factors that reach the cache against the spec."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from kvinject.engine.callback.counter_rng import _F, _X
from kvinject.engine.laws import NORMAL, SIGN, UNIFORM
from kvinject.engine.variates import GENERATOR, Variates, factors
from kvinject.error_models.configuration import Configuration

from .cache_state import read_cache
from .test_hook import run

KEYS = [int(k) for k in np.random.default_rng(2026).integers(0, 2**64, 8, dtype=np.uint64)]


def test_every_ziggurat_layer_has_the_same_area():
    """Marsaglia and Tsang's construction: 256 layers under f(x) = exp(-x^2/2), each of area v;
    the base one is the rectangle up to r plus the whole tail beyond it."""
    f = lambda x: np.exp(-0.5 * x * x)  # noqa: E731
    r = _X[1]
    v = r * f(r) + np.sqrt(2 * np.pi) * stats.norm.sf(r)
    assert _X[0] * f(r) == pytest.approx(v, rel=1e-12)
    widths, heights = _X[1:256], f(_X[2:257]) - f(_X[1:256])
    assert widths * heights == pytest.approx(np.full(255, v), rel=1e-9)
    assert _X[256] == 0 and np.all(np.diff(_X) < 0) and np.array_equal(_F, f(_X))


def test_normals_follow_the_standard_normal_to_the_tails():
    z = np.concatenate([factors((NORMAL, 0.0, 1.0), key, 0, 2_500_000) for key in KEYS]).astype(np.float64)
    assert stats.kstest(z, "norm").pvalue > 1e-3
    n = z.size
    assert abs(z.mean()) < 5 / np.sqrt(n) and abs(z.var() - 1) < 5 * np.sqrt(2 / n)
    assert abs(stats.skew(z)) < 5 * np.sqrt(6 / n) and abs(stats.kurtosis(z)) < 5 * np.sqrt(24 / n)
    # The tail beyond the base layer and the wedges take the rare paths: bins there too.
    edges = np.array([-np.inf, -4, -_X[1], -3, -2, -1, 0, 1, 2, 3, _X[1], 4, np.inf])
    counts = np.histogram(z, edges)[0]
    assert stats.chisquare(counts, np.diff(stats.norm.cdf(edges)) * n).pvalue > 1e-3


def test_uniforms_lie_on_float32s_grid_and_are_uniform():
    u = factors((UNIFORM, 0.0, 1.0), KEYS[0], 0, 2_000_000)
    assert u.min() >= 0 and u.max() < 1
    assert np.array_equal(u * 2.0**24, np.floor(u * 2.0**24)), "24 random bits, as float32 holds"
    assert stats.kstest(u.astype(np.float64), "uniform").pvalue > 1e-3


def test_sign_flips_with_its_probability():
    f = factors((SIGN, 0.3, 0.0), KEYS[1], 0, 1_000_000)
    assert set(np.unique(f).tolist()) == {-1.0, 1.0}
    assert stats.binomtest(int((f < 0).sum()), f.size, 0.3).pvalue > 1e-3


@pytest.mark.parametrize("law", [(NORMAL, 1.0, 0.25), (UNIFORM, 0.5, 1.0), (SIGN, 0.5, 0.0)])
def test_a_stream_is_the_same_however_it_is_sliced(law):
    whole = Variates(law, KEYS[2]).take(100_000)
    parts = Variates(law, KEYS[2])
    pieces = [parts.take(n) for n in (5, 40_000, 1)]
    block = parts.block(59_994)
    assert np.array_equal(whole, np.concatenate([*pieces, block[:]]))
    assert np.array_equal(block[10:20], whole[40_016:40_026])
    assert not np.array_equal(whole, Variates(law, KEYS[3]).take(100_000)), "another key, another stream"


@pytest.mark.parametrize(
    "spec,factor",
    [("normal:0.1,0.25", stats.norm(1.1, 0.25)), ("uniform:-0.5,0.3", stats.uniform(0.5, 0.8)), ("signflip:0.2", 0.2)],
)
def test_what_reaches_the_cache_has_the_specs_distribution(tiny, spec, factor):
    """Layer 0's K and V do not depend on earlier injection: in an f32 cache, the injected
    run's values over the control's are the factors the spec describes (the prompt's: the
    generated tokens of the two runs differ)."""
    _, clean = run(tiny, "none", steps=0)
    _, noisy = run(tiny, spec, steps=0)
    a, b = read_cache(clean), read_cache(noisy)
    for component in "kv":  # factor: the law of 1 + e, or the probability of a sign flip
        x, y = a[component, 0].ravel(), b[component, 0].ravel()
        ratio = (y[x != 0] / x[x != 0]).astype(np.float64)
        if isinstance(factor, float):
            assert np.allclose(np.abs(ratio), 1, atol=1e-6)
            assert stats.binomtest(int((ratio < 0).sum()), ratio.size, factor).pvalue > 1e-3
        else:
            assert stats.kstest(ratio, factor.cdf).pvalue > 1e-3, component
    clean.close()
    noisy.close()


def test_results_and_store_keys_name_the_generator_of_multiplicative_models_only():
    assert Configuration.parse("normal:0,0.25").to_dict()["noise"] == GENERATOR
    assert all("noise" not in Configuration.parse(spec).to_dict() for spec in ("none", "quant:4", "bitflip:0.01")), (
        "store keys of models that do not use it stay as they were"
    )
