"""Launches of a numba CUDA kernel straight through the driver, its arguments laid out once.

numba prepares every argument of every launch anew (numba-cuda 0.30: a strided memory view of
each device array, checked and flattened): on the H200 of session 24 that was 120-170 us a launch,
60 launches a decode of SmolLM2 and most of the hooked decode's time (docs/performance.md, "GPU").
Here the kernel's parameters sit in one block of 8-byte slots, laid out at the first launch as
numba's calling convention flattens them (an array: meminfo, parent, size, itemsize, data, shape,
strides; a scalar: its value), and a launch rewrites the slots that changed and calls
``cuLaunchKernel`` with them: about 20 us a launch in Python, and on an H100 a hooked decode of
one sequence took 5.0 ms instead of numba's 9.6 (session 27). Every argument must be a 1-D
contiguous device array or an int64/float64 scalar, so that every slot is 8 bytes.

Under numba's CUDA simulator there is no driver: :func:`launcher` launches through numba there, and
where ``KVINJECT_NUMBA_LAUNCH=1`` asks for it (to compare the two).
"""

from __future__ import annotations

import ctypes
import os
from functools import cache

from numba import config

# The slots of one array argument: meminfo, parent, size, itemsize, data, shape[0], strides[0].
ARRAY_SLOTS = 7


@cache
def _driver() -> ctypes.CDLL:
    lib = ctypes.CDLL("libcuda.so.1")
    lib.cuLaunchKernel.argtypes = [ctypes.c_void_p, *[ctypes.c_uint] * 7, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    lib.cuLaunchKernel.restype = ctypes.c_int
    return lib


def _handle(h) -> int:
    """A driver handle (a CUDA binding object or a ctypes pointer) as an integer."""
    value = getattr(h, "value", h)
    return int(value or 0)


def array_slots(a) -> tuple[int, ...]:
    """The kernel parameters numba passes for the 1-D device array ``a``."""
    itemsize = a.dtype.itemsize
    return (0, 0, a.size, itemsize, _handle(a.device_ctypes_pointer), a.shape[0], itemsize)


class Launcher:
    """``kernel`` (a numba dispatcher) compiled for the types of its first ``args`` and launched on
    ``stream``; a launch rewrites the slots of the arguments that are not the objects of the last."""

    def __init__(self, kernel, args: tuple, stream):
        compiled = next(iter(kernel.specialize(*args).overloads.values()))
        self._function = _handle(compiled.library.get_cufunc().handle)
        self._stream = _handle(stream.handle)  # 0: the default stream
        self._offset = []  # each argument's first slot
        n = 0
        for a in args:
            self._offset.append(n)
            n += ARRAY_SLOTS if hasattr(a, "device_ctypes_pointer") else 1
        self._slots = (ctypes.c_int64 * n)()
        self._double = (ctypes.c_double * n).from_buffer(self._slots)
        base = ctypes.addressof(self._slots)
        self._params = (ctypes.c_void_p * n)(*[base + 8 * i for i in range(n)])
        self._last: tuple = (None,) * len(args)

    def _put(self, i: int, a) -> None:
        at = self._offset[i]
        if hasattr(a, "device_ctypes_pointer"):
            self._slots[at : at + ARRAY_SLOTS] = array_slots(a)
        elif isinstance(a, float):
            self._double[at] = a
        else:
            self._slots[at] = int(a)

    def __call__(self, blocks: int, threads: int, args: tuple) -> None:
        last = self._last
        for i, a in enumerate(args):
            if a is not last[i]:
                self._put(i, a)
        self._last = args
        err = _driver().cuLaunchKernel(self._function, blocks, 1, 1, threads, 1, 1, 0, self._stream, self._params, None)
        if err != 0:
            raise RuntimeError(f"cuLaunchKernel failed with CUDA error {err}")


class NumbaLaunch:
    """``kernel`` launched through numba, which prepares its arguments at every launch."""

    def __init__(self, kernel, stream):
        self._kernel, self._stream = kernel, stream

    def __call__(self, blocks: int, threads: int, args: tuple) -> None:
        self._kernel[blocks, threads, self._stream](*args)


def launcher(kernel, args: tuple, stream) -> Launcher | NumbaLaunch:
    """How to launch ``kernel`` with arguments like ``args``: through the driver, or through numba
    under the simulator and where KVINJECT_NUMBA_LAUNCH=1 asks for it."""
    if config.ENABLE_CUDASIM or os.environ.get("KVINJECT_NUMBA_LAUNCH") == "1":
        return NumbaLaunch(kernel, stream)
    return Launcher(kernel, args, stream)
