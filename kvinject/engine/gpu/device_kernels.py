"""The GPU kernel that changes K/V where the device holds them, compiled by numba's CUDA target.

It computes what the host computes, value for value: the factors of kvinject/engine/variates.py
(the same counter-based streams, so a seeded item's noise is the same on both), the roundings of
kvinject/engine/callback/rounding.py, the other laws of kvinject/engine/laws.py, and the realized-error sums of
kvinject/engine/callback/graph_callback.py's ``_change``. The host's compiled functions are not written twice:
their Python code is compiled again for the device (:func:`_for_device`), each name they call
bound to its device version. Under numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``) the same
kernel runs as Python on the CPU, which is how the tests check it without a GPU.

One thread changes one span (a quantization group, an MX block, or one value) of a K or V row:
a span's scale is read before any of its values is written. Sums are reduced per block in shared
memory and added to the totals with one atomic add per block and sum, in float64: their order,
and so their last bits, differ from the host's.
"""

from __future__ import annotations

import ctypes
import math
from types import FunctionType

import numpy as np
from numba import config, cuda, float64, types

from .. import laws
from ..callback import counter_rng, rounding
from . import float_encodings

if not hasattr(np, "row_stack"):  # numba-cuda (to 0.30.4) names it when it compiles a kernel; numpy 2.5 removed it
    np.row_stack = np.vstack
# The kernels' grids fit the rows of a decode (a few blocks for one sequence): numba's warning says nothing here.
config.CUDA_LOW_OCCUPANCY_WARNINGS = 0
THREADS = 128
# What a block sums: changed, nonfinite, rel_n, rel_sum, rel_sumsq, sign_flips, signal, noise (RealizedStats'
# fields from 'changed' on), then the values a selection leaves out: values, nonfinite, rel_n, signal.
N_ACC = 12


def _for_device(modules, names, replace):
    """Device functions of the host's compiled ``names``, found in ``modules``, calling each other."""
    namespace = {}
    for module in modules:
        namespace.update(vars(module))
    for name in names:
        fn = namespace[name]
        fn = getattr(fn, "py_func", fn)
        code = FunctionType(fn.__code__, namespace, name, fn.__defaults__, fn.__closure__)
        namespace[name] = cuda.jit(device=True)(code)
    namespace.update(replace)
    return namespace


if config.ENABLE_CUDASIM:  # the simulator runs the functions as Python: bits by numpy's views
    _target = {"f32_bits": lambda x: np.float32(x).view(np.uint32), "f32_from": lambda u: np.uint32(u).view(np.float32)}

    def float32_at(address: int, n: int) -> np.ndarray:
        """The simulator's device memory is the host's."""
        return np.ctypeslib.as_array((ctypes.c_float * n).from_address(address))
else:
    from numba.cuda import libdevice
    from numba.cuda.extending import overload

    def _times(x, y):
        return x * y

    @overload(_times, target="cuda")
    def _times_rounded(x, y):
        """A multiply that CUDA's compiler does not fuse into an addition (counter_rng._times)."""
        if x == types.float32:
            return lambda x, y: libdevice.fmul_rn(x, y)
        return lambda x, y: libdevice.dmul_rn(x, y)

    _target = {"_times": _times}

    def float32_at(address: int, n: int):
        """``n`` float32 at a device address that another library (ggml) allocated, as a device array."""
        desc = {"shape": (n,), "typestr": "<f4", "data": (address, False), "version": 3, "strides": None, "stream": None}
        return cuda.from_cuda_array_interface(desc, owner=None, sync=False)


_dev = _for_device(
    [counter_rng, rounding, float_encodings],
    ["_mix", "hash_at", "_unit", "_normal_slow", "normal", "uniform", "factor", "round_to", "shared_scale", "round_scaled"]
    + ["f32_bits", "f32_from", "to_f16", "from_f16", "to_bf16", "from_bf16"],
    _target,
)
factor, hash_at, round_to, shared_scale, round_scaled = (_dev[n] for n in ("factor", "hash_at", "round_to", "shared_scale", "round_scaled"))
f32_bits, f32_from, to_f16, from_f16, to_bf16, from_bf16 = (_dev[n] for n in ("f32_bits", "f32_from", "to_f16", "from_f16", "to_bf16", "from_bf16"))


@cuda.jit(device=True)
def _rint32(y):
    """``y`` (float32, |y| < 2^31) rounded to the nearest integer, ties to even, as numpy's rint
    (a negative rounded to zero is -0)."""
    f = math.floor(y)
    d = np.float64(y) - f
    if d > 0.5 or (d == 0.5 and f % 2 != 0):
        f += 1
    return np.float32(math.copysign(f, y))


@cuda.jit(device=True)
def _changed(kind, law, v, key, index, scale, flip):
    """The value ``v`` becomes under ``law`` (its slots as kvinject/engine/laws.py lays them out for
    its kind), and the value the sums measure the change from."""
    if kind == laws.ROUND:
        largest, nmant, minexp = law[1], np.int64(law[2]), np.int64(law[3])
        if law[4] > 0:
            return round_scaled(v, scale, largest, nmant, minexp), v
        return round_to(v, largest, nmant, minexp), v
    if kind == laws.QUANT:
        qmax = np.float32(law[1])
        q = min(max(_rint32(np.float32(v / np.float32(scale))), -qmax), qmax)
        return np.float32(q * np.float32(scale)), v
    if kind == laws.MASK:
        return f32_from(f32_bits(v) & np.uint32(np.int64(law[1]))), v
    if kind == laws.FLIP:
        u, fmt = f32_bits(v), np.int64(law[1])
        if fmt == laws.F16:
            s = to_f16(u)
            return f32_from(from_f16(s ^ flip)), f32_from(from_f16(s))
        if fmt == laws.BF16:
            s = to_bf16(u)
            return f32_from(from_bf16(s ^ flip)), f32_from(from_bf16(s))
        return f32_from(u ^ flip), v
    return v * factor(kind, np.float32(law[1]), np.float32(law[2]), hash_at(key, index)), v


@cuda.jit(device=True)
def _span_scale(kind, law, x, first, span):
    """The scale a span shares, read before any of its values is written: an MX block's, or a
    quantization group's absolute maximum over its largest code; 1 for other laws."""
    scale = 1.0
    if kind == laws.ROUND and law[4] > 0:  # an MX block's shared scale
        scale = shared_scale(x[first : first + span], law[1])
    elif kind == laws.QUANT:
        amax = np.float32(0)
        for j in range(first, first + span):
            m = abs(x[j])
            if m > amax or m != m:
                amax = m
        scale = np.float64(amax / np.float32(law[1]))
        if scale == 0:
            scale = 1.0
    return scale


@cuda.jit
def change(x, span, row, at, law, seg_first, seg_key, seg_start, seg_rows, flips, mask, columns, acc):
    """Change ``x`` (rows of ``row`` float32 values) in place, span by span, and add what changed
    to ``acc`` (N_ACC float64). Segment k's rows, from ``seg_first[k]``, take their factors from
    their stream's values from ``seg_start[k] + at * seg_rows[k]`` on, ``row`` a row (the host's
    layout); ``flips``: FLIP's masks, one a value, laid out as those values (each segment's from
    its ``seg_start`` on, so a decode's are uploaded once); ``mask`` (rows) and ``columns`` (row), when not
    empty: which rows and components get the error; the others keep their values."""
    kind = np.int64(law[0])
    sums = cuda.local.array(N_ACC, float64)
    for i in range(N_ACC):
        sums[i] = 0.0
    n_spans = x.size // span
    for s in range(cuda.grid(1), n_spans, cuda.gridsize(1)):
        first = s * span
        r = first // row
        k = 0
        while k + 1 < seg_first.size and r >= seg_first[k + 1]:
            k += 1
        base = seg_start[k] + at * seg_rows[k] + (r - seg_first[k]) * row
        scale = _span_scale(kind, law, x, first, span)
        row_out = mask.size > 0 and mask[r] == 0
        for j in range(first, first + span):
            c = j - r * row
            before = x[j]
            flip = np.uint32(flips[base + c]) if flips.size > 0 else np.uint32(0)
            after, start = _changed(kind, law, before, seg_key[k], base + c, scale, flip)
            if row_out or (columns.size > 0 and columns[c] == 0):  # kept: counts as unchanged, and outside
                sums[8] += 1
                if not math.isfinite(before):
                    sums[1] += 1
                    sums[9] += 1
                    continue
                sums[6] += np.float64(before) * np.float64(before)
                sums[11] += np.float64(before) * np.float64(before)
                if before != 0:
                    sums[2] += 1
                    sums[10] += 1
                continue
            x[j] = after
            if after != start and (after == after or start == start):
                sums[0] += 1
            if not math.isfinite(after):
                sums[1] += 1
                continue
            d = np.float64(after) - np.float64(start)
            sums[6] += np.float64(start) * np.float64(start)
            sums[7] += d * d
            if start != 0:
                rel = d / np.float64(start)
                sums[2] += 1
                sums[3] += rel
                sums[4] += rel * rel
                if np.float64(after) * np.float64(start) < 0:
                    sums[5] += 1
    shared = cuda.shared.array((N_ACC, THREADS), float64)
    t = cuda.threadIdx.x
    for i in range(N_ACC):
        shared[i, t] = sums[i]
    cuda.syncthreads()
    width = THREADS // 2
    while width > 0:
        if t < width:
            for i in range(N_ACC):
                shared[i, t] += shared[i, t + width]
        cuda.syncthreads()
        width //= 2
    if t == 0:
        for i in range(N_ACC):
            if shared[i, 0] != 0:
                cuda.atomic.add(acc, i, shared[i, 0])


@cuda.jit
def fold(acc, total, keep):
    """``total += acc`` where ``keep`` (nonzero), and ``acc`` zeroed (both 2 * N_ACC, K's then V's); one thread a sum."""
    i = cuda.threadIdx.x
    if i < acc.size:
        if keep:
            total[i] += acc[i]
        acc[i] = 0.0
