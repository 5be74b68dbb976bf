"""What a compiled pass computes for an error model, by kind: the factor laws of
kvinject/engine/variates.py, the rounding of kvinject/engine/callback/rounding.py, and the kinds that only the
device kernels (kvinject/engine/gpu/device_kernels.py) compute, which the host computes in numpy.

A law is a tuple ``(kind, ...)`` of at most SLOTS numbers, exact in float64.
"""

from __future__ import annotations

# Laws of a multiplicative factor, (kind, a, b), whose factors kvinject/engine/variates.py's streams give:
# a + b*U with U uniform on [0, 1); a + b*Z with Z standard normal; -1 with probability a, else 1.
UNIFORM, NORMAL, SIGN = 0, 1, 2
ROUND = 3  # (ROUND, largest, mantissa bits, smallest normal exponent, MX block): a minifloat (kvinject/engine/callback/rounding.py)
QUANT = 4  # (QUANT, qmax, group): absmax round-to-nearest integers, one float32 scale a group (error_models/quant.py)
MASK = 5  # (MASK, mask): the float32's bits ANDed with mask (error_models/mantissa.py)
FLIP = 6  # (FLIP, format): the stored format's bits XORed with a mask a value, drawn on the host (error_models/bitflip.py)
F32, F16, BF16 = 0, 1, 2  # FLIP's formats
SLOTS = 5

__all__ = ["UNIFORM", "NORMAL", "SIGN", "ROUND", "QUANT", "MASK", "FLIP", "F32", "F16", "BF16", "SLOTS"]
