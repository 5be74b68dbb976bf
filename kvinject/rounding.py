"""Rounding float32 values to a narrower floating-point format, compiled: the graph callback
applies ``float:`` in its own pass (kvinject/graph_callback.py), and Python rounds the same way
where it must (MX blocks, device memory).

A format is its mantissa bits, its smallest normal exponent and its largest finite value
(ml_dtypes' ``finfo``): round to nearest, ties to even, subnormals kept, values beyond the
largest saturating to it (OCP's conversion mode for machine learning; infinities too), NaN
kept, zeros keeping their sign. tests/test_minifloat.py checks it bit for bit against
ml_dtypes' conversions (the converters of JAX) over every float16 value and random float32s.
Through numpy and ml_dtypes, ``float:e4m3`` made a 1-sequence decode 1.16x the clean time.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

ROUND = 3  # the law kind of a rounding, beside kvinject/variates.py's factor laws


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
        quantum = math.ldexp(1.0, max(e - 1, minexp) - nmant)
        r = min(np.rint(a / quantum) * quantum, largest)  # exact in float64: a power-of-two scaling
    return np.float32(r) if x > 0 else np.float32(-r)


@njit(cache=True)
def round_array(x, largest, nmant, minexp):
    """Round the float32 array ``x`` in place."""
    flat = x.reshape(-1)
    for i in range(flat.size):
        flat[i] = round_to(flat[i], largest, nmant, minexp)
