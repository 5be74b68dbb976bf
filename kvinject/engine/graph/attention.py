"""The attention weights of each decode, read from llama.cpp's graph, for eviction by attention.

With flash attention off, llama.cpp computes each layer's attention weights as a node of its
own, ``kq_soft_max-<il>`` (src/llama-graph.cpp, ``build_attn_mha``): shape (cells, rows,
heads), the weight of each cache cell (``0 .. n_kv``, the cells every sequence shares) for each
batch row and query head, zero where the mask hides a cell. The compiled callback claims those
nodes and, as each is computed, adds its sum over heads to one (rows, cells) table
(:func:`kvinject.engine.callback.graph_callback._add_attention`); this module owns the table and reads it back
as the mean over layers and heads. Summing as the graph runs costs one pass over weights
llama.cpp has just written, instead of recomputing them from Q and K.
"""

from __future__ import annotations

import numpy as np

from ...exceptions import InjectionError
from ..callback import graph_header as gh


class AttentionSums:
    """The (rows, cells) table the compiled callback sums attention weights into, wired into the
    hook's header; ``n_cells`` bounds the cells a graph attends over (the context's size)."""

    def __init__(self, head: np.ndarray, n_cells: int):
        self._head = head
        self._sums = np.zeros(0, np.float64)
        head[gh.ATTN_STRIDE] = n_cells

    def layout(self, rows: int) -> None:
        """Make room for a decode of ``rows`` batch rows."""
        head = self._head
        if self._sums.size < rows * head[gh.ATTN_STRIDE]:
            self._sums = np.zeros(rows * head[gh.ATTN_STRIDE], np.float64)
            head[gh.ATTN] = self._sums.ctypes.data

    def read(self, n_layer: int) -> np.ndarray:
        """This decode's attention, (rows, cells): each row's weight on each cell, the mean over
        the ``n_layer`` layers and their query heads."""
        head = self._head
        if head[gh.N_ATTN] != n_layer:
            raise InjectionError(
                f"eviction by attention reads every layer's attention weights from the graph, and this decode computed {int(head[gh.N_ATTN])} "
                f"of {n_layer}: run with --flash-attn off"
            )
        return self._table()[:, : head[gh.ATTN_N_KV]] / (n_layer * head[gh.ATTN_HEADS])

    def _table(self) -> np.ndarray:
        rows, stride = int(self._head[gh.ROWS]), int(self._head[gh.ATTN_STRIDE])
        return self._sums[: rows * stride].reshape(rows, stride)

    def reset(self) -> None:
        """Clear what the decode summed (read or aborted)."""
        self._table()[:, : self._head[gh.ATTN_N_KV]] = 0
        self._head[[gh.N_ATTN, gh.ATTN_N_KV]] = 0
