"""ggml's quantized blocks as a fault lands in them: q8_0 and q4_0 (ggml-common.h).

A block holds 32 values: first the scale, an fp16 ``d``, then one signed code per value, so
that value ``j`` is ``d * code[j]``. q8_0 stores each code as an int8 (byte ``2 + j``); q4_0
as a nibble offset by 8 (value ``j < 16`` in the low nibble of byte ``2 + j``, value ``j + 16``
in the high one, ``code = nibble - 8``). A fault is one bit of the scale or of a code; its
mask says which: bits 0-7 a code's bit, bits 16-31 the scale's bit 0-15.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..exceptions import InjectionError
from . import ggml
from .graph.cache_writes import cache_site
from .rowbits import SCALE_SHIFT, VALUES, RowLayout, land


@dataclass(frozen=True)
class BlockFormat:
    name: str
    code: int  # bits of one code

    @property
    def nbytes(self) -> int:
        return 2 + VALUES * self.code // 8

    @property
    def layout(self) -> RowLayout:
        """Where a row's values lie in its bytes."""
        return RowLayout(block=self.nbytes, code=self.code)

    def sites(self, field: str, bit: int | None) -> list[tuple[int, int]]:
        """The bits of one block a fault may take, as (value it belongs to, mask): the scale's
        are the block's first value's. ``field``: 'scale', 'code' or 'any'; ``bit``: one bit
        of that field."""
        scale = [(0, 1 << (SCALE_SHIFT + b)) for b in range(16) if bit is None or b == bit]
        code = [(j, 1 << b) for j in range(VALUES) for b in range(self.code) if bit is None or b == bit]
        return {"scale": scale, "code": code, "any": scale + code}[field]

    def dequantize(self, raw: np.ndarray) -> np.ndarray:
        """(rows, bytes) of whole blocks -> (rows, values) float32, as ggml dequantizes."""
        blocks = raw.reshape(raw.shape[0], -1, self.nbytes)
        d = np.ascontiguousarray(blocks[..., :2]).view(np.float16)[..., :1].astype(np.float32)
        qs = blocks[..., 2:]
        if self.code == 8:
            codes = qs.view(np.int8).astype(np.float32)
        else:
            codes = np.concatenate([qs & 0x0F, qs >> 4], axis=-1).astype(np.float32) - 8
        return (d * codes).reshape(raw.shape[0], -1)

    def flip(self, row: np.ndarray, value: int, mask: int) -> None:
        """Flip in ``row`` (one cache row's bytes) the bit ``mask`` names of value ``value``'s block."""
        block, j = divmod(value, VALUES)
        start = block * self.nbytes
        if mask >> SCALE_SHIFT:
            scale = mask >> SCALE_SHIFT
            row[start : start + 2] ^= np.array([scale & 0xFF, scale >> 8], np.uint8)
        elif self.code == 8:
            row[start + 2 + j] ^= np.uint8(mask)
        else:
            row[start + 2 + j % 16] ^= np.uint8(mask << (4 if j >= 16 else 0))

    def describe(self, mask: int) -> dict[str, object]:
        """A fault's field and its bit in that field."""
        scale = mask >> SCALE_SHIFT
        return {"bit": (scale or mask).bit_length() - 1, "field": "scale" if scale else "code", "format": self.name}


BLOCK_FORMATS = {"q8_0": BlockFormat("q8_0", 8), "q4_0": BlockFormat("q4_0", 4)}


class BlockFaults:
    """One decode's faults in the blocks of a quantized cache: each site's masks, staged where
    its K or V enters the graph (the hook's claim), flipped in the cache once llama.cpp has
    written that site's rows (``ggml_set_rows(cache, rows, index)``, a claimed node)."""

    def __init__(self, fmt: BlockFormat, secded: bool = False):
        self.format = fmt
        self.secded = secded
        self._staged: dict[tuple[str, int], tuple[np.ndarray, Callable]] = {}

    def stage(self, component: str, layer: int, masks: np.ndarray, note: Callable) -> None:
        """The decode's masks of one site, (rows, row values); ``note`` hands a fault model's
        changes as they landed to their items' streams (DecodeNoise.note)."""
        self._staged[component, layer] = masks, note

    def written(self, ptr: int) -> tuple[str, np.ndarray, np.ndarray] | None:
        """Flip what was staged for the cache write ``ptr`` (computed); its component and the
        values of the rows it wrote, before and after. None for a cache no fault targets."""
        t = ggml.tensor(ptr)
        cache = ggml.tensor(t.view_src or ptr)
        site = cache_site(cache.name)
        masks, note = self._staged.pop(site, (None, None)) if site else (None, None)
        if masks is None:
            return None
        index = ggml.tensor(t.src[1])
        if not (ggml.lib().ggml_backend_buffer_is_host(cache.buffer) and ggml.lib().ggml_backend_buffer_is_host(index.buffer)):
            raise InjectionError("faults in quantized blocks change the cache in host memory: run without --n-gpu-layers")
        if ggml.numel(index) != masks.shape[0]:
            raise InjectionError(f"the cache write of {site[0].upper()} in layer {site[1]} is not one row per token (V stored transposed?)")
        cells = np.frombuffer((ctypes.c_int64 * masks.shape[0]).from_address(index.data), np.int64)
        stride, n_cells = cache.nb[1], ggml.numel(cache) // cache.ne[0]
        rows = np.frombuffer((ctypes.c_uint8 * (stride * n_cells)).from_address(cache.data), np.uint8).reshape(n_cells, stride)
        before = self.format.dequantize(rows[cells])
        if masks.dtype == np.uint64:  # a fault model's changes: bits cleared (high half), then flipped
            changed = [(int(r), int(v), int(masks[r, v]) >> 32, int(masks[r, v]) & 0xFFFFFFFF) for r, v in zip(*np.nonzero(masks))]
            raw = rows[cells]
            note(land(self.format.layout, raw, changed, self.secded), masks.shape[1])
            rows[cells] = raw
        else:
            for r, value in zip(*np.nonzero(masks)):
                self.format.flip(rows[cells[r]], int(value), int(masks[r, value]))
        return site[0], before, self.format.dequantize(rows[cells])

    def check_written(self) -> None:
        """Every staged site was written by the decode."""
        if self._staged:
            missing = sorted(self._staged)[:4]
            raise InjectionError(f"this decode wrote no cache for {missing}, whose faults were drawn; was the decode larger than one ubatch?")

    def clear(self) -> None:
        self._staged.clear()
