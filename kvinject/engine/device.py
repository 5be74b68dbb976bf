"""K/V changed where a CUDA GPU holds them (``--n-gpu-layers``), by kvinject/engine/device_kernels.py.

With layers offloaded, the K and V the hook claims are in device memory. The hook used to copy
each to the host and back (ggml_backend_tensor_get/set, two synchronous copies a site); here a
kernel changes it in place and adds its realized-error sums on the device, where they stay until
the host asks for them. Nothing is allocated per decode: the decode's segments, row mask and bit
flips go into device buffers that grow. The scheduler has synchronized its backend before the hook
sees a claimed node, and ggml keeps its CUDA streams to itself, so the kernels run on a stream of
their own that the hook waits for before it returns to the scheduler, once a claim (K and V of a
layer together).

The kernels are launched through the driver (kvinject/engine/device_launch.py): numba's own launch
prepared every argument anew and cost a hooked decode about twice its time. Measured on an H200
and an H100 (docs/performance.md, "GPU"): the kernels give the values of the copy bit for bit, and
neither path is cheap next to a decode that takes 0.2-0.5 ms there: every claim is a split of
llama.cpp's graph, a synchronization and a call into Python, 30 a decode on SmolLM2 (about 90 us each).

Only what a law describes runs here (kvinject/engine/laws.py); a model without one, or memory on a
device other than the first CUDA device, keeps the copy. numba.cuda is imported on first use: a
CPU-only run never loads it.
"""

from __future__ import annotations

import os
from functools import cache

import numpy as np

from . import device_launch, ggml, laws
from .graph_callback import N_SUMS


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


def first_cuda_buffer(buffer: int) -> bool:
    """Whether a ggml buffer is memory of the first CUDA device, the one numba's context holds."""
    name = ggml.lib().ggml_backend_buffer_name(buffer)
    return name is not None and name.startswith(b"CUDA0")


class DeviceChange:
    """The device side of one hook: ``law`` (kvinject/engine/laws.py) applied site by site to
    device-resident rows, with this decode's segments, row mask and each component's columns."""

    def __init__(self, law: tuple[float, ...], columns: dict[str, np.ndarray | None]):
        from numba import cuda

        from . import device_kernels

        self._cuda, self._kernels, self._threads = cuda, device_kernels, device_kernels.THREADS
        self._stream = cuda.stream()
        self._law = cuda.to_device(np.array([*law, *[0.0] * (laws.SLOTS - len(law))], np.float64))
        self._span = 1
        if law[0] == laws.QUANT:
            self._span = int(law[2])
        elif law[0] == laws.ROUND and law[4] > 0:
            self._span = int(law[4])
        self.flips = law[0] == laws.FLIP
        self._empty = {dt: cuda.device_array(0, dt) for dt in (np.uint8, np.uint32)}
        self._columns = {c: self._empty[np.uint8] if cols is None else cuda.to_device(cols.astype(np.uint8)) for c, cols in columns.items()}
        # Per component: this decode's sums (dropped if the decode fails) and the total, folded on the device.
        self._acc = cuda.to_device(np.zeros((2, device_kernels.N_ACC), np.float64))
        self._total = cuda.to_device(np.zeros((2, device_kernels.N_ACC), np.float64))
        self._acc_of = {"k": self._acc[0], "v": self._acc[1]}
        self._acc_flat, self._total_flat = self._acc.ravel(), self._total.ravel()
        self._counts = np.zeros((2, 2), np.int64)  # this decode's values and sites, per component
        self._total_counts = np.zeros((2, 2), np.int64)
        self._buffers: dict[str, object] = {}
        self._views: dict[tuple[int, int], object] = {}
        self._decode: tuple | None = None
        self._pending = False
        self._change = self._fold = None  # their launchers, made at the first launch

    def span_fits(self, row: int) -> bool:
        return row % self._span == 0

    def _upload(self, name: str, host: np.ndarray):
        """``host`` (1-D) in the device buffer ``name``, grown when too small: a view of its first elements."""
        buffer = self._buffers.get(name)
        if buffer is None or buffer.size < host.size:
            buffer = self._buffers[name] = self._cuda.device_array(2 * host.size, host.dtype)
        view = buffer[: host.size]
        view.copy_to_device(host, stream=self._stream)
        return view

    def layout(self, segments: list[tuple[int, int, int]], mask: np.ndarray | None) -> None:
        """This decode's runs of rows: (stream key, first value, rows) each; and its row mask."""
        rows = [n for _, _, n in segments]
        n = len(segments)
        table = self._upload("segments", np.array([np.cumsum([0, *rows[:-1]]), [start for _, start, _ in segments], rows], np.int64).ravel())
        keys = self._upload("keys", np.array([key for key, _, _ in segments], np.uint64))
        mask = self._empty[np.uint8] if mask is None else self._upload("mask", mask.astype(np.uint8))
        self._decode = (table[:n], keys, table[n : 2 * n], table[2 * n :], mask)

    def change(self, data: int, rows: int, row: int, component: str, at: int, flips: np.ndarray | None) -> None:
        """Launch the kernel on ``rows`` rows of ``row`` float32 at the device address ``data``."""
        n = rows * row
        x = self._views.get((data, n))
        if x is None:  # llama.cpp reuses its compute buffers: the same few addresses recur
            if len(self._views) > 4096:
                self._views.clear()
            x = self._views[data, n] = self._kernels.float32_at(data, n)
        d_flips = self._upload("flips", flips.astype(np.uint32)) if flips is not None else self._empty[np.uint32]
        first, key, start, seg_rows, mask = self._decode
        blocks = max(1, min(1024, -(-n // self._span // self._threads)))
        args = (x, self._span, row, at, self._law, first, key, start, seg_rows, d_flips, mask, self._columns[component], self._acc_of[component])
        if self._change is None:
            self._change = device_launch.launcher(self._kernels.change, args, self._stream)
        self._change(blocks, self._threads, args)
        self._counts["kv".index(component)] += (n, 1)
        self._pending = True

    def wait(self) -> None:
        """Wait for the kernels launched since the last wait (before llama.cpp reads the values)."""
        if self._pending:
            self._stream.synchronize()
            self._pending = False

    def fold(self, keep: bool) -> None:
        """End a decode: add its sums to the totals (``keep``), or drop them (a failed decode)."""
        args = (self._acc_flat, self._total_flat, int(keep))
        if self._fold is None:
            self._fold = device_launch.launcher(self._kernels.fold, args, self._stream)
        self._fold(1, self._acc.size, args)
        if keep:
            self._total_counts += self._counts
        self._counts[:] = 0
        self._decode = None

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
