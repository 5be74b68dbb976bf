"""Read K and V back out of a llama context's cache, through llama.cpp's own state export.

The tests use it to measure what actually reached the cache. It understands the state of one
sequence of an f32, f16 or bf16 cache, V transposed (flash attention off) or not, and gives a
q8_0 or q4_0 cache's rows as their bytes.
"""

from __future__ import annotations

import ctypes
import struct

import numpy as np
from llama_cpp import llama_cpp as ll

from kvinject.engine import ggml

MAGIC = 0xAF143CD8
DTYPES = {0: np.float32, 1: np.float16, 30: np.uint16}  # ggml types an exact float32 copy can be read from (30: bf16)
BLOCKS = {8: "q8_0", 2: "q4_0"}  # quantized types read as bytes


def read_cache(ctx, seq: int = 0) -> dict[tuple[str, int], np.ndarray]:
    """{(component, layer): float32 array of shape (cells, row)} for sequence ``seq``, cells in cache
    order (a quantized cache: uint8 (cells, row bytes))."""
    return read_cells(ctx, seq)[1]


def read_cells(ctx, seq: int = 0) -> tuple[np.ndarray, dict[tuple[str, int], np.ndarray]]:
    """The position of each of ``seq``'s cells, in cache order, and :func:`read_cache`'s arrays."""
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
    streams = take("I")  # one, or with a stream per sequence all of them, each but the sequence's empty
    while (cells := take("I")) == 0 and streams > 1:
        streams -= 1
    positions = []
    for _ in range(cells):
        cell_pos, n_seq = take("iI")
        positions.append(cell_pos)
        take(f"{n_seq}i")
    v_trans, n_layer = take("II")
    out = {}
    for component in "kv":
        for layer in range(n_layer):
            transposed = component == "v" and v_trans  # one row per component: type, element size, components
            typ, size = take("iI" if transposed else "iQ")  # element or row size
            if typ in BLOCKS and not transposed:
                out[component, layer] = np.frombuffer(data, np.uint8, cells * size, pos).reshape(cells, size)
                pos += cells * size
                continue
            assert typ in DTYPES, "only an f32, f16 or bf16 cache can be read back exactly, q8_0 and q4_0 as bytes"
            shape = (take("I"), cells) if transposed else (cells, size // np.dtype(DTYPES[typ]).itemsize)
            rows = np.frombuffer(data, DTYPES[typ], shape[0] * shape[1], pos).reshape(shape)
            pos += rows.nbytes
            if typ == 30:  # bf16: the high half of a float32
                rows = (rows.astype(np.uint32) << 16).view(np.float32)
            out[component, layer] = (rows.T if component == "v" and v_trans else rows).astype(np.float32)
    assert data[pos:] == b"\0" * (len(data) - pos) and len(data) - pos == 4 * (streams - 1), "unexpected trailing state data"
    return np.array(positions), out


def replica_context(model, callback, n_ctx: int, n_batch: int, n_seq: int = 1) -> int:
    """A llama context as the tests' checked ones are made (f32 cache, flash attention off,
    unified cells) with the test's own graph callback (keep it alive): its pointer."""
    params = ll.llama_context_default_params()
    params.n_ctx, params.n_batch, params.n_ubatch, params.n_seq_max = n_ctx, n_batch, n_batch, n_seq
    params.kv_unified, params.no_perf = True, True
    params.type_k = params.type_v = ggml.GGML_TYPE_F32
    params.flash_attn_type = 0
    params.n_threads = params.n_threads_batch = model.backend.n_threads
    params.cb_eval, params.cb_eval_user_data = callback, None
    return ll.llama_init_from_model(model.ptr, params)
