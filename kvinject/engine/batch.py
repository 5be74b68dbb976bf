"""A llama_batch over arrays allocated once, each filled by one slice assignment per decode.

Setting each field of each entry through the struct's ctypes pointers (``batch.token[i] = t``,
``batch.seq_id[i][0] = s``) made a pointer object per access: for a generation step of 8
sequences, 40 accesses. Here the entries' columns go into plain ctypes arrays by slice, every
token in one sequence (``n_seq_id`` 1, ``seq_id[i]`` pointing at the i-th ``seq``)."""

from __future__ import annotations

import ctypes
from typing import Sequence

from llama_cpp import llama_cpp as ll


class Batch:
    """Room for ``n`` (token, position, sequence, want_logits) entries; ``struct`` is what llama_decode takes."""

    def __init__(self, n: int):
        self.size = n
        self._token = (ll.llama_token * n)()
        self._pos = (ll.llama_pos * n)()
        self._seq = (ll.llama_seq_id * n)()
        self._logits = (ctypes.c_int8 * n)()
        self._n_seq_id = (ctypes.c_int32 * n)(*[1] * n)
        seq_ptr = ctypes.POINTER(ll.llama_seq_id)
        first = ctypes.addressof(self._seq)
        self._seq_id = (seq_ptr * n)(*(ctypes.cast(first + i * ctypes.sizeof(ll.llama_seq_id), seq_ptr) for i in range(n)))
        self.struct = ll.llama_batch(
            n_tokens=0,
            token=self._token,
            pos=self._pos,
            n_seq_id=self._n_seq_id,
            seq_id=self._seq_id,
            logits=self._logits,
        )

    def fill(self, entries: Sequence[tuple[int, int, int, bool]]) -> None:
        n = len(entries)
        if n:
            self._token[:n], self._pos[:n], self._seq[:n], self._logits[:n] = zip(*entries)
        self.struct.n_tokens = n
