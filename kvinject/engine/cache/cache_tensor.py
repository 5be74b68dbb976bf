"""Read and write cells of one K or V cache tensor of llama.cpp, as float32 rows.

A cache tensor holds one row per cell (``cache_k_l<il>``: ``n_embd_k_gqa`` x cells), or, for
V without flash attention, one row per component (transposed: cells x ``n_embd_v_gqa``).
Values are stored in the cache's type (f32, f16 or bf16, rounded to nearest even as ggml does;
:func:`from_float`, :func:`to_float`); quantized cache types cannot be edited value by value. Host memory is changed in place through
numpy; device memory row by row through ggml_backend_tensor_get/set (untested: no GPU in the
tests), and only untransposed.
"""

from __future__ import annotations

import ctypes

import numpy as np

from ...exceptions import ModelError
from .. import ggml

_STORAGE = {ggml.CACHE_TYPES["f32"]: np.float32, ggml.CACHE_TYPES["f16"]: np.float16, ggml.CACHE_TYPES["bf16"]: np.uint16}
_BF16 = ggml.CACHE_TYPES["bf16"]


def from_float(x: np.ndarray, kind: int) -> np.ndarray:
    """float32 values in a cache type's storage: bf16 as ggml_compute_fp32_to_bf16 rounds (nearest
    even, NaN kept quiet), f16 as numpy (nearest even, like ggml's conversion)."""
    if kind != _BF16:
        return x.astype(_STORAGE[kind])
    u = np.ascontiguousarray(x, np.float32).view(np.uint32)
    rounded = ((u + (0x7FFF + ((u >> 16) & 1))) >> 16).astype(np.uint16)
    return np.where((u & 0x7FFFFFFF) > 0x7F800000, ((u >> 16) | 64).astype(np.uint16), rounded)


def to_float(stored: np.ndarray, kind: int) -> np.ndarray:
    """A cache type's storage as new float32 values."""
    return (stored.astype(np.uint32) << 16).view(np.float32) if kind == _BF16 else stored.astype(np.float32)


class CacheTensor:
    def __init__(self, ptr: int, transposed: bool):
        t = ggml.tensor(ptr)
        if t.type not in _STORAGE:
            raise ModelError(f"'{t.name.decode()}' is a quantized cache (ggml type {t.type}); its cells cannot be edited: use an f32, f16 or bf16 cache")
        self._ptr, self.kind, self.width = ptr, t.type, t.ne[0]
        self._storage = np.dtype(_STORAGE[t.type])
        n = ggml.numel(t)
        if ggml.lib().ggml_backend_buffer_is_host(t.buffer):
            flat = np.frombuffer((ctypes.c_uint8 * (n * self._storage.itemsize)).from_address(t.data), self._storage)
            # Transposed: component j of cell c at j * cells + c.
            self._rows = flat.reshape(self.width, -1).T if transposed else flat.reshape(-1, self.width)
        elif transposed:
            raise ModelError(f"'{t.name.decode()}' is a transposed V cache in device memory, which kvinject cannot edit: use --flash-attn on")
        else:
            self._rows = None
            self._row_bytes = self.width * self._storage.itemsize

    def get(self, cells: np.ndarray) -> np.ndarray:
        """The rows of ``cells``, in the cache's storage type (a copy)."""
        if self._rows is not None:
            return self._rows[cells]
        stored = np.empty((len(cells), self.width), self._storage)
        for i, cell in enumerate(cells.tolist()):
            ggml.lib().ggml_backend_tensor_get(self._ptr, stored[i].ctypes.data, cell * self._row_bytes, self._row_bytes)
        return stored

    def set(self, cells: np.ndarray, stored: np.ndarray) -> None:
        """Store rows already in the cache's storage type at ``cells``."""
        if self._rows is not None:
            self._rows[cells] = stored
            return
        stored = np.ascontiguousarray(stored)
        for i, cell in enumerate(cells.tolist()):
            ggml.lib().ggml_backend_tensor_set(self._ptr, stored[i].ctypes.data, cell * self._row_bytes, self._row_bytes)
