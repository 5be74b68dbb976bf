"""Cells hidden from some KV heads of a layer: eviction that keeps a token for some heads and not
others (kvpress's AdaKV and PyramidKV choose per head and per layer), where llama.cpp holds a
token in one cell for every layer and head.

A cell that no layer and head keeps is removed from the cache; one that some keep stays, and the
others do not see it: the compiled callback claims each layer's attention logits (``kq-<il>``,
flash attention off) and sets them to -inf at the cells this table hides from the query head's
KV head (:func:`kvinject.engine.callback.graph_callback._hide`), so that the soft max gives them no weight,
as kvpress masks pruned pairs in attention (``attention_patch.py``). The cells stay in memory; the
kept share of each layer and head is what bits per element count. A cell a decode writes holds a
new token, hidden from no head: the callback clears its flags in the layer as the layer's K is
written (:func:`kvinject.engine.callback.graph_callback._show_written`), since a sliding-window layer gives
a new token the cell of one that left its window.
"""

from __future__ import annotations

import numpy as np

from ..callback import graph_header as gh


class HiddenCells:
    """The (layers, KV heads, cells) table of cells hidden from a layer's KV head, wired into the hook's header."""

    def __init__(self, head: np.ndarray, n_layer: int, n_head_kv: int, n_cells: int):
        self.table = np.zeros((n_layer, n_head_kv, n_cells), np.uint8)
        head[gh.KQ_HIDDEN], head[gh.KQ_STRIDE], head[gh.KQ_HEADS_KV] = self.table.ctypes.data, n_cells, n_head_kv

    def hide(self, layer: int, kv_head: int, cells: np.ndarray) -> None:
        self.table[layer, kv_head, cells] = 1

    def show(self, layers: np.ndarray, cells: np.ndarray) -> None:
        """Hide ``cells[i]`` of ``layers[i]`` from no head: the tokens that held them left the cache."""
        self.table[layers[:, None], :, cells] = 0
