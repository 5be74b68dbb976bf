"""K/V changed where a CUDA GPU holds them (``--n-gpu-layers``), by kvinject/engine/gpu/device_kernels.py.

With layers offloaded, the K and V the hook claims are in device memory. The hook used to copy
each to the host and back (ggml_backend_tensor_get/set, two synchronous copies a site); here a
kernel changes it in place and adds its realized-error sums on the device, where they stay until
the host asks for them. Nothing is allocated per decode: the decode's segments, row mask and bit
flips go into device buffers that grow, laid out before the decode.

The kernels are launched through the driver (kvinject/engine/callback/device_launch.py), by the compiled
graph callback itself (:class:`ClaimTable`): at a claim it rewrites the launch's tensor and offset,
calls ``cuLaunchKernel`` and ``cuStreamSynchronize`` through their addresses and returns, with no
call into Python. The scheduler has synchronized its backend before the hook sees a claimed node,
and ggml keeps its CUDA streams to itself, so the kernels run on a stream of their own that the
callback waits for before it returns to the scheduler, once a claim (K and V of a layer together).
Python launches only the first claim, which sets the device path up, and where the driver cannot
be reached from compiled code (numba's simulator, KVINJECT_NUMBA_LAUNCH=1).

Every claim is still a split of llama.cpp's graph and a synchronization (docs/performance.md,
"GPU"). Only what a law describes runs here (kvinject/engine/laws.py); a model without one, or
memory on a device other than the first CUDA device, keeps the copy. numba.cuda is imported on
first use: a CPU-only run never loads it.
"""

from __future__ import annotations

import os
from functools import cache

import numpy as np

from .. import ggml, laws
from ..callback import device_launch
from ..callback import graph_header as gh
from ..callback.graph_callback import N_SUMS
from ..variates import Block, DecodeNoise


@cache
def usable() -> bool:
    """Whether numba's CUDA target (or its simulator) can run the kernels here, and
    KVINJECT_DEVICE_KERNELS=0 does not ask for the copy instead (to compare the two)."""
    if os.environ.get("KVINJECT_DEVICE_KERNELS") == "0":
        return False
    try:
        from numba import cuda
    except ImportError:
        return False
    return bool(cuda.is_available())


def first_cuda_buffer(buffer_name: int, buffer: int) -> bool:
    """Whether a ggml buffer is memory of the first CUDA device, the one numba's context holds
    (``buffer_name``: the address of ggml_backend_buffer_name, as the compiled callback asks it)."""
    name = ggml.buffer_name(buffer_name)(buffer)
    return name is not None and name.startswith(b"CUDA0")


# The change kernel's arguments, in order (device_kernels.change).
X, SPAN, ROW, AT, LAW, FIRST, KEY, START, ROWS, FLIPS, MASK, COLUMNS, ACC = range(13)


class DeviceChange:
    """The device side of one hook: ``law`` (kvinject/engine/laws.py) applied site by site to
    device-resident rows of ``rows[c]`` float32 (c: "k", "v"), with this decode's segments, row
    mask and flips and each component's ``columns``."""

    def __init__(self, law: tuple[float, ...], columns: dict[str, np.ndarray | None], rows: dict[str, int]):
        from numba import cuda

        from . import device_kernels

        self._cuda, self._kernels, self._threads = cuda, device_kernels, device_kernels.THREADS
        self._stream = cuda.stream()
        self._law = cuda.to_device(np.array([*law, *[0.0] * (laws.SLOTS - len(law))], np.float64))
        self.span = 1
        if law[0] == laws.QUANT:
            self.span = int(law[2])
        elif law[0] == laws.ROUND and law[4] > 0:
            self.span = int(law[4])
        self.flips = law[0] == laws.FLIP
        self._empty = {dt: cuda.device_array(0, dt) for dt in (np.uint8, np.uint32, np.int64, np.uint64, np.float32)}
        # Per component: this decode's sums (dropped if the decode fails) and the total, folded on the device.
        self._acc = cuda.to_device(np.zeros((2, device_kernels.N_ACC), np.float64))
        self._total = cuda.to_device(np.zeros((2, device_kernels.N_ACC), np.float64))
        self.counts = np.zeros((2, 2), np.int64)  # this decode's values and sites, per component (the callback adds too)
        self._total_counts = np.zeros((2, 2), np.int64)
        self._buffers: dict[str, object] = {}
        self._views: dict[tuple[int, int], object] = {}
        self._laid_out = False
        self._placed: tuple = ()  # what the launches' segment, mask and flip slots hold
        self._pending = False
        e = self._empty
        self._launch = {}
        for i, c in enumerate("kv"):
            cols = e[np.uint8] if columns[c] is None else cuda.to_device(columns[c].astype(np.uint8))
            segments = (e[np.int64], e[np.uint64], e[np.int64], e[np.int64])  # laid out at each decode
            args = (e[np.float32], self.span, rows[c], 0, self._law, *segments, e[np.uint32], e[np.uint8], cols, self._acc[i])
            self._launch[c] = device_launch.launcher(device_kernels.change, args, self._stream)
        self._fold = device_launch.launcher(device_kernels.fold, (self._acc.ravel(), self._total.ravel(), 1), self._stream)
        self.claims = ClaimTable(self, rows) if isinstance(self._launch["k"], device_launch.Launcher) else None

    def span_fits(self, row: int) -> bool:
        return row % self.span == 0

    def _upload(self, name: str, host: np.ndarray):
        """``host`` (1-D) in the device buffer ``name``, grown when too small: a view of its first elements."""
        buffer = self._buffers.get(name)
        if buffer is None or buffer.size < host.size:
            buffer = self._buffers[name] = self._cuda.device_array(2 * host.size, host.dtype)
        view = buffer[: host.size]
        view.copy_to_device(host, stream=self._stream)
        return view

    def layout(self, segments: list[tuple[int, int, int]], mask: np.ndarray | None, flips: np.ndarray | None = None) -> None:
        """This decode's runs of rows: (stream key, first value, rows) each; its row mask; and,
        for FLIP, the masks of every value of the decode, laid out as a stream's values (each
        segment's from its first value on). One upload for all the runs, each upload a call into
        the driver from Python next to a decode of SmolLM2 that takes 0.2 ms on an H100; the
        launches' slots are rewritten only where a buffer or a count changed."""
        n = len(segments)
        table = np.empty(4 * n, np.int64)  # first row, first value, rows, key: per segment
        table[2 * n : 3 * n] = [rows for _, _, rows in segments]
        table[0] = 0
        np.cumsum(table[2 * n : 3 * n - 1], out=table[1:n])
        table[n : 2 * n] = [start for _, start, _ in segments]
        table[3 * n :] = np.array([key for key, _, _ in segments], np.uint64).view(np.int64)
        d_table = self._upload("segments", table)
        d_mask = self._empty[np.uint8] if mask is None else self._upload("mask", mask.astype(np.uint8, copy=False))
        d_flips = self._empty[np.uint32] if flips is None else self._upload("flips", flips.astype(np.uint32, copy=False))
        placed = (n, *(id(self._buffers.get(name)) for name in ("segments", "mask", "flips")), d_mask.size, d_flips.size)
        if placed != self._placed:
            self._placed = placed
            arrays = ((FIRST, d_table[:n]), (START, d_table[n : 2 * n]), (ROWS, d_table[2 * n : 3 * n]), (KEY, d_table[3 * n :].view(np.uint64)))
            for launch in self._launch.values():
                for i, a in (*arrays, (FLIPS, d_flips), (MASK, d_mask)):
                    launch.put(i, a)
        self._laid_out = True

    def lay_out_decode(self, noise: DecodeNoise | None, mask: np.ndarray | None, rows: int) -> None:
        """:meth:`layout` for a decode of ``rows`` batch rows with the hook's ``noise``: counter
        streams by key and first value; drawn bit-flip masks uploaded, each item's from its first
        value on; else one run of every row."""
        flips = None
        if noise is not None and all(isinstance(block, Block) for block, _ in noise.blocks):
            runs = [(block.variates.key, block.start, n) for block, n in noise.blocks]
        elif noise is not None and self.flips:
            flips = np.concatenate([block for block, _ in noise.blocks]) if len(noise.blocks) > 1 else noise.blocks[0][0]
            starts = np.cumsum([0, *(len(block) for block, _ in noise.blocks[:-1])])
            runs = [(0, int(start), n) for start, (_, n) in zip(starts, noise.blocks)]
        else:
            runs = [(0, 0, rows)]
        self.layout(runs, mask, flips)

    @property
    def laid_out(self) -> bool:
        return self._laid_out

    def change(self, data: int, rows: int, row: int, component: str, at: int) -> None:
        """Launch the kernel on ``rows`` rows of ``row`` float32 at the device address ``data``."""
        n = rows * row
        x = self._views.get((data, n))
        if x is None:  # llama.cpp reuses its compute buffers: the same few addresses recur
            if len(self._views) > 4096:
                self._views.clear()
            x = self._views[data, n] = self._kernels.float32_at(data, n)
        launch = self._launch[component]
        launch.put(X, x)
        launch.put(AT, at)
        launch(self.blocks(n), self._threads)
        self.counts["kv".index(component)] += (n, 1)
        self._pending = True

    def blocks(self, n: int) -> int:
        """The grid for ``n`` values: a thread a span, at most 1024 blocks (the kernel strides over the rest)."""
        return max(1, min(1024, -(-n // self.span // self._threads)))

    def wait(self) -> None:
        """Wait for the kernels launched from Python since the last wait (before llama.cpp reads the values)."""
        if self._pending:
            self._stream.synchronize()
            self._pending = False

    def fold(self, keep: bool) -> None:
        """End a decode: add its sums to the totals (``keep``), or drop them (a failed decode)."""
        self._fold.put(2, int(keep))
        self._fold(1, self._acc.size)
        if keep:
            self._total_counts += self.counts
        self.counts[:] = 0
        self._laid_out = False

    def totals(self, selective: bool) -> tuple[np.ndarray, np.ndarray]:
        """The sums of the finished decodes in the compiled callback's layout: (2, N_SUMS) of
        what changed and of what a selection left out."""
        acc = self._total.copy_to_host(stream=self._stream)
        self._stream.synchronize()
        sums, outside = np.zeros((2, N_SUMS)), np.zeros((2, N_SUMS))
        sums[:, 0], sums[:, 1] = self._total_counts[:, 0], self._total_counts[:, 1]
        sums[:, 2:] = acc[:, :8]
        if selective:
            outside[:, 0], outside[:, 1] = acc[:, 8], self._total_counts[:, 1]
            outside[:, 3], outside[:, 4], outside[:, 8] = acc[:, 9], acc[:, 10], acc[:, 11]
        return sums, outside


class ClaimTable:
    """What the compiled graph callback needs to launch the change kernel at a claim itself
    (graph_header's DEVICE slots): the driver's functions, the kernel and stream, each component's
    parameter slots and where the tensor and its offset go in them, the grid's terms and the
    decode's counts. A component whose rows the kernel's span does not divide gets no slots: its
    claims go to Python, which copies."""

    def __init__(self, change: DeviceChange, rows: dict[str, int]):
        launch = change._launch
        k = launch["k"]
        self.table = t = np.zeros(gh.DEVICE_SLOTS, np.int64)
        t[gh.D_LAUNCH], t[gh.D_SYNCHRONIZE] = k.driver.launch, k.driver.synchronize
        t[gh.D_FUNCTION], t[gh.D_STREAM] = k.function, k.stream
        for c, slots, pointers in (("k", gh.D_SLOTS_K, gh.D_POINTERS_K), ("v", gh.D_SLOTS_V, gh.D_POINTERS_V)):
            if change.span_fits(rows[c]):
                t[slots], t[pointers] = launch[c].slots.ctypes.data, launch[c].pointers.ctypes.data
        t[gh.D_X], t[gh.D_AT] = k.offset[X], k.offset[AT]
        t[gh.D_SPAN], t[gh.D_THREADS] = change.span, change._threads
        t[gh.D_COUNTS] = change.counts.ctypes.data
