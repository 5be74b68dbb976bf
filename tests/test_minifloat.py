"""`float:FORMAT[,block=N]` against a literal reading of the OCP FP8 and MX specifications: every
code of the format is decoded from its bit fields, and a value rounds to the nearest code
(ties to the even code), saturating at the largest finite one."""

import functools
import math

import ml_dtypes
import numpy as np
import pytest

from kvinject.benchmarks import make_bench
from kvinject.engine.context import Context
from kvinject.engine.options import CacheOptions
from kvinject.engine.target import Target
from kvinject.error_models import parse_error
from kvinject.error_models.configuration import Configuration
from kvinject.error_models.minifloat import FORMATS
from kvinject.exceptions import SpecError
from kvinject.experiments.runner import run

# name -> (exponent bits, mantissa bits, which codes are not finite numbers)
SPECS = {
    "e4m3": (4, 3, lambda e, m: e == 15 and m == 7),  # OCP FP8: only S.1111.111 is NaN, no infinity
    "e5m2": (5, 2, lambda e, m: e == 31),  # OCP FP8: IEEE-like, exponent 11111 is Inf/NaN
    "e3m2": (3, 2, lambda e, m: False),  # OCP MX FP6: every code is a number
    "e2m3": (2, 3, lambda e, m: False),
    "e2m1": (2, 1, lambda e, m: False),  # OCP MX FP4
    "e5m10": (5, 10, lambda e, m: e == 31),  # IEEE binary16
    "e8m7": (8, 7, lambda e, m: e == 255),  # bfloat16
}


@functools.cache
def codes(fmt: str) -> np.ndarray:
    """The non-negative finite values of the format, in code order (increasing)."""
    e_bits, m_bits, special = SPECS[fmt]
    bias = 2 ** (e_bits - 1) - 1
    values = []
    for e in range(2**e_bits):
        for m in range(2**m_bits):
            if special(e, m):
                continue
            if e == 0:
                values.append(m / 2**m_bits * 2.0 ** (1 - bias))  # subnormal
            else:
                values.append((1 + m / 2**m_bits) * 2.0 ** (e - bias))
    return np.array(values)


def reference(x: float, fmt: str) -> float:
    table = codes(fmt)
    a = abs(x)
    if a >= table[-1]:
        r = table[-1]  # saturation
    else:
        hi = int(np.searchsorted(table, a, side="left"))
        if table[hi] == a:
            r = table[hi]
        else:
            lo = hi - 1
            d_lo, d_hi = a - table[lo], table[hi] - a
            r = table[lo] if d_lo < d_hi or (d_lo == d_hi and lo % 2 == 0) else table[hi]  # ties: even code
    return math.copysign(r, x)


def mx_reference(block: np.ndarray, fmt: str) -> np.ndarray:
    """OCP MX v1.0 section 6.3: X = 2^(floor(log2(max|V|)) - emax_elem), P_i = quantize(V_i / X)."""
    amax = float(np.abs(block).max())
    if amax == 0:
        return block.copy()
    emax_elem = math.floor(math.log2(codes(fmt)[-1]))
    scale = 2.0 ** (math.floor(math.log2(amax)) - emax_elem)
    return np.array([reference(v / scale, fmt) * scale for v in block.tolist()], np.float32)


def rounded(spec: str, x: np.ndarray) -> np.ndarray:
    y = x.copy()
    parse_error(spec).apply(y, None)
    return y


@pytest.fixture
def x() -> np.ndarray:
    rng = np.random.default_rng(3)
    # Magnitudes across the whole range of the formats: subnormals, normals, beyond the largest value.
    return (rng.standard_normal((16, 64)) * np.exp2(rng.integers(-18, 18, (16, 64)))).astype(np.float32)


@pytest.mark.parametrize("fmt", sorted(SPECS))
def test_every_format_rounds_as_its_specification_says(fmt: str, x: np.ndarray) -> None:
    table = codes(fmt)
    # Add exact midpoints between neighbouring codes, where ties-to-even decides.
    mids = (table[1:40] + table[: len(table[1:40])]) / 2
    beyond = min(2 * table[-1], float(np.finfo(np.float32).max))
    values = np.concatenate([x.ravel(), mids, -mids, [0.0, -0.0, table[-1], beyond]]).astype(np.float32)
    got = rounded(f"float:{fmt}", values.reshape(1, -1)).ravel()
    want = np.array([reference(float(v), fmt) for v in values], np.float32)
    assert np.array_equal(got, want), values[got != want][:5]


@pytest.mark.parametrize("fmt,largest", [("e4m3", 448), ("e5m2", 57344), ("e3m2", 28), ("e2m3", 7.5), ("e2m1", 6)])
def test_largest_values_and_saturation_are_the_ocp_ones(fmt: str, largest: float) -> None:
    y = rounded(f"float:{fmt}", np.array([[1e30, -1e30, np.inf, np.nan]], np.float32))
    assert y[0, :3].tolist() == [largest, -largest, largest]
    assert np.isnan(y[0, 3]), "NaN stays NaN, also in formats without NaN"


@pytest.mark.parametrize("fmt", ["e4m3", "e2m1"])
def test_mx_block_scale_follows_the_mx_specification(fmt: str, x: np.ndarray) -> None:
    x = x / np.abs(x).max(axis=1, keepdims=True)  # keep the shared scale within E8M0's range
    x[0, :32] = 0  # an all-zero block stays zero
    got = rounded(f"float:{fmt},block=32", x)
    want = np.stack([np.concatenate([mx_reference(row[i : i + 32], fmt) for i in range(0, 64, 32)]) for row in x])
    assert np.array_equal(got, want)


def test_mx_block_must_divide_the_row(tiny) -> None:
    with pytest.raises(SpecError, match="does not divide"):
        rounded("float:e4m3,block=48", np.ones((2, 64), np.float32))
    with pytest.raises(SpecError, match="'float:e4m3,block=48' computes groups of 48 components, which do not divide the K row of 128"):
        Context(tiny, CacheOptions(), parse_error("float:e4m3,block=48"))
    bench = make_bench("perplexity", {"ctx": 64, "chunks": 1})
    with pytest.raises(SpecError, match="'quant:4,group=48' computes groups of 48"):  # before the control runs
        list(run(tiny, [bench], [Configuration(), Configuration.parse("quant:4,group=48", Target.parse("v"))], runs=1))


def test_a_block_holding_a_nan_or_an_infinity_is_nan() -> None:
    """E8M0's NaN scale, as the MX reference code (microxcaling) gives a block whose maximum is
    not finite; the other blocks of the row as usual."""
    x = np.ones((1, 96), np.float32)
    x[0, 3], x[0, 40] = np.inf, np.nan
    got = rounded("float:e4m3,block=32", x)
    assert np.isnan(got[0, :64]).all() and (got[0, 64:] == 1).all()


def test_unknown_format_names_the_choices() -> None:
    with pytest.raises(SpecError, match="e4m3, e5m2"):
        parse_error("float:e4m4")


@pytest.mark.parametrize("spec,bits", [("float:e4m3", 8), ("float:e2m1,block=32", 4.25), ("float:e3m2,block=16", 6.5), ("float:e8m7", 16)])
def test_bits_per_element_count_the_shared_scale(spec: str, bits: float) -> None:
    assert parse_error(spec).bits_per_element(16, "v") == bits


@pytest.mark.parametrize("fmt", sorted(SPECS))
def test_rounding_is_ml_dtypes_conversion_bit_for_bit(fmt: str) -> None:
    """kvinject/engine/callback/rounding.py against ml_dtypes' conversion after saturation (what `float:` did
    before it was compiled, so results stored then stand): every float16 value, random float32
    bit patterns, infinities and NaN; zeros' signs included."""
    dtype = FORMATS[fmt]
    rng = np.random.default_rng(0)
    every_f16 = np.arange(2**16, dtype=np.uint16).view(np.float16).astype(np.float32)
    random_f32 = rng.integers(0, 2**32, 100_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    x = np.concatenate([every_f16, random_f32, np.array([np.inf, -np.inf, 0.0, -0.0], np.float32)])
    largest = np.float32(ml_dtypes.finfo(dtype).max)
    with np.errstate(invalid="ignore"):
        want = np.maximum(np.minimum(x, largest), -largest).astype(dtype).astype(np.float32)
    want[np.isnan(x)] = np.nan  # formats without NaN make it 0
    got = rounded(f"float:{fmt}", x.reshape(1, -1)).ravel()
    same = (got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want))
    assert same.all(), x[~same][:5]
