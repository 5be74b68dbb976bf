"""The graph-evaluation callback llama.cpp calls for every node, compiled with numba.

llama.cpp asks the callback about each of the ~1000 nodes of a decode's graph. A Python
callback pays about a microsecond per node for ctypes alone, and numpy pays several passes
over every K/V value to perturb it and measure what it did; compiled, both cost almost
nothing next to the decode. This module holds the callback and the state it works on; the
plan it follows (which nodes to claim, what to change there) is learned and checked in
Python by :mod:`kvinject.engine.graph.hook`.

The state is one int64 array of fixed slots, the header (kvinject/engine/callback/graph_header.py
lays it out), which holds the addresses of the other tables: per-site rows (a site is the K or V of a layer: ``site = 2 * layer + is_v``),
the claim groups, the noise segments of the decode (runs of rows whose factors come from one
item's stream of kvinject/engine/variates.py), the rows and the components of a row that get the error
(``--positions``, ``--heads``) and the realized-error sums.
Multiplicative error models on host memory are applied here, their factors computed in the
same pass, with their realized-error sums, and so is rounding to a minifloat; in a CUDA
device's memory, the device kernel is launched from here through the driver
(kvinject/engine/callback/device_claims.py); anything else (other models, the first claim in device memory,
which sets the device path up) is handed back to a Python function, and so is
each cache write once computed where a model flips bits of the stored blocks. For
cache-resident models it records instead where each decode writes K and V in the cache
(:mod:`kvinject.engine.graph.cache_writes`), and for those that evict by attention it claims each layer's
attention weights and sums them (:mod:`kvinject.engine.graph.attention`), and where eviction keeps a token for some KV heads of a layer
and not others it claims each layer's attention logits and hides those cells from the others
(:mod:`kvinject.engine.graph.hidden`). To measure layer-wise divergence
it claims each layer's output, the residual stream, and copies it (:mod:`kvinject.engine.graph.residual_stream`).
"""

from __future__ import annotations

from dataclasses import fields

import numpy as np
from numba import carray, cfunc, njit, types

from .. import ggml, laws
from ..laws import ROUND
from ..realized_error import RealizedStats
from . import counter_rng, device_claims, device_launch, graph_memory, numba_cache, rounding
from . import graph_header as gh
from .counter_rng import factor, hash_at
from .device_claims import launched, wait
from .graph_memory import (
    _BUFFER,
    _DATA,
    _KQ,
    _NAME,
    _NE,
    _OP,
    _SRC,
    _TYPE,
    _VIEW_SRC,
    _f32,
    _f64,
    _ggml_test,
    _has_prefix,
    _i32,
    _i64,
    _is_soft_max,
    _l_out_layer,
    _layer,
    _python_apply,
    _python_written,
    _q_rope_layer,
    _tensor_get,
    _u8,
    _u32,
    _u64,
)
from .rounding import round_scaled, round_to, shared_scale

# The compiled pass reads graph_header's slots and inlines graph_memory's, rounding's, counter_rng's and
# device_claims' functions (and laws' kinds, device_launch's slots): cached, it depends on them too.
_INLINED = [gh, graph_memory, rounding, counter_rng, laws, device_claims, device_launch]
numba_cache.stamp_with(__file__, [module.__file__ for module in _INLINED])

# Realized-error sums per component, in RealizedStats' field order (written by _change).
N_SUMS = len(fields(RealizedStats))


@njit(cache=True)
def _site(head, t):
    """The site a node's name denotes (``<prefix>-<layer>``), or -1."""
    name = carray(_u8(t + _NAME), 16)
    prefix = carray(_u32(t + _NAME), 1)[0]
    if prefix == head[gh.PREFIX_K]:
        component = 0
    elif prefix == head[gh.PREFIX_V]:
        component = 1
    else:
        return -1
    start = 5
    if name[4] != 45:  # '-'
        if component != 0 or head[gh.PRE_ROPE] == 0 or name[4] != 95:  # '_': K's tagged names, before RoPE only
            return -1
        start = 0
        for i in range(5, 15):
            if name[i] == 45:
                start = i + 1
                break
            if name[i] != 95 and (name[i] < 97 or name[i] > 122):  # a tag of lower-case letters and '_'
                return -1
        if start == 0:
            return -1
    layer = _layer(name, start)
    site = 2 * layer + component
    return site if layer >= 0 and site < head[gh.N_SITES] else -1


@njit(cache=True)
def _fail(head, code, site, value):
    if head[gh.ERROR] == 0:  # the first error explains best
        head[gh.ERROR], head[gh.ERROR_SITE], head[gh.ERROR_VALUE] = code, site, value


@njit(cache=True)
def _ask(head, t):
    sites = carray(_i64(head[gh.SITES]), (head[gh.N_SITES], gh.SITE_COLUMNS))
    site = _site(head, t)
    if site >= 0 and sites[site, gh.WANTED] == 0:
        site = -1
    op = carray(_i32(t + _OP), 1)[0]
    if site != head[gh.RUN_SITE] or (site >= 0 and head[gh.PRE_ROPE] != 0 and op == ggml.GGML_OP_ROPE):
        if head[gh.RUN_SITE] >= 0:
            _end_run(head, sites)
        head[gh.RUN_SITE] = site
    if site < 0:  # in no run (sites[-1] would read the last site's row and claim nodes of its op)
        return 0
    head[gh.RUN_LAST] = t
    return 1 if sites[site, gh.GROUP_LEN] > 0 and sites[site, gh.FINAL_OP] == op else 0


@njit(cache=True)
def _end_run(head, sites):
    """A run of nodes named for ``site`` ended: at its claimed run (the last, or before RoPE),
    change what its claim changes."""
    site, last = head[gh.RUN_SITE], head[gh.RUN_LAST]
    head[gh.RUN_SITE] = -1
    sites[site, gh.SEEN] += 1
    seen = sites[site, gh.SEEN]
    if seen < sites[site, gh.CLAIM_RUN] or sites[site, gh.CLAIM_RUN] < seen <= sites[site, gh.N_RUNS]:
        return
    start, count = sites[site, gh.GROUP_START], sites[site, gh.GROUP_LEN]
    groups = carray(_i64(head[gh.GROUPS]), head[gh.N_SITES])
    bad = seen > sites[site, gh.N_RUNS]
    if count > 0 and head[gh.COMPUTED] != last:
        bad = True
    for g in range(start, start + count - 1):
        if sites[groups[g], gh.PENDING] == 0:
            bad = True
    if bad:
        _fail(head, gh.MISMATCH, site, 0)
        return
    if count == 0:  # changed at a later claim of its layer
        sites[site, gh.PENDING] = last
        return
    for g in range(start, start + count):
        s = groups[g]
        t = last if s == site else sites[s, gh.PENDING]
        sites[s, gh.PENDING] = 0
        _perturb(head, t, s)
        sites[s, gh.HITS] += 1
    if head[gh.DEVICE] != 0:
        err = wait(head)
        if err != 0:
            _fail(head, gh.SYNCHRONIZE_FAILED, site, err)
    if head[gh.N_QUEUED] > 0:  # one call into Python per claim (K and V together): each costs microseconds
        _python_apply(head[gh.PYTHON_APPLY], head[gh.N_QUEUED])
        head[gh.N_QUEUED] = 0


@njit(cache=True)
def _perturb(head, t, site):
    component = site & 1
    row = head[gh.ROW_K + component]
    ne = carray(_i64(t + _NE), 4)
    n = ne[0] * ne[1] * ne[2] * ne[3]
    ok = carray(_i32(t + _TYPE), 1)[0] == ggml.GGML_TYPE_F32 and _ggml_test(head[gh.IS_CONTIGUOUS], t) != 0
    if not ok:
        _fail(head, gh.NOT_F32, site, n)
        return
    if n != head[gh.ROWS] * row:
        _fail(head, gh.BAD_ROWS, site, n)
        return
    at = head[gh.AT]
    head[gh.AT] = at + row
    buffer = carray(_i64(t + _BUFFER), 1)[0]
    if head[gh.NATIVE] == 0 or _ggml_test(head[gh.IS_HOST], buffer) == 0:
        err = launched(head, t, component, n, at, buffer) if head[gh.DEVICE] != 0 else -1
        if err >= 0:
            if err > 0:
                _fail(head, gh.LAUNCH_FAILED, site, err)
            return
        queue = carray(_i64(head[gh.QUEUE]), (head[gh.N_SITES], 3))
        i = head[gh.N_QUEUED]
        queue[i, 0], queue[i, 1], queue[i, 2] = t, site, at
        head[gh.N_QUEUED] = i + 1
        return
    x = carray(_f32(carray(_i64(t + _DATA), 1)[0]), n)
    sums = carray(_f64(head[gh.SUMS]), (2, N_SUMS))[component]
    seg_key = carray(_u64(head[gh.SEG_KEY]), head[gh.N_SEG])
    seg_start = carray(_i64(head[gh.SEG_START]), head[gh.N_SEG])
    seg_rows = carray(_i64(head[gh.SEG_ROWS]), head[gh.N_SEG])
    law = carray(_f64(head[gh.LAW]), gh.LAW_SLOTS)
    mask = carray(_u8(head[gh.MASK]), head[gh.ROWS] if head[gh.MASK] != 0 else 0)
    columns = carray(_u8(head[gh.COLUMNS_K + component]), row if head[gh.COLUMNS_K + component] != 0 else 0)
    outside = carray(_f64(head[gh.OUTSIDE_SUMS]), (2, N_SUMS))[component]
    _change(x, row, at, seg_key, seg_start, seg_rows, law, mask, columns, sums, outside)


@njit(cache=True)
def _change(x, row, at, seg_key, seg_start, seg_rows, law, mask, columns, sums, outside):
    """x *= factor, row by row, or x rounded (``law``: a factor law, or ROUND, the format of
    kvinject/engine/callback/rounding.py and the size of an MX block, 0 for none); each segment's rows take
    their factors from their stream's values from ``seg_start + at * rows`` on, ``row`` per row
    (the layout of a block of ``rows * width`` values, sites one after another); and the
    realized-error sums of what changed. Rows that ``mask`` (when given) leaves out keep their values, and so do the
    components of a row that ``columns`` (when given) leaves out; they count in the sums as
    unchanged, and in ``outside`` too."""
    kind, a, b = np.int64(law[0]), np.float32(law[1]), np.float32(law[2])
    largest, nmant, minexp, block = law[1], np.int64(law[2]), np.int64(law[3]), np.int64(law[4])
    scale = 1.0
    changed = nonfinite = rel_n = flips = 0
    rel_sum = rel_sumsq = signal = noise = 0.0
    out_values = out_nonfinite = out_rel_n = 0
    out_signal = 0.0
    first = 0
    for k in range(len(seg_rows)):
        rows, key = seg_rows[k], seg_key[k]
        for j in range(rows):
            start = seg_start[k] + at * rows + j * row
            xs = x[(first + j) * row : (first + j + 1) * row]
            row_out = len(mask) > 0 and mask[first + j] == 0
            for c in range(row):
                before = xs[c]
                if block > 0 and c % block == 0:  # of the whole block, whatever --heads leaves out
                    scale = shared_scale(xs[c : c + block], largest)
                if row_out or (len(columns) > 0 and columns[c] == 0):  # what follows adds for a factor of 1
                    out_values += 1
                    if not np.isfinite(before):
                        nonfinite += 1
                        out_nonfinite += 1
                        continue
                    signal += np.float64(before) * np.float64(before)
                    out_signal += np.float64(before) * np.float64(before)
                    if before != 0:
                        rel_n += 1
                        out_rel_n += 1
                    continue
                if kind == ROUND and block > 0:
                    after = round_scaled(before, scale, largest, nmant, minexp)
                elif kind == ROUND:
                    after = round_to(before, largest, nmant, minexp)
                else:
                    after = before * factor(kind, a, b, hash_at(key, start + c))
                xs[c] = after
                if after != before and (after == after or before == before):  # a NaN left NaN is no change
                    changed += 1
                if not np.isfinite(after):
                    nonfinite += 1
                    continue
                d = np.float64(after) - np.float64(before)
                signal += np.float64(before) * np.float64(before)
                noise += d * d
                if before != 0:
                    rel = d / np.float64(before)
                    rel_n += 1
                    rel_sum += rel
                    rel_sumsq += rel * rel
                    if np.float64(after) * np.float64(before) < 0:
                        flips += 1
        first += rows
    sums[0] += len(x)
    sums[1] += 1
    sums[2] += changed
    sums[3] += nonfinite
    sums[4] += rel_n
    sums[5] += rel_sum
    sums[6] += rel_sumsq
    sums[7] += flips
    sums[8] += signal
    sums[9] += noise
    if len(mask) > 0 or len(columns) > 0:
        outside[0] += out_values
        outside[1] += 1
        outside[3] += out_nonfinite
        outside[4] += out_rel_n
        outside[8] += out_signal


@njit(cache=True)
def _record(head, t):
    """A cache write ``ggml_set_rows(cache, rows, index)``, a view of the cache tensor: note the
    tensor and where its index went. An index of one cell per batch row is copied now, once per
    decode: graph memory is reused after its last reader, so after the decode it may hold
    anything. Transposed V's index (one per element) is not copied: its cells are K's."""
    n = head[gh.N_WRITES]
    if n >= head[gh.WRITES_CAP]:
        _fail(head, gh.WRITES_OVERFLOW, -1, n)
        return
    index = carray(_i64(t + _SRC), 2)[1]
    ne = carray(_i64(index + _NE), 4)
    slot = -1
    if ne[0] * ne[1] * ne[2] * ne[3] == head[gh.ROWS]:
        if carray(_i32(index + _TYPE), 1)[0] != ggml.GGML_TYPE_I64:
            _fail(head, gh.BAD_INDEX, -1, n)
            return
        keys = carray(_i64(head[gh.INDEX_KEYS]), head[gh.INDEX_CAP])
        for s in range(head[gh.N_INDEX]):
            if keys[s] == index:
                slot = s
        if slot < 0:
            slot = head[gh.N_INDEX]
            if slot >= head[gh.INDEX_CAP]:
                _fail(head, gh.WRITES_OVERFLOW, -1, n)
                return
            keys[slot] = index
            head[gh.N_INDEX] = slot + 1
            nbytes = head[gh.ROWS] * 8
            _tensor_get(head[gh.TENSOR_GET], index, head[gh.INDEX_ROWS] + slot * nbytes, 0, nbytes)
    writes = carray(_i64(head[gh.WRITES]), (head[gh.WRITES_CAP], 2))
    view = carray(_i64(t + _VIEW_SRC), 1)[0]
    writes[n, 0] = view if view != 0 else t
    writes[n, 1] = slot
    head[gh.N_WRITES] = n + 1
    if head[gh.KQ_HIDDEN] != 0 and slot >= 0:
        _show_written(head, writes[n, 0], slot)


@njit(cache=True)
def _show_written(head, tensor, slot):
    """The cells a K cache write fills hold new tokens, hidden from no head: clear the layer's
    flags there before its attention logits are computed. A sliding-window layer gives a new token
    the cell of one that left its window, whose flags would otherwise pass to it."""
    caches = carray(_i64(head[gh.CACHE_K]), head[gh.CACHE_LAYERS])
    heads_kv, stride, rows = head[gh.KQ_HEADS_KV], head[gh.KQ_STRIDE], head[gh.ROWS]
    cells = carray(_i64(head[gh.INDEX_ROWS] + slot * rows * 8), rows)
    for layer in range(len(caches)):
        if caches[layer] == tensor:
            hidden = carray(_u8(head[gh.KQ_HIDDEN] + layer * heads_kv * stride), heads_kv * stride)
            for r in range(rows):
                if 0 <= cells[r] < stride:
                    for kv in range(heads_kv):
                        hidden[kv * stride + cells[r]] = 0


@njit(cache=True)
def _add_attention(head, t):
    """A layer's attention weights, (heads, rows, cells) with cells fastest: add their sum over
    heads to the decode's (rows, cells) sums."""
    ne = carray(_i64(t + _NE), 4)
    n_kv, rows, heads = ne[0], ne[1], ne[2]
    buffer = carray(_i64(t + _BUFFER), 1)[0]
    ok = carray(_i32(t + _TYPE), 1)[0] == ggml.GGML_TYPE_F32 and _ggml_test(head[gh.IS_CONTIGUOUS], t) != 0 and _ggml_test(head[gh.IS_HOST], buffer) != 0
    if not ok or rows != head[gh.ROWS] or ne[3] != 1 or n_kv > head[gh.ATTN_STRIDE]:
        _fail(head, gh.BAD_SOFT_MAX, -1, n_kv)
        return
    stride = head[gh.ATTN_STRIDE]
    x = carray(_f32(carray(_i64(t + _DATA), 1)[0]), heads * rows * n_kv)
    sums = carray(_f64(head[gh.ATTN]), rows * stride)
    for h in range(heads):
        for i in range(rows):
            for j in range(n_kv):
                sums[i * stride + j] += x[(h * rows + i) * n_kv + j]
    head[gh.N_ATTN] += 1
    head[gh.ATTN_N_KV] = max(head[gh.ATTN_N_KV], n_kv)
    head[gh.ATTN_HEADS] = heads


@njit(cache=True)
def _hide(head, t):
    """A layer's attention logits, (heads, rows, cells) with cells fastest: -inf wherever the
    table hides the cell from the query head's KV head, so that the soft max gives it no weight,
    as if the cell were not there."""
    ne = carray(_i64(t + _NE), 4)
    n_kv, rows, heads = ne[0], ne[1], ne[2]
    buffer = carray(_i64(t + _BUFFER), 1)[0]
    ok = carray(_i32(t + _TYPE), 1)[0] == ggml.GGML_TYPE_F32 and _ggml_test(head[gh.IS_CONTIGUOUS], t) != 0 and _ggml_test(head[gh.IS_HOST], buffer) != 0
    layer = _layer(carray(_u8(t + _NAME), 16), len(_KQ))
    heads_kv, stride = head[gh.KQ_HEADS_KV], head[gh.KQ_STRIDE]
    if not ok or ne[3] != 1 or n_kv > stride or layer < 0 or heads % heads_kv != 0:
        _fail(head, gh.BAD_SOFT_MAX, -1, n_kv)
        return
    x = carray(_f32(carray(_i64(t + _DATA), 1)[0]), heads * rows * n_kv)
    hidden = carray(_u8(head[gh.KQ_HIDDEN] + layer * heads_kv * stride), heads_kv * stride)
    cells = np.empty(n_kv, np.int64)
    for kv in range(heads_kv):
        n = 0
        for j in range(n_kv):
            if hidden[kv * stride + j] != 0:
                cells[n] = j
                n += 1
        for h in range(kv * (heads // heads_kv), (kv + 1) * (heads // heads_kv)):
            for i in range(rows):
                for c in range(n):
                    x[(h * rows + i) * n_kv + cells[c]] = -np.inf


@njit(cache=True)
def _copy_query(head, t, layer):
    """Copy the input of a layer's query RoPE, (head dim, heads, rows) f32, to the layer's slot of the query buffer."""
    q = carray(_i64(t + _SRC), 1)[0]
    ne = carray(_i64(q + _NE), 4)
    width, rows = head[gh.QUERY_WIDTH], head[gh.QUERY_CAP]
    ok = carray(_i32(q + _TYPE), 1)[0] == ggml.GGML_TYPE_F32 and _ggml_test(head[gh.IS_CONTIGUOUS], q) != 0
    copies = carray(_i64(head[gh.QUERY_COPIES]), head[gh.QUERY_LAYERS])
    if not ok or ne[0] * ne[1] != width or ne[2] != rows or ne[3] != 1 or layer >= head[gh.QUERY_LAYERS]:
        _fail(head, gh.BAD_SOFT_MAX, -1, ne[0] * ne[1])
        return
    _tensor_get(head[gh.TENSOR_GET], q, head[gh.QUERY] + layer * rows * width * 4, 0, rows * width * 4)
    copies[layer] += 1


@njit(cache=True)
def _copy_residual(head, t, layer):
    """Copy a computed layer output, (rows, n_embd) f32, to the layer's slot of the residual buffer."""
    table = carray(_i64(head[gh.RESID_TABLE]), (head[gh.RESID_LAYERS], 3))
    ne = carray(_i64(t + _NE), 4)
    rows, embd = head[gh.RESID_CAP], head[gh.RESID_EMBD]
    ok = carray(_i32(t + _TYPE), 1)[0] == ggml.GGML_TYPE_F32 and _ggml_test(head[gh.IS_CONTIGUOUS], t) != 0
    if not ok or ne[0] != embd or ne[1] > rows or ne[2] * ne[3] != 1 or layer >= head[gh.RESID_LAYERS]:
        if layer < head[gh.RESID_LAYERS]:
            table[layer, gh.RESID_BAD] = 1
        return
    _tensor_get(head[gh.TENSOR_GET], t, head[gh.RESID] + layer * rows * embd * 4, 0, ne[1] * embd * 4)  # host or device memory
    table[layer, gh.RESID_ROWS] = ne[1]
    table[layer, gh.RESID_COPIES] += 1


@cfunc(types.uint8(types.int64, types.uint8, types.int64), cache=True)
def callback(t, ask, user_data):
    head = carray(_i64(user_data), gh.HEADER)
    if ask == 0:
        if head[gh.WRITTEN] != 0 and carray(_i32(t + _OP), 1)[0] == ggml.GGML_OP_SET_ROWS:
            _python_written(head[gh.WRITTEN], t)
        if head[gh.KQ_HIDDEN] != 0 and _has_prefix(t, _KQ):
            _hide(head, t)
        if head[gh.ATTN] != 0 and _is_soft_max(t):
            _add_attention(head, t)
        if head[gh.RESID] != 0:
            layer = _l_out_layer(t)
            if layer >= 0:
                _copy_residual(head, t, layer)
        if head[gh.QUERY] != 0:
            layer = _q_rope_layer(t)
            if layer >= 0:
                _copy_query(head, t, layer)
        head[gh.COMPUTED] = t
        head[gh.CLAIMS] += 1
        return 1
    if head[gh.MODE] == gh.LEARN:  # record every node, claim none
        n = head[gh.N_LEARNED]
        if n < head[gh.LEARN_CAP]:
            carray(_i64(head[gh.LEARNED]), head[gh.LEARN_CAP])[n] = t
        else:
            _fail(head, gh.LEARN_OVERFLOW, -1, n)
        head[gh.N_LEARNED] = n + 1
        return 0
    if head[gh.WRITES_CAP] > 0 and carray(_i32(t + _OP), 1)[0] == ggml.GGML_OP_SET_ROWS:
        _record(head, t)
    if head[gh.ATTN] != 0 and _is_soft_max(t):  # claimed: its weights are summed once computed
        return 1
    if head[gh.KQ_HIDDEN] != 0 and _has_prefix(t, _KQ):  # claimed: hidden cells are set to -inf once computed
        return 1
    claimed = _ask(head, t)
    if claimed == 0 and head[gh.RESID] != 0 and _l_out_layer(t) >= 0:  # claimed: copied once computed
        return 1
    if claimed == 0 and head[gh.QUERY] != 0 and _q_rope_layer(t) >= 0:  # claimed: its input copied once computed
        return 1
    if claimed == 0 and head[gh.WRITTEN] != 0 and carray(_i32(t + _OP), 1)[0] == ggml.GGML_OP_SET_ROWS:  # after _ask, which changes what it writes
        return 1
    return claimed


def prefix(name: bytes) -> int:
    """The first four bytes of a node name as the callback compares them."""
    return int(np.frombuffer(name[:4].ljust(4, b"\0"), np.uint32)[0])
