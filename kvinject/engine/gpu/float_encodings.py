"""A float32's bits and the fp16 and bf16 encodings of them, in integer arithmetic, for compiled
code that has no array to view (a GPU kernel's scalars: kvinject/engine/gpu/device_kernels.py).

They give numpy's and ggml's results bit for bit: fp16 rounds to nearest even as numpy's
``astype(np.float16)`` does (subnormals, overflow to infinity, a NaN's top payload bits kept and
kept a NaN), bf16 as ggml_compute_fp32_to_bf16 (kvinject/error_models/bitflip.py's encoding);
tests/test_device.py checks the decoding of every fp16 and the encodings of two million random
float32 patterns and the neighbours of fp16's range edges against numpy's and ggml's.
"""

from __future__ import annotations

import numpy as np
from numba import njit, types
from numba.extending import intrinsic

_SIGN, _ABS, _INF, _MANT = np.uint32(0x80000000), np.uint32(0x7FFFFFFF), np.uint32(0x7F800000), np.uint32(0x7FFFFF)


def _bitcast(source: types.Type, target: types.Type):
    @intrinsic
    def cast(typingctx, x):
        def codegen(context, builder, signature, args):
            return builder.bitcast(args[0], context.get_value_type(target))

        return target(source), codegen

    return cast


_as_bits = _bitcast(types.float32, types.uint32)
_as_float = _bitcast(types.uint32, types.float32)


@njit(inline="always")
def f32_bits(x):
    """The bits of the float32 ``x``."""
    return _as_bits(np.float32(x))


@njit(inline="always")
def f32_from(u):
    """The float32 of the bits ``u``."""
    return _as_float(np.uint32(u))


@njit(inline="always")
def to_f16(u):
    """The fp16 bits of the float32 bits ``u``, rounded to nearest even."""
    sign = (u >> np.uint32(16)) & np.uint32(0x8000)
    a = u & _ABS
    if a > _INF:  # NaN: its top payload bits, and a NaN still
        m = (a & _MANT) >> np.uint32(13)
        return sign | np.uint32(0x7C00) | (m if m != 0 else np.uint32(1))
    if a >= np.uint32(0x47800000):  # 65536 and beyond: infinity (smaller overflows round up to it below)
        return sign | np.uint32(0x7C00)
    if a < np.uint32(0x38800000):  # below fp16's smallest normal 2^-14: a multiple of 2^-24
        if a < np.uint32(0x33000000):  # below half of 2^-24: zero
            return sign
        e = a >> np.uint32(23)
        m = (a & _MANT) | np.uint32(0x800000)
        shift = np.uint32(126) - e  # m * 2^(e - 150) in units of 2^-24
        h = m >> shift
        rest = m & ((np.uint32(1) << shift) - np.uint32(1))
        half = np.uint32(1) << (shift - np.uint32(1))
        if rest > half or (rest == half and (h & np.uint32(1)) != 0):
            h += np.uint32(1)
        return sign | h
    h = ((a - np.uint32(0x38000000)) >> np.uint32(13)) & np.uint32(0xFFFF)  # rebias 127 -> 15
    rest = a & np.uint32(0x1FFF)
    if rest > np.uint32(0x1000) or (rest == np.uint32(0x1000) and (h & np.uint32(1)) != 0):
        h += np.uint32(1)  # a carry into the exponent is right, up to infinity
    return sign | h


@njit(inline="always")
def from_f16(h):
    """The float32 bits of the fp16 bits ``h`` (exact)."""
    sign = (h & np.uint32(0x8000)) << np.uint32(16)
    e = (h >> np.uint32(10)) & np.uint32(0x1F)
    m = h & np.uint32(0x3FF)
    if e == np.uint32(0x1F):
        return sign | _INF | (m << np.uint32(13))
    if e == 0:
        if m == 0:
            return sign
        e = np.uint32(113)  # normalize: m * 2^-24
        while (m & np.uint32(0x400)) == 0:
            m <<= np.uint32(1)
            e -= np.uint32(1)
        return sign | (e << np.uint32(23)) | ((m & np.uint32(0x3FF)) << np.uint32(13))
    return sign | ((e + np.uint32(112)) << np.uint32(23)) | (m << np.uint32(13))


@njit(inline="always")
def to_bf16(u):
    """The bf16 bits of the float32 bits ``u``, as ggml rounds (nearest even, NaNs kept quiet)."""
    if (u & _ABS) > _INF:
        return (u >> np.uint32(16)) | np.uint32(64)
    return (u + (np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1)))) >> np.uint32(16)


@njit(inline="always")
def from_bf16(h):
    return np.uint32(h) << np.uint32(16)
