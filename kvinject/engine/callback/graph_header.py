"""The contract between Python and the compiled graph callback: the layout of its state.

The callback (kvinject/engine/callback/graph_callback.py) works on one int64 array of HEADER slots, the
header, shared with the Python side that fills it before a decode and reads it after
(kvinject/engine/graph/hook.py and the modules that lend it tables: cache_writes, attention, hidden,
queries, residual, device). A slot holds one of four kinds of value:

- **array**: the ``ctypes.data`` of a numpy array its writer keeps alive (0: none), of the
  element type named below; the callback views it with numba's ``carray``;
- **count**: rows, entries or layers (``*_CAP``: what an array holds);
- **code**: a flag or a small number (MODE, ERROR, NATIVE, PRE_ROPE);
- **function**: a C function's address (ggml's, or a ctypes callback into Python);
- **node**: a ggml tensor's address.

Numba compiles the callback with these constants folded in, so they are plain ints, grouped
below with who writes each slot (P: Python before the decode, C: the callback during it).
"""

# The decode: MODE (code, P: RUN or LEARN), RUN_SITE (C: the site whose claim run is open, -1:
# none) and RUN_LAST (node, C: its last node), COMPUTED (node, C: the last one computed),
# ERROR/ERROR_SITE/ERROR_VALUE (C: the first error met, a code below, and where).
MODE, RUN_SITE, RUN_LAST, COMPUTED, ERROR, ERROR_SITE, ERROR_VALUE = range(7)
# Noise segments (P): AT (count: components of a row drawn by the claims before, where the next
# one's noise starts; C advances it), ROWS (count: batch rows), SEG_KEY (array, uint64 per segment: its stream's key), N_SEG (count), SEG_START (array,
# int64: each segment's first value in its stream), SEG_ROWS (array, int64: its rows).
AT, ROWS, SEG_KEY, N_SEG, SEG_START, SEG_ROWS = range(7, 13)
# The plan (P): N_SITES (count: 2 x layers), SITES (array, int64, SITE_COLUMNS a site), GROUPS
# (array, int64: the sites claimed together), SUMS (array, float64: realized-error sums, two
# components of graph_callback.N_SUMS); LEARNED (array, int64: the nodes LEARN mode met),
# N_LEARNED (C), LEARN_CAP (count).
N_SITES, SITES, GROUPS, SUMS, LEARNED, N_LEARNED, LEARN_CAP = range(13, 20)
# PYTHON_APPLY (function: the changes left to Python), IS_HOST/IS_CONTIGUOUS (functions: ggml's
# tests of a tensor), NATIVE (code: the callback applies LAW itself), ROW_K/ROW_V (count:
# components of a row), PREFIX_K/PREFIX_V (the first four bytes of K's and V's node names, as
# a uint32).
PYTHON_APPLY, IS_HOST, IS_CONTIGUOUS, NATIVE, ROW_K, ROW_V, PREFIX_K, PREFIX_V = range(20, 28)
# Cache writes (kvinject/engine/graph/cache_writes.py): WRITES (array, int64 (cache tensor, index
# slot) pairs), WRITES_CAP (count), N_WRITES (C); INDEX_KEYS (array, int64: the index tensors
# met), INDEX_ROWS (array, int64: their rows, copied), INDEX_CAP (count), N_INDEX (C);
# TENSOR_GET (function: ggml_backend_tensor_get, which copies from host or device memory).
WRITES, WRITES_CAP, N_WRITES, INDEX_KEYS, INDEX_ROWS, INDEX_CAP, N_INDEX, TENSOR_GET = range(28, 36)
# Attention sums (kvinject/engine/graph/attention.py): ATTN (array, float64: a row of ATTN_STRIDE
# cells per batch row; 0: not read), ATTN_STRIDE (count), and C's N_ATTN (soft max nodes summed),
# ATTN_N_KV (the most cells one covered) and ATTN_HEADS (its heads).
ATTN, ATTN_STRIDE, N_ATTN, ATTN_N_KV, ATTN_HEADS = range(36, 41)
# --positions: MASK (array, uint8 per batch row: gets the error; 0: all rows), OUTSIDE_SUMS
# (array, float64: the sums of the values left out, as SUMS).
MASK, OUTSIDE_SUMS = range(41, 43)
# LAW (array, float64 of LAW_SLOTS: a factor law (kind, a, b) of kvinject/engine/variates.py or
# a rounding of kvinject/engine/callback/rounding.py); PRE_ROPE (code: K claimed before RoPE, whose names
# may carry a tag, Kcur_normed-<il>); CLAIMS (C: claimed nodes computed, each a graph split).
LAW, PRE_ROPE, CLAIMS = range(43, 46)
# Each layer's output (kvinject/engine/graph/residual_stream.py): RESID (array, float32: RESID_CAP rows of
# RESID_EMBD per layer; 0: not read), RESID_CAP, RESID_EMBD, RESID_LAYERS (counts), RESID_TABLE
# (array, int64: RESID_COLUMNS a layer).
RESID, RESID_CAP, RESID_EMBD, RESID_LAYERS, RESID_TABLE = range(46, 51)
# QUEUE (array, int64 (tensor, site, at) triples: a claim's changes left to Python), N_QUEUED (C).
QUEUE, N_QUEUED = range(51, 53)
# --heads: COLUMNS_K/COLUMNS_V (array, uint8 per component of a row: gets the error; 0: all).
COLUMNS_K, COLUMNS_V = range(53, 55)
# WRITTEN (function: called with each cache write once computed, for faults in quantized blocks; 0: none).
WRITTEN = 55
# Cells hidden from a layer's KV head (kvinject/engine/graph/hidden.py): KQ_HIDDEN (array, uint8 per
# layer, KV head and cell; 0: none hidden), KQ_STRIDE (count: cells), KQ_HEADS_KV (count).
KQ_HIDDEN, KQ_STRIDE, KQ_HEADS_KV = range(56, 59)
# Each layer's Q before RoPE (kvinject/engine/graph/queries.py): QUERY (array, float32: QUERY_CAP rows
# of QUERY_WIDTH per layer; 0: not read), QUERY_CAP, QUERY_WIDTH, QUERY_LAYERS (counts),
# QUERY_COPIES (array, int64 per layer: copies made, C).
QUERY, QUERY_CAP, QUERY_WIDTH, QUERY_LAYERS, QUERY_COPIES = range(59, 64)
# CACHE_K (array, int64 per layer: its K cache tensor, learned by cache_writes; 0: not yet),
# CACHE_LAYERS (count): which layer a cache write is for, so that the cells it writes are hidden
# from no head from then on (a new token in them).
CACHE_K, CACHE_LAYERS = range(64, 66)
# DEVICE (array, int64 of DEVICE_SLOTS: how the callback launches the device kernel at a claim,
# kvinject/engine/gpu/device.py's ClaimTable; 0: claims in device memory go to Python), BUFFER_NAME
# (function: ggml_backend_buffer_name, which tells the first CUDA device's memory).
DEVICE, BUFFER_NAME = range(66, 68)
HEADER = 68
LAW_SLOTS = 5

# DEVICE's slots (P, but for D_COUNTS and D_PENDING): D_LAUNCH/D_SYNCHRONIZE (functions:
# cuLaunchKernel, cuStreamSynchronize), D_FUNCTION/D_STREAM (the kernel's CUfunction and its
# stream), D_SLOTS_K/V (array, int64: a component's parameter slots; 0: its claims go to Python),
# D_POINTERS_K/V (array, int64: the slots' addresses, the launch's kernelParams), D_X (count: the
# tensor's first slot), D_AT (count: the slot of where its noise starts), D_SPAN/D_THREADS (counts:
# values a thread, threads a block), D_COUNTS (array, int64 (component, values/sites): C adds what
# it launched on), D_PENDING (C: launched since the last synchronization).
D_LAUNCH, D_SYNCHRONIZE, D_FUNCTION, D_STREAM, D_SLOTS_K, D_SLOTS_V, D_POINTERS_K, D_POINTERS_V = range(8)
D_X, D_AT, D_SPAN, D_THREADS, D_COUNTS, D_PENDING = range(8, 14)
DEVICE_SLOTS = 14

# MODE's values.
RUN, LEARN = 0, 1

# SITES' columns, per site: the plan, then what one decode did (from SEEN on).
WANTED, N_RUNS, CLAIM_RUN, FINAL_OP, GROUP_START, GROUP_LEN, SEEN, PENDING, HITS = range(9)
SITE_COLUMNS = 9

# RESID_TABLE's columns, per layer: rows copied, copies this decode, a copy refused (not f32 rows of RESID_EMBD).
RESID_ROWS, RESID_COPIES, RESID_BAD = range(3)
RESID_COLUMNS = 3

# ERROR's codes, turned into exceptions by the hook after the decode.
MISMATCH, NOT_F32, BAD_ROWS, LEARN_OVERFLOW, WRITES_OVERFLOW, BAD_INDEX, BAD_SOFT_MAX = 1, 2, 3, 4, 5, 6, 7
LAUNCH_FAILED, SYNCHRONIZE_FAILED = 8, 9  # ERROR_VALUE: the CUresult
