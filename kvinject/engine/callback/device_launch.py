"""Launches of a numba CUDA kernel straight through the driver, its arguments laid out once.

numba prepares every argument of every launch anew (numba-cuda 0.30: a strided memory view of
each device array, checked and flattened): on an H200 (2026-11, docs/performance.md, "GPU") that
was 120-170 us a launch, 60 launches a decode of SmolLM2 and most of the hooked decode's time.
Here the kernel's parameters sit in one block of 8-byte slots, laid out as numba's calling
convention flattens them (an array: meminfo, parent, size, itemsize, data, shape, strides; a
scalar: its value), and a launch calls ``cuLaunchKernel`` with the slots as they are: the caller
rewrites the slots that changed (:meth:`Launcher.put`). Every argument must be a 1-D contiguous
device array or an int64/float64 scalar, so that every slot is 8 bytes.

The block is a numpy array and the driver's functions are kept as addresses (:class:`Driver`),
so that compiled code can rewrite a slot and launch too: the graph callback launches the hook's
kernel at a claim with no call into Python (kvinject/engine/gpu/device.py, :class:`ClaimTable`).

Under numba's CUDA simulator there is no driver: :func:`launcher` launches through numba there, and
where ``KVINJECT_NUMBA_LAUNCH=1`` asks for it (to compare the two).
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from functools import cache

import numpy as np
from numba import config

# The slots of one array argument: meminfo, parent, size, itemsize, data, shape[0], strides[0].
ARRAY_SLOTS = 7
SIZE, DATA, SHAPE = 2, 4, 5  # an array's slots that name its memory

# CUresult cuLaunchKernel(CUfunction, grid x/y/z, block x/y/z, shared bytes, CUstream, void **params, void **extra)
LAUNCH = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, *[ctypes.c_uint] * 7, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)
SYNCHRONIZE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)  # CUresult cuStreamSynchronize(CUstream)


@dataclass(frozen=True)
class Driver:
    """The driver functions launches call, by address: libcuda's ``cuLaunchKernel`` and
    ``cuStreamSynchronize``, or functions of the same signatures standing in for them."""

    launch: int
    synchronize: int


@cache
def cuda_driver() -> Driver:
    lib = ctypes.CDLL("libcuda.so.1")
    return Driver(*(ctypes.cast(getattr(lib, name), ctypes.c_void_p).value for name in ("cuLaunchKernel", "cuStreamSynchronize")))


def _handle(h) -> int:
    """A driver handle (a CUDA binding object or a ctypes pointer) as an integer."""
    value = getattr(h, "value", h)
    return int(value or 0)


def array_slots(a) -> tuple[int, ...]:
    """The kernel parameters numba passes for the 1-D device array ``a`` (under numba's simulator,
    an array in host memory)."""
    itemsize = a.dtype.itemsize
    pointer = getattr(a, "device_ctypes_pointer", None)
    address = _handle(pointer) if pointer is not None else a.ctypes.data
    return (0, 0, a.size, itemsize, address, a.shape[0], itemsize)


class Launcher:
    """The kernel ``function`` (a CUfunction) launched on ``stream`` through ``driver``, with
    parameters laid out from ``args`` and rewritten argument by argument (:meth:`put`)."""

    def __init__(self, function: int, args: tuple, stream: int, driver: Driver):
        self.function, self.stream, self.driver = function, stream, driver
        self.offset = []  # each argument's first slot
        n = 0
        for a in args:
            self.offset.append(n)
            n += ARRAY_SLOTS if hasattr(a, "shape") else 1
        self.slots = np.zeros(n, np.int64)
        self._double = self.slots.view(np.float64)
        self.pointers = self.slots.ctypes.data + 8 * np.arange(n, dtype=np.int64)  # void **kernelParams
        self._launch = LAUNCH(driver.launch)
        for i, a in enumerate(args):
            self.put(i, a)

    def put(self, i: int, a) -> None:
        at = self.offset[i]
        if hasattr(a, "shape"):
            self.slots[at : at + ARRAY_SLOTS] = array_slots(a)
        elif isinstance(a, float):
            self._double[at] = a
        else:
            self.slots[at] = int(a)

    def __call__(self, blocks: int, threads: int) -> None:
        err = self._launch(self.function, blocks, 1, 1, threads, 1, 1, 0, self.stream, self.pointers.ctypes.data, None)
        if err != 0:
            raise RuntimeError(f"cuLaunchKernel failed with CUDA error {err}")


class NumbaLaunch:
    """``kernel`` launched through numba, which prepares its arguments at every launch."""

    def __init__(self, kernel, args: tuple, stream):
        self._kernel, self._args, self._stream = kernel, list(args), stream

    def put(self, i: int, a) -> None:
        self._args[i] = a

    def __call__(self, blocks: int, threads: int) -> None:
        self._kernel[blocks, threads, self._stream](*self._args)


def launcher(kernel, args: tuple, stream) -> Launcher | NumbaLaunch:
    """How to launch ``kernel`` (a numba dispatcher) with arguments of the types of ``args`` on
    ``stream``: through the driver, or through numba under the simulator and where
    KVINJECT_NUMBA_LAUNCH=1 asks for it."""
    if config.ENABLE_CUDASIM or os.environ.get("KVINJECT_NUMBA_LAUNCH") == "1":
        return NumbaLaunch(kernel, args, stream)
    compiled = next(iter(kernel.specialize(*args).overloads.values()))
    return Launcher(_handle(compiled.library.get_cufunc().handle), args, _handle(stream.handle), cuda_driver())
