"""Each layer's queries before RoPE, read from llama.cpp's graph at every decode, for eviction
that scores by the queries' statistics (``expected``, kvpress's Expected Attention).

llama.cpp names a layer's query ``Qcur-<il>`` before RoPE and after it; the RoPE node's input is
the query before RoPE (after any query norm), shape (head dim, heads, rows). The compiled
callback claims those RoPE nodes and, as each is computed, copies its input into one (layers,
rows, heads x head dim) buffer (:func:`kvinject.engine.callback.graph_callback._copy_query`); this module
owns the buffer and reads it back.
"""

from __future__ import annotations

import numpy as np

from ...exceptions import ModelError
from ..callback import graph_header as gh


class Queries:
    """The (layers, rows, width) queries of one decode, wired into the hook's header."""

    def __init__(self, head: np.ndarray, n_layer: int, width: int):
        self._head, self.n_layer, self.width = head, n_layer, width
        self._copies = np.zeros(n_layer, np.int64)
        self._buffer = np.zeros(0, np.float32)
        head[gh.QUERY_WIDTH], head[gh.QUERY_LAYERS], head[gh.QUERY_COPIES] = width, n_layer, self._copies.ctypes.data

    def layout(self, rows: int) -> None:
        """Make room for a decode of ``rows`` batch rows."""
        if self._buffer.size < self.n_layer * rows * self.width:
            self._buffer = np.zeros(self.n_layer * rows * self.width, np.float32)
        self._head[gh.QUERY], self._head[gh.QUERY_CAP] = self._buffer.ctypes.data, rows
        self._copies[:] = 0

    def read(self) -> np.ndarray:
        rows = int(self._head[gh.QUERY_CAP])
        if (self._copies != 1).any():
            raise ModelError("this model's graph names no query RoPE 'Qcur-<il>' in every layer: kvinject cannot read its queries")
        return self._buffer[: self.n_layer * rows * self.width].reshape(self.n_layer, rows, self.width).copy()
