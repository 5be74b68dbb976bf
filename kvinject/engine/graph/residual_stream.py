"""Each layer's output, the residual stream, read from llama.cpp's graph at every decode.

llama.cpp names the output of layer ``il`` (the residual stream after its attention and FFN)
``l_out-<il>``, shape (n_embd, rows). The compiled callback claims those nodes and, as each is
computed, copies it into one (layers, rows, n_embd) buffer
(:func:`kvinject.engine.callback.graph_callback._copy_residual`); this module owns the buffer and reads it
back. Each claim splits the graph, one synchronization per layer: a context reads the residual
stream only when asked (``Context(..., residual=True)``), and values are unchanged by it.

Before the last layer llama.cpp keeps only the rows whose logits are wanted
(``inp_out_ids``), so the last layer's output exists only at those positions: elsewhere it
reads as NaN. A context with a K/V hook shares the hook's callback state; one without gets a
state of its own that claims no K/V.
"""

from __future__ import annotations

import ctypes

import numpy as np
from llama_cpp import llama_cpp as ll

from ...exceptions import InjectionError, ModelError
from .. import ggml
from ..callback import graph_callback
from ..callback import graph_header as gh


class ResidualStream:
    """The (layers, rows, n_embd) outputs of one decode. ``head``: the K/V hook's callback state
    to share; None gives a state of its own, with ``callback`` and ``user_data`` to install."""

    def __init__(self, n_layer: int, n_embd: int, head: np.ndarray | None = None):
        self.n_layer, self.n_embd = n_layer, n_embd
        self.callback = self.user_data = None
        if head is None:
            head = self._own_state(n_layer)
            self.callback = ll.ggml_backend_sched_eval_callback(graph_callback.callback.address)
            self.user_data = ctypes.c_void_p(head.ctypes.data)
        self._head = head
        self._table = np.zeros((n_layer, gh.RESID_COLUMNS), np.int64)
        self._buffer = np.zeros(0, np.float32)
        self._outputs = np.zeros(0, bool)
        head[gh.RESID_TABLE], head[gh.RESID_LAYERS], head[gh.RESID_EMBD] = self._table.ctypes.data, n_layer, n_embd
        head[gh.TENSOR_GET] = ctypes.cast(ggml.lib().ggml_backend_tensor_get, ctypes.c_void_p).value
        head[gh.IS_CONTIGUOUS] = ctypes.cast(ggml.lib().ggml_is_contiguous, ctypes.c_void_p).value

    def _own_state(self, n_layer: int) -> np.ndarray:
        """A callback state that claims no K/V: every site unwanted (tables kept alive here)."""
        self._sites = np.zeros((2 * n_layer, gh.SITE_COLUMNS), np.int64)
        self._groups = np.zeros(2 * n_layer, np.int64)
        head = np.zeros(gh.HEADER, np.int64)
        head[gh.RUN_SITE] = -1
        head[gh.N_SITES], head[gh.SITES], head[gh.GROUPS] = 2 * n_layer, self._sites.ctypes.data, self._groups.ctypes.data
        return head

    def layout(self, outputs: np.ndarray) -> None:
        """Announce a decode whose batch rows ask for logits where ``outputs`` is True."""
        rows = len(outputs)
        size = self.n_layer * rows * self.n_embd
        if self._buffer.size < size or self._head[gh.RESID_CAP] != rows:
            if self._buffer.size < size:
                self._buffer = np.zeros(size, np.float32)
            self._head[gh.RESID], self._head[gh.RESID_CAP] = self._buffer.ctypes.data, rows
        self._table[:] = 0
        self._outputs = np.asarray(outputs, bool)

    def read(self) -> np.ndarray:
        """The decode's outputs, (layers, rows, n_embd), a copy; a layer computed only at the
        rows that ask for logits (the last) is NaN at the others."""
        rows, n_out = len(self._outputs), int(self._outputs.sum())
        copies, computed = self._table[:, gh.RESID_COPIES], self._table[:, gh.RESID_ROWS]
        if not copies.any():
            raise ModelError("this model's graph names no layer output 'l_out-<il>': kvinject cannot read its residual stream")
        bad = np.flatnonzero(self._table[:, gh.RESID_BAD])
        if len(bad):
            raise ModelError(f"the output of layer {bad[0]} is not a contiguous f32 tensor of {self.n_embd}-wide rows; kvinject cannot read it")
        if (copies != 1).any() or not np.isin(computed, (rows, n_out)).all():
            layer = int(np.flatnonzero((copies != 1) | ~np.isin(computed, (rows, n_out)))[0])
            raise InjectionError(
                f"layer {layer}'s output was read {copies[layer]} times with {computed[layer]} rows in a decode of {rows} rows "
                f"({n_out} with logits); expected once, with every row or those with logits"
            )
        buffer = self._buffer[: self.n_layer * rows * self.n_embd].reshape(self.n_layer, rows, self.n_embd)
        out = buffer.copy()
        for layer in np.flatnonzero(computed != rows).tolist():  # only the rows with logits, in batch order
            out[layer] = np.nan
            out[layer, self._outputs] = buffer[layer, :n_out]
        return out
