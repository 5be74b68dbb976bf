"""Rounding float32 values to a narrower floating-point format, compiled: the graph callback
applies ``float:`` in its own pass (kvinject/engine/callback/graph_callback.py), MX blocks included, and Python
rounds with the same functions where it must (device memory).

A format is its mantissa bits, its smallest normal exponent and its largest finite value
(ml_dtypes' ``finfo``): round to nearest, ties to even, subnormals kept, values beyond the
largest saturating to it (OCP's conversion mode for machine learning; infinities too), NaN
kept, zeros keeping their sign. tests/test_minifloat.py checks it bit for bit against
ml_dtypes' conversions (the converters of JAX) over every float16 value and random float32s.
Through numpy and ml_dtypes, ``float:e4m3`` made a 1-sequence decode 1.16x the clean time.

An MX block (OCP Microscaling v1.0, section 6.3) shares the scale 2^(floor(log2(max |x|)) -
emax), emax the exponent of the element format's largest normal value, stored as an E8M0
exponent (-127 to 127); each value is divided by it, rounded, and multiplied back. Both steps
are exact in float64 and rounded once to float32, as numpy's float32 arithmetic rounds them.

The graph callback's compiled pass inlines these functions, so its numba cache is stamped by
this file too (kvinject/engine/callback/numba_cache.py).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

SCALE_EXPONENTS = (-127, 127)  # what MX's E8M0 scale represents (its all-ones code is NaN)


@njit(inline="always")
def round_to(x, largest, nmant, minexp):
    """``x`` rounded to the format (float64 ``largest``, int ``nmant``, ``minexp``)."""
    a = abs(np.float64(x))
    if not a > 0.0:  # zero or NaN: as they are
        return x
    if a >= largest:
        r = largest
    else:
        _, e = math.frexp(a)  # a = m * 2^e, m in [0.5, 1): the leading bit is 2^(e - 1)
        quantum = math.ldexp(1.0, int(max(e - 1, minexp) - nmant))  # int(): numpy integers are not ints to Python (the CUDA simulator)
        r = min(round(a / quantum) * quantum, largest)  # exact in float64: a power-of-two scaling
    return np.float32(r) if x > 0 else np.float32(-r)


@njit(cache=True)
def round_array(x, largest, nmant, minexp):
    """Round the float32 array ``x`` in place."""
    flat = x.reshape(-1)
    for i in range(flat.size):
        flat[i] = round_to(flat[i], largest, nmant, minexp)


@njit(cache=True)
def round_blocks(x, largest, nmant, minexp):
    """Round the float32 array ``x`` of shape (blocks, block) in place, each row an MX block."""
    for i in range(x.shape[0]):
        scale = shared_scale(x[i], largest)
        for j in range(x.shape[1]):
            x[i, j] = round_scaled(x[i, j], scale, largest, nmant, minexp)


@njit(inline="always")
def shared_scale(block, largest):
    """The MX scale of ``block``, a float64 power of two; NaN for a block holding a NaN or an
    infinity, E8M0's NaN code, which makes the whole block NaN (as the MX reference code,
    microsoft/microxcaling, sets it)."""
    amax = 0.0
    for v in block:
        a = abs(np.float64(v))
        if a > amax or a != a:  # a NaN stays the maximum
            amax = a
    if not math.isfinite(amax):
        return math.nan
    e = math.frexp(amax)[1]  # amax = m * 2^e, m in [0.5, 1); 0 for 0
    emax = math.frexp(largest)[1] - 1
    return math.ldexp(1.0, min(max(e - 1 - emax, SCALE_EXPONENTS[0]), SCALE_EXPONENTS[1]))


@njit(inline="always")
def round_scaled(x, scale, largest, nmant, minexp):
    """``x`` divided by ``scale``, rounded to the format, and multiplied back, in float32 steps."""
    scaled = np.float32(np.float64(x) / scale)
    return np.float32(np.float64(round_to(scaled, largest, nmant, minexp)) * scale)
