"""Where each decode wrote K and V in llama.cpp's cache: the cell of every batch row, per layer.

llama.cpp stores a decode's K and V with one ``ggml_set_rows(cache, rows, index)`` node per
cache tensor (src/llama-kv-cache.cpp, ``cpy_k``/``cpy_v``): a view of ``cache_k_l<il>`` or
``cache_v_l<il>`` whose index tensor holds, for each batch row, the cache row it goes to
(``set_input_k_idxs``). The compiled callback (:func:`kvinject.engine.callback.graph_callback._record`) notes
every such node of a decode and copies its index while the graph runs; this module reads that
back after the decode. With flash attention off V is stored transposed and its index addresses
single elements (``set_input_v_idxs``); K and V of a layer share their cells, so the cells are
always taken from K's index.
"""

from __future__ import annotations

import ctypes
import re
from dataclasses import dataclass

import numpy as np

from ...exceptions import InjectionError
from .. import ggml
from ..callback import graph_header as gh

INDEX_CAPACITY = 16  # distinct index tensors per decode (one per cache and component, more if split across devices)
_CACHE_NAME = re.compile(rb"cache_\w*?([kv])_l(\d+)$")


def cache_site(name: bytes) -> tuple[str, int] | None:
    """(component, layer) of a cache tensor by its name, or None for another tensor."""
    match = _CACHE_NAME.match(name)
    return (match[1].decode(), int(match[2])) if match else None


@dataclass(frozen=True)
class Writes:
    """One decode's cache writes."""

    cells: np.ndarray  # (layers, rows): the cell each batch row went to in each layer's cache, -1 where unknown
    counts: dict[tuple[str, int], int]  # (component, layer) -> cache writes in the decode
    attention: np.ndarray | None = None  # (rows, cells): each row's mean attention weight on each cell, when read (kvinject/engine/graph/attention.py)
    queries: np.ndarray | None = None  # (layers, rows, heads x head dim): each layer's queries before RoPE, when read (kvinject/engine/graph/queries.py)

    def check(self, expected: set[tuple[str, int]]) -> None:
        """Every targeted cache tensor written exactly once by the decode."""
        wrong = sorted(site for site in expected if self.counts.get(site, 0) != 1)
        if wrong:
            raise InjectionError(
                f"this decode wrote {len(expected) - len(wrong)} of the {len(expected)} targeted K/V caches once "
                f"(not e.g. {wrong[:4]}); was the decode larger than one ubatch?"
            )


class CacheWrites:
    """The tables the compiled callback records cache writes in, wired into the hook's header."""

    def __init__(self, head: np.ndarray, n_layer: int):
        self._head = head
        self._n_layer = n_layer
        self._table = np.zeros((8 * n_layer + 64, 2), np.int64)  # (cache tensor, index slot) per write
        self._keys = np.zeros(INDEX_CAPACITY, np.int64)
        self._rows = np.zeros(0, np.int64)
        self._sites: dict[int, tuple[str, int] | None] = {}  # cache tensors live as long as the context
        self.tensors: dict[tuple[str, int], tuple[int, bool]] = {}  # (component, layer) -> (cache tensor, transposed), once learned
        self._k = np.zeros(n_layer, np.int64)  # each layer's K cache tensor, for the callback
        head[gh.CACHE_K], head[gh.CACHE_LAYERS] = self._k.ctypes.data, n_layer
        head[gh.WRITES], head[gh.WRITES_CAP] = self._table.ctypes.data, len(self._table)
        head[gh.INDEX_KEYS], head[gh.INDEX_CAP] = self._keys.ctypes.data, INDEX_CAPACITY
        head[gh.TENSOR_GET] = ctypes.cast(ggml.lib().ggml_backend_tensor_get, ctypes.c_void_p).value

    def layout(self, rows: int) -> None:
        """Make room for the indices of a decode of ``rows`` batch rows."""
        if self._rows.size < INDEX_CAPACITY * rows:
            self._rows = np.zeros(INDEX_CAPACITY * rows, np.int64)
            self._head[gh.INDEX_ROWS] = self._rows.ctypes.data

    def read(self) -> Writes:
        head = self._head
        rows = int(head[gh.ROWS])
        index = self._rows[: INDEX_CAPACITY * rows].reshape(INDEX_CAPACITY, rows)
        cells = np.full((self._n_layer, rows), -1, np.int64)
        counts = {}
        for tensor, slot in self._table[: head[gh.N_WRITES]].tolist():
            site = self._site(tensor)
            if site is None:
                continue
            counts[site] = counts.get(site, 0) + 1
            if site[0] == "k" and slot >= 0:
                cells[site[1]] = index[slot]
        return Writes(cells, counts)

    def learn(self, nodes: list[int]) -> None:
        """Note the cache tensors a learning decode of one token writes (:attr:`tensors`), so that
        they may be read before any decode of the hook's own: a sequence restored from a snapshot."""
        for ptr in nodes:
            t = ggml.tensor(ptr)
            if t.op != ggml.GGML_OP_SET_ROWS:
                continue
            tensor = t.view_src or ptr
            site = self._site(tensor)
            if site is not None:  # a transposed V's index names each element of the token's row
                self.tensors[site] = (tensor, ggml.numel(ggml.tensor(t.src[1])) > 1)
                if site[0] == "k" and site[1] < self._n_layer:
                    self._k[site[1]] = tensor

    def _site(self, tensor: int) -> tuple[str, int] | None:
        if tensor not in self._sites:
            self._sites[tensor] = cache_site(ggml.tensor(tensor).name)
        return self._sites[tensor]

    def reset(self) -> None:
        self._head[[gh.N_WRITES, gh.N_INDEX]] = 0
