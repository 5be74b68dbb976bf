"""Read K and V back out of a llama context's cache, through llama.cpp's own state export.

The tests use it to measure what actually reached the cache. It understands the state of an
f32 cache with flash attention (V not transposed) of one sequence, which is all they need.
"""

from __future__ import annotations

import ctypes
import struct

import numpy as np
from llama_cpp import llama_cpp as ll

MAGIC = 0xAF143CD8
GGML_TYPE_F32 = 0


def read_cache(ctx, seq: int = 0) -> dict[tuple[str, int], np.ndarray]:
    """{(component, layer): array of shape (cells, row)} for sequence ``seq``."""
    size = ll.llama_state_seq_get_size(ctx._ptr, seq)
    buf = (ctypes.c_uint8 * size)()
    assert ll.llama_state_seq_get_data(ctx._ptr, buf, size, seq) == size
    data = bytes(buf)
    pos = 0

    def take(fmt: str):
        nonlocal pos
        values = struct.unpack_from("<" + fmt, data, pos)
        pos += struct.calcsize("<" + fmt)
        return values if len(values) > 1 else values[0]

    assert take("I") == MAGIC and take("i") == seq
    assert take("I") == 1, "one stream expected (kv_unified)"
    cells = take("I")
    for _ in range(cells):
        _pos, n_seq = take("iI")
        take(f"{n_seq}i")
    v_trans, n_layer = take("II")
    assert v_trans == 0, "V is transposed: use flash attention"
    out = {}
    for component in "kv":
        for layer in range(n_layer):
            typ, row_bytes = take("iQ")
            assert typ == GGML_TYPE_F32, "only an f32 cache can be read back exactly"
            rows = np.frombuffer(data, np.float32, cells * row_bytes // 4, pos).reshape(cells, -1)
            pos += cells * row_bytes
            out[component, layer] = rows.copy()
    assert pos == len(data), "unexpected trailing state data"
    return out
