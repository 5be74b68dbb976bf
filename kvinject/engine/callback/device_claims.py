"""The compiled side of kvinject/engine/gpu/device.py's ClaimTable: at a claim, the graph callback
(kvinject/engine/callback/graph_callback.py) launches the device kernel on a K or V in the first CUDA
device's memory through the driver's function pointers, and waits for it before llama.cpp reads
the values, with no call into Python."""

from __future__ import annotations

import numpy as np
from numba import carray, njit

from . import device_launch, graph_memory, numba_cache
from . import graph_header as gh
from .graph_memory import _DATA, _buffer_name, _i64, _launch, _synchronize, _u8

# Compiled with graph_header's and device_launch's slots and graph_memory's calls folded in.
numba_cache.stamp_with(__file__, [gh.__file__, graph_memory.__file__, device_launch.__file__])

# The name of the first CUDA device's buffers: numba's context holds that device (device.first_cuda_buffer).
_CUDA0 = np.frombuffer(b"CUDA0", np.uint8)


@njit(cache=True)
def launched(head, t, component, n, at, buffer):
    """Launch the device kernel on a claimed K or V (``component`` 0 or 1) of ``n`` values in the
    first CUDA device's memory, as device.DeviceChange.change does from Python (the header's DEVICE
    table): the driver's CUresult, or -1 where the claim goes to Python instead."""
    dev = carray(_i64(head[gh.DEVICE]), gh.DEVICE_SLOTS)
    if dev[gh.D_SLOTS_K + component] == 0:
        return -1
    name = _buffer_name(head[gh.BUFFER_NAME], buffer)
    if name == 0:
        return -1
    name_bytes = carray(_u8(name), len(_CUDA0))
    for i in range(len(_CUDA0)):
        if name_bytes[i] != _CUDA0[i]:
            return -1
    x, at_slot = dev[gh.D_X], dev[gh.D_AT]
    slots = carray(_i64(dev[gh.D_SLOTS_K + component]), max(x + device_launch.ARRAY_SLOTS, at_slot + 1))
    slots[x + device_launch.SIZE] = n
    slots[x + device_launch.DATA] = carray(_i64(t + _DATA), 1)[0]
    slots[x + device_launch.SHAPE] = n
    slots[at_slot] = at
    span, threads = dev[gh.D_SPAN], dev[gh.D_THREADS]
    blocks = max(1, min(1024, (n // span + threads - 1) // threads))
    err = _launch(dev[gh.D_LAUNCH], dev[gh.D_FUNCTION], blocks, threads, dev[gh.D_STREAM], dev[gh.D_POINTERS_K + component])
    if err == 0:
        counts = carray(_i64(dev[gh.D_COUNTS]), (2, 2))
        counts[component, 0] += n
        counts[component, 1] += 1
        dev[gh.D_PENDING] = 1
    return err


@njit(cache=True)
def wait(head):
    """Wait for the kernels launched at this claim (llama.cpp reads the values once the callback
    returns): the driver's CUresult."""
    dev = carray(_i64(head[gh.DEVICE]), gh.DEVICE_SLOTS)
    if dev[gh.D_PENDING] == 0:
        return 0
    dev[gh.D_PENDING] = 0
    return _synchronize(dev[gh.D_SYNCHRONIZE], dev[gh.D_STREAM])
