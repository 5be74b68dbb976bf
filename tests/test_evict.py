"""Eviction against real llama.cpp: after every decode, the positions each sequence still has in
the cache (read back through llama.cpp's state export) must be exactly those a literal
implementation of the method keeps.

The attention-based methods are checked against attention computed here, in numpy, from Q and K
read independently of kvinject: a replica context decodes the same batches with a Python graph
callback that copies each layer's Q (``Qcur-<il>``, after RoPE), its K comes from the state
export, and the replica evicts what the checked context evicted, so both caches stay equal (their
logits are compared at every step). The references follow the methods' code (kvpress
StreamingLLMPress, TOVAPress, SnapKVPress; FMInference/H2O H2OKVCache_LayerWise) with one kept set
for all heads and layers, as llama.cpp's cells demand.
"""

from __future__ import annotations

import ctypes
import math
import re
from dataclasses import fields
from fractions import Fraction

import numpy as np
import pytest
from llama_cpp import llama_cpp as ll

from kvinject.benchmarks import BENCHMARKS
from kvinject.engine import ggml
from kvinject.engine.cache_bits import cache_bits
from kvinject.engine.context import Context
from kvinject.engine.generation.batching import generate_all
from kvinject.engine.options import CacheOptions
from kvinject.engine.target import Target
from kvinject.error_models import parse_error
from kvinject.error_models.configuration import Configuration
from kvinject.error_models.evict import Evict
from kvinject.error_models.eviction import METHODS
from kvinject.exceptions import SpecError

from .cache_state import read_cells, replica_context
from .tiny_model import HEAD_DIM, N_HEAD_KV

PROMPTS = [
    "The quick brown fox jumps over the lazy dog while the cat watches",
    "Rivers carry sediment from the mountains to the sea",
    "A short one",
]
OFF = CacheOptions("f32", "f32", "off")
N_CTX = 256


def later_first(scores: dict[int, float], k: int) -> set[int]:
    """The ``k`` positions of highest score; among equal scores the later position."""
    return set(sorted(scores, key=lambda p: (-scores[p], -p))[: max(k, 0)])


def budget(spec: str, n: int) -> int:
    """B(n): a ratio (with a decimal point) of the n tokens, at least 1, or a number of tokens."""
    text = spec.split(",")[1]
    return min(n, int(text)) if "." not in text else max(1, math.floor(n * Fraction(text)))


class Replica:
    """A llama context like the checked one (f32 cache, flash attention off, unified cells), whose
    graph callback copies each layer's final Q."""

    def __init__(self, model, n_seq: int, n_batch: int):
        self.model, self.q = model, {}
        self._callback = ll.ggml_backend_sched_eval_callback(self._watch)
        self._ptr = replica_context(model, self._callback, N_CTX, n_batch, n_seq)
        self._batch = ll.llama_batch_init(n_batch, 0, n_seq)

    def _watch(self, t, ask, user_data):
        tensor = ggml.tensor(t)
        if not re.fullmatch(rb"Qcur-\d+", tensor.name):
            return not ask
        if not ask:  # the last node of that name is the one attention reads (after RoPE)
            n = ggml.numel(tensor)
            data = np.frombuffer((ctypes.c_float * n).from_address(tensor.data), np.float32)
            self.q[int(tensor.name[5:])] = data.reshape(-1, self.model.n_head, self.model.head_dim_k).copy()
        return True

    def decode(self, entries) -> None:
        for i, (token, pos, seq, logits) in enumerate(entries):
            self._batch.token[i], self._batch.pos[i], self._batch.n_seq_id[i], self._batch.logits[i] = token, pos, 1, logits
            self._batch.seq_id[i][0] = seq
        self._batch.n_tokens = len(entries)
        assert ll.llama_decode(self._ptr, self._batch) == 0

    def logits(self, i: int) -> np.ndarray:
        ptr = ctypes.cast(ll.llama_get_logits_ith(self._ptr, i), ctypes.POINTER(ctypes.c_float))
        return np.ctypeslib.as_array(ptr, shape=(self.model.n_vocab,)).copy()

    def remove(self, seq: int, positions: set[int]) -> None:
        for p in positions:
            ll.llama_memory_seq_rm(ll.llama_get_memory(self._ptr), seq, p, p + 1)

    def close(self) -> None:
        ll.llama_batch_free(self._batch)
        ll.llama_free(self._ptr)


def attention(model, q: dict[int, np.ndarray], rows: list[int], query_pos: list[int], positions: np.ndarray, cache) -> np.ndarray:
    """Each query row's attention on each cached position (sorted), in numpy: softmax(q.k / sqrt(d))
    over the positions not after the query's, per query head against its group's K head, then
    the mean over the heads of each group, over the groups and over the layers."""
    order = np.argsort(positions)
    n_head, n_kv, d = model.n_head, model.n_head_kv, model.head_dim_k
    group = n_head // n_kv
    out = np.zeros((len(rows), len(positions)))
    for layer, qs in q.items():
        k = cache["k", layer][order].reshape(len(positions), n_kv, d).astype(np.float64)
        per_group = np.zeros((n_kv, len(rows), len(positions)))
        for h in range(n_head):
            logits = qs[rows, h].astype(np.float64) @ k[:, h // group].T / np.sqrt(d)
            logits[np.array(query_pos)[:, None] < positions[order][None, :]] = -np.inf
            weights = np.exp(logits - logits.max(1, keepdims=True))
            per_group[h // group] += weights / weights.sum(1, keepdims=True) / group
        out += per_group.mean(0) / len(q)
    return out


class Reference:
    """What each method keeps of one sequence after a decode, written from its definition."""

    def __init__(self, spec: str):
        self.spec, self.model = spec, parse_error(spec)
        self.sums: dict[int, float] = {}
        self.window: list[dict[int, float]] = []
        self.unasked = 0

    def keep(
        self, held: list[int], n: int, attn: np.ndarray | None, asked: bool, prompt_ended: bool, keys: dict | None = None, values: dict | None = None
    ) -> set[int]:
        """``asked``: the decode asked for the logits of the sequence's last token (a prompt's
        last piece, or generation); ``prompt_ended``: it was a prompt's last piece; ``keys`` and
        ``values``: each held position's cached K and V, (layers, KV heads, head dim)."""
        b, m = budget(self.spec, n), self.model
        if m.method == "h2o":  # every query's attention, summed per token over all decodes
            for p, a in zip(held, attn.sum(0)):
                self.sums[p] = self.sums.get(p, 0.0) + a
        if m.method == "snapkv":
            self.window = (self.window + [dict(zip(held, row)) for row in attn])[-m.window :]
        if not asked:  # a prompt is compressed once whole, as the references prefill it in one pass
            return set(held)
        if len(held) <= b or (m.method == "snapkv" and not prompt_ended):
            return set(held)
        if m.method == "window":
            return set(held[-b:])
        if m.method == "streaming":
            sinks = min(m.sinks, b - 1)  # the newest token stays (llama.cpp needs positions to follow on)
            return set(held[:sinks]) | set(held[len(held) - (b - sinks) :])
        if m.method == "tova":
            scores = dict(zip(held, attn[-1]))
            scores[held[-1]] = np.inf
            return later_first(scores, b)
        if m.method == "knorm":  # KnormPress: -||k||, here the mean over layers and heads
            scores = {p: -float(np.mean([np.sqrt(np.sum(k.astype(np.float64) ** 2)) for k in keys[p].reshape(-1, HEAD_DIM)])) for p in held}
            scores[held[-1]] = np.inf
            return later_first(scores, b)
        if m.method == "keydiff":  # KeyDiffPress: -cos(k, mean of unit keys), per layer and head, here their mean
            unit = {p: keys[p] / np.linalg.norm(keys[p].astype(np.float64), axis=-1, keepdims=True) for p in held}
            anchor = np.mean([unit[p] for p in held], axis=0)
            scores = {p: -float(np.mean(np.sum(unit[p] * anchor, axis=-1) / np.linalg.norm(anchor, axis=-1))) for p in held}
            scores[held[-1]] = np.inf
            return later_first(scores, b)
        if m.method == "lagkv":
            return later_first(lagkv_scores(held, keys, values, m.sinks, m.lag), b)
        if m.method == "h2o":
            recent = max(1, int(b * m.recent))
            older = held[: len(held) - recent]
            return later_first({p: self.sums[p] for p in older}, b - recent) | set(held[len(older) :])
        w = min(m.window, len(held))
        earlier = held[: len(held) - w]
        mean = {p: np.mean([row.get(p, 0.0) for row in self.window]) for p in earlier}
        half = m.kernel // 2
        pooled = {p: sum(mean[earlier[j]] for j in range(i - half, i + half + 1) if 0 <= j < len(earlier)) / m.kernel for i, p in enumerate(earlier)}
        return later_first(pooled, b - w) | set(held[len(earlier) :]) if b > w else set(held[-b:])


def lagkv_scores(held: list[int], keys: dict, values: dict, sinks: int, lag: int) -> dict[int, float]:
    """LagKVPress.score, one layer and KV head at a time, partition by partition, then the mean
    over layers and heads; the newest token kept."""
    n = len(held)
    if n < sinks + 2 * lag:
        scores = {p: 1.0 if i < sinks else (i - sinks) / (n - sinks) for i, p in enumerate(held)}
    else:
        parts = (n - sinks) // lag
        scores = {p: 1.0 for p in held}
        first = {p: [] for p in held[sinks : sinks + (parts - 1) * lag]}
        layers, heads = keys[held[0]].shape[:2]
        for layer in range(layers):
            for head in range(heads):
                for j in range(parts - 1):
                    part, ref = held[sinks + j * lag : sinks + (j + 1) * lag], held[sinks + (j + 1) * lag : sinks + (j + 2) * lag]
                    both = np.zeros(lag)
                    for rows in (keys, values):
                        x = np.array([rows[p][layer, head] for p in part], np.float64)
                        r = np.array([rows[p][layer, head] for p in ref], np.float64)
                        spread = ((x - r.min(0)) / (r.max(0) - r.min(0))).std(axis=1, ddof=1)
                        both += np.exp(spread) / np.exp(spread).sum() / 2
                    for rank, i in enumerate(sorted(range(lag), key=lambda i: (both[i], i))):
                        first[part[i]].append(rank / lag)
        scores |= {p: float(np.mean(r)) for p, r in first.items()}
    scores[held[-1]] = np.inf
    return scores


def run_checked(model, spec: str, prompts=PROMPTS[:1], n_batch: int = 5, steps: int = 10) -> int:
    """Prompts on sequences 0, 1, ... (each in pieces of ``n_batch``), then ``steps`` greedy tokens
    for all of them in shared decodes; after each decode every sequence's positions are checked
    against the reference. Returns the decodes checked."""
    replica = Replica(model, len(prompts), max(n_batch, len(prompts)))
    with Context(model, OFF, parse_error(spec), n_ctx=N_CTX, n_seq=len(prompts), n_batch=max(n_batch, len(prompts))) as ctx:
        refs = [Reference(spec) for _ in prompts]
        held: list[list[int]] = [[] for _ in prompts]
        schedule = []
        for seq, prompt in enumerate(prompts):
            tokens = model.tokenize(prompt)
            for start in range(0, len(tokens), n_batch):
                piece = tokens[start : start + n_batch]
                schedule.append([(t, start + j, seq, start + j == len(tokens) - 1) for j, t in enumerate(piece)])
        lengths = [len(model.tokenize(p)) for p in prompts]
        nexts: dict[int, int] = {}
        checked = 0
        for step in range(len(schedule) + steps):
            entries = schedule[step] if step < len(schedule) else [(nexts[s], lengths[s] + step - len(schedule), s, True) for s in range(len(prompts))]
            replica.q = {}
            replica.decode(entries)
            ctx.decode(entries)
            for i, (_, _, seq, logits) in enumerate(entries):
                if logits:
                    assert np.array_equal(ctx.logits(i), replica.logits(i)), "the replica computes what the checked context does"
                    nexts[seq] = int(np.argmax(ctx.logits(i)))
            for seq in dict.fromkeys(s for _, _, s, _ in entries):
                rows = [i for i, e in enumerate(entries) if e[2] == seq]
                held[seq] += [entries[i][1] for i in rows]
                attn = keys = values = None
                if ctx.error.attention:
                    positions, cache = read_cells(replica, seq)
                    assert sorted(positions.tolist()) == held[seq]
                    attn = attention(model, replica.q, rows, [entries[i][1] for i in rows], positions, cache)
                if METHODS[ctx.error.method].reads.startswith("keys"):  # the cached K and V, read back from the replica
                    positions, cache = read_cells(replica, seq)
                    layers = sorted(layer for c, layer in cache if c == "k")
                    keys, values = (
                        {int(p): np.stack([cache[c, layer][i] for layer in layers]).reshape(len(layers), N_HEAD_KV, HEAD_DIM) for i, p in enumerate(positions)}
                        for c in "kv"
                    )
                # A prompt ends where its last token's logits are asked for, several tokens after the last ask.
                refs[seq].unasked += len(rows)
                ended = entries[rows[-1]][3] and refs[seq].unasked > 1
                if entries[rows[-1]][3]:
                    refs[seq].unasked = 0
                keep = refs[seq].keep(held[seq], held[seq][-1] + 1, attn, bool(entries[rows[-1]][3]), ended, keys, values)
                assert sorted(read_cells(ctx, seq)[0].tolist()) == sorted(keep), (spec, step, seq)
                replica.remove(seq, set(held[seq]) - keep)
                held[seq] = sorted(keep)
            checked += 1
    replica.close()
    return checked


POSITION_SPECS = ["evict:window,6", "evict:window,0.5", "evict:streaming,7,sinks=3", "evict:streaming,0.4,sinks=4", "evict:streaming,0.2,sinks=4"]
ATTENTION_SPECS = [
    "evict:tova,6",
    "evict:tova,0.5",
    "evict:h2o,8",
    "evict:h2o,0.5,recent=0.25",
    "evict:snapkv,6,window=3,kernel=3",
    "evict:snapkv,0.5,window=4,kernel=5",
    "evict:snapkv,11,window=10,kernel=5",  # fewer earlier tokens (3) than the kernel
    "evict:snapkv,4,window=6,kernel=3",  # a budget within the window: the last B
]


KEY_SPECS = [
    "evict:knorm,6",
    "evict:knorm,0.5",
    "evict:keydiff,6",
    "evict:keydiff,0.5",
    "evict:lagkv,6,sinks=2,lag=3",  # partitions of 3 from 8 held tokens on: a 13-token prompt has 3
    "evict:lagkv,0.5,sinks=1,lag=4",
    "evict:lagkv,0.75,sinks=4,lag=8",  # fewer than sinks + 2 lag tokens: sinks and the most recent
]


@pytest.mark.parametrize("spec", POSITION_SPECS + ATTENTION_SPECS + KEY_SPECS)
def test_each_decode_keeps_exactly_what_the_method_keeps(tiny, spec):
    """One sequence: a prompt in pieces of 5, then generated tokens one by one; budgets as
    tokens and as ratios."""
    assert run_checked(tiny, spec) == 3 + 10


@pytest.mark.parametrize("spec", ["evict:streaming,5,sinks=2", "evict:tova,0.5", "evict:h2o,7", "evict:snapkv,8,window=4,kernel=3"])
def test_sequences_sharing_a_context_are_evicted_each_on_its_own(tiny, spec):
    """Three prompts on three sequences, their generated tokens in shared decodes (cells and
    attention rows interleave)."""
    assert run_checked(tiny, spec, prompts=PROMPTS, steps=6) > 10


def test_a_prompt_ending_in_a_one_token_piece_is_still_a_prompt_for_snapkv(tiny):
    """13 tokens in pieces of 4: the last piece is one token; SnapKV compresses after it."""
    assert len(tiny.tokenize(PROMPTS[0])) % 4 == 1
    assert run_checked(tiny, "evict:snapkv,6,window=3,kernel=3", n_batch=4, steps=3) == 4 + 3


def greedy(model, spec: str, cache=OFF, steps: int = 8):
    """Greedy tokens after the first prompt: every step's logits and the final cache."""
    with Context(model, cache, parse_error(spec), n_ctx=N_CTX, n_batch=6) as ctx:
        tokens = model.tokenize(PROMPTS[0])
        ctx.prefill(tokens)
        logits = [ctx.logits(-1).copy()]
        for i in range(steps):
            ctx.decode([(int(np.argmax(logits[-1])), len(tokens) + i, 0, True)])
            logits.append(ctx.logits(-1).copy())
        return np.array(logits), read_cells(ctx), ctx.cache_bits


@pytest.mark.parametrize(
    "spec",
    [
        "evict:window,1.0",
        "evict:streaming,64",
        "evict:random,1.0",
        "evict:tova,1.0",
        "evict:h2o,100",
        "evict:snapkv,1.0,window=4",
        "evict:knorm,1.0",
        "evict:keydiff,64",
    ],
)
def test_a_budget_that_keeps_everything_is_bit_identical_to_the_control(tiny, spec):
    control_logits, (control_positions, control_cache), control_bits = greedy(tiny, "none")
    logits, (positions, cache), bits = greedy(tiny, spec)
    assert np.array_equal(logits, control_logits) and np.array_equal(positions, control_positions)
    assert all(np.array_equal(cache[site], control_cache[site]) for site in cache)
    assert bits == control_bits == 32


def test_kept_tokens_keep_their_positions_and_values(tiny):
    """Layer 0's K and V depend only on the token and (K) its position: after a prompt in pieces
    the kept rows equal the control's at the same positions, so nothing was shifted."""
    _, (control_positions, control_cache), _ = greedy(tiny, "none", steps=0)
    _, (positions, cache), bits = greedy(tiny, "evict:streaming,6,sinks=2", steps=0)
    assert sorted(positions.tolist()) == [0, 1, 9, 10, 11, 12]  # after the prompt's last piece only
    where = {p: i for i, p in enumerate(control_positions.tolist())}
    for site in (("k", 0), ("v", 0)):
        assert np.array_equal(cache[site], control_cache[site][[where[p] for p in positions.tolist()]])
    assert bits == pytest.approx(32 * 6 / 13)


def test_a_prompt_is_not_cut_between_its_pieces(tiny):
    """Prompt pieces of 5 under a budget of 4 tokens: every piece attends to the whole prompt
    before it (the replica without eviction computes the same logits), then the prompt is cut."""
    tokens = tiny.tokenize(PROMPTS[0])
    logits = []
    for spec in ("none", "evict:window,4"):
        with Context(tiny, OFF, parse_error(spec), n_ctx=N_CTX, n_batch=5) as ctx:
            ctx.prefill(tokens)
            logits.append(ctx.logits(-1).copy())
            kept = sorted(read_cells(ctx, 0)[0].tolist())
    assert np.array_equal(logits[0], logits[1]) and kept == list(range(len(tokens) - 4, len(tokens)))


def fixed_priorities(prompt: int, generated: int, ratio: float, rng: np.random.Generator) -> float:
    """The share of prompt tokens among those kept (the newest aside) at the end, by random
    eviction's definition: each token gets a uniform score once; when the prompt has ended and
    after each generated token, the newest and the highest scores up to the budget stay."""
    scores, held = rng.random(prompt + generated), list(range(prompt))
    for n in range(prompt, prompt + generated + 1):
        held = held + [n - 1] if n > prompt else held
        b = max(1, int(n * ratio))
        if len(held) > b:
            held = sorted(sorted(held[:-1], key=lambda p: -scores[p])[: b - 1]) + held[-1:]
    return float(np.mean(np.array(held[:-1]) < prompt))


def test_random_keeps_uniform_samples_by_fixed_priorities(tiny):
    """Budget 0.25 after a 6-sentence prompt and 20 generated tokens, 12 seeds: the kept prompt
    tokens spread uniformly over the prompt (RandomPress), and the prompt's share of what is
    kept is what fixed random priorities give (computed here from the definition). Scores drawn
    anew at each decode kept mostly recent tokens: a prompt share of 0.41 instead of 0.75."""
    prompt = tiny.tokenize(" ".join([PROMPTS[0]] * 6))
    shares, spread = [], []
    for seed in range(12):
        with Context(tiny, OFF, parse_error("evict:random,0.25"), n_ctx=N_CTX, seed=seed) as ctx:
            ((_, out),) = generate_all(ctx, [prompt], 20, ignore_eos=True)
            positions = np.array(sorted(read_cells(ctx, 0)[0].tolist()))
        n = len(prompt) + len(out.tokens) - 1  # the last token is never decoded
        assert len(positions) == n // 4 and positions[-1] == n - 1
        kept = positions[:-1]
        shares.append(np.mean(kept < len(prompt)))
        spread += (kept[kept < len(prompt) - 1] / (len(prompt) - 2)).tolist()
    rng = np.random.default_rng(0)
    expected = [fixed_priorities(len(prompt), len(out.tokens) - 1, 0.25, rng) for _ in range(2000)]
    assert abs(np.mean(shares) - np.mean(expected)) < 4 * np.std(expected) / np.sqrt(12), (np.mean(shares), np.mean(expected))
    assert abs(np.mean(spread) - 0.5) < 0.07, np.mean(spread)


def test_random_keeps_the_budget_reproducibly_and_differently_per_seed(tiny):
    def kept(seed: int) -> list[list[int]]:
        prompts = [tiny.tokenize(p) for p in PROMPTS[:2]]
        with Context(tiny, OFF, parse_error("evict:random,0.5"), n_ctx=N_CTX, n_seq=2, seed=seed) as ctx:
            out = dict(generate_all(ctx, prompts, 6, ignore_eos=True))
            return [sorted(read_cells(ctx, s)[0].tolist()) for s in range(2)], out

    (a, out), (b, _), (c, _) = kept(0), kept(0), kept(1)
    assert a == b and a != c
    for seq, positions in enumerate(a):  # the last token is never decoded
        n = len(tiny.tokenize(PROMPTS[seq])) + len(out[seq].tokens) - 1
        assert len(positions) == n // 2 and max(positions) < n


def test_eviction_works_on_quantized_caches(tiny):
    """Values are never edited, so a q8_0 cache (with flash attention, for streaming) is fine."""
    cache = CacheOptions("q8_0", "q8_0", "on")
    with Context(tiny, cache, parse_error("evict:window,4"), n_ctx=N_CTX) as ctx:
        ctx.prefill(tiny.tokenize(PROMPTS[0]))
        assert ll.llama_memory_seq_pos_min(ll.llama_get_memory(ctx._ptr), 0) == 9
        assert ctx.cache_bits == pytest.approx(8.5 * 4 / 13)


@pytest.mark.parametrize(
    "cache,target,message",
    [
        (CacheOptions("f16", "f16", "on"), Target(), "flash attention does not materialize: use --flash-attn off"),
        (CacheOptions("f16", "f16", "auto"), Target(), "use --flash-attn off"),
        (OFF, Target("k"), "removes whole tokens from every layer's K and V"),
        (OFF, Target("kv", frozenset({0})), "leave --target and --layers at their defaults"),
    ],
)
def test_what_eviction_cannot_do_is_refused_in_one_line(tiny, cache, target, message):
    with pytest.raises(SpecError, match=message):
        Context(tiny, cache, parse_error("evict:h2o,0.2"), target)
    # and when the configuration is parsed, before any run: run, sweep and divergence parse first
    with pytest.raises(SpecError, match=message):
        Configuration.parse("evict:h2o,0.2", target, cache)


@pytest.mark.parametrize(
    "spec,message",
    [
        ("evict:lru,0.5", "METHOD must be one of"),
        ("evict:window,0", "token BUDGET must be an integer >= 1"),
        ("evict:window,1.5", "ratio BUDGET must be in"),
        ("evict:window,half", "BUDGET must be a ratio"),
        ("evict:window,0.5,sinks=4", "'window' takes no option 'sinks'"),
        ("evict:snapkv,0.5,kernel=4", "odd kernel"),
        ("evict:h2o,0.2,recent=2", "recent in"),
        ("evict:window,0.5,decode=-1", "decode=N compresses every N generated tokens"),
    ],
)
def test_bad_eviction_specs_say_what_is_wrong(spec, message):
    with pytest.raises(SpecError, match=message):
        parse_error(spec)


def test_keys_are_read_from_a_float_cache_only():
    with pytest.raises(SpecError, match="reads the cached keys, which a q8_0 cache holds in blocks: use an f32, f16 or bf16 K cache"):
        Configuration.parse("evict:knorm,0.5@q8_0/f16")
    assert Configuration.parse("evict:keydiff,0.5@f16/q8_0").error.method == "keydiff", "V may be quantized"
    with pytest.raises(SpecError, match="reads the cached values, which a q8_0 cache holds in blocks: use an f32, f16 or bf16 V cache"):
        Configuration.parse("evict:lagkv,0.5@f16/q8_0")


@pytest.mark.parametrize("name", sorted(METHODS))
def test_every_method_parses_with_its_options_and_evicts_to_its_budget(tiny, name):
    """Each registered method (kvinject/error_models/eviction/): its options are evict's, its
    spec parses back, and a sequence holds exactly B(n) tokens, its newest among them, after its
    prompt and after each generated token (SnapKV compresses prompts only)."""
    method = METHODS[name]
    assert set(method.options()) <= {f.name for f in fields(Evict)}, "evict takes a method's options by name"
    spec = f"evict:{name},0.5" + "".join(f",{key}=3" for key in method.options() if key in ("window", "kernel", "lag"))
    assert parse_error(parse_error(spec).spec) == parse_error(spec)
    cache = OFF if method.reads == "attention" else CacheOptions("f16", "f16", "on")
    tokens = tiny.tokenize(PROMPTS[0])
    with Context(tiny, cache, Configuration.parse(spec, cache=cache).error, n_ctx=N_CTX, seed=1) as ctx:
        ctx.begin_item(0, 0, len(tokens))
        ctx.prefill(tokens)
        for i in range(5):
            n = len(tokens) + i
            positions = read_cells(ctx)[0]
            assert len(positions) == (budget(spec, len(tokens)) + i if name == "snapkv" else budget(spec, n)) and max(positions) == n - 1
            ctx.decode([(int(np.argmax(ctx.logits(-1))), n, 0, True)])


@pytest.mark.parametrize("decode", [0, 3])
def test_decode_n_compresses_the_prompt_then_every_n_generated_tokens(tiny, decode):
    """decode=0 compresses the prompt only (kvpress's prefill compression): the generated tokens
    are all kept; decode=3 compresses again after every third (DecodingPress's interval)."""
    spec = f"evict:knorm,0.5,decode={decode}"
    assert parse_error(spec).spec == spec
    tokens = tiny.tokenize(PROMPTS[0])
    held = []
    with Context(tiny, CacheOptions("f16", "f16", "on"), parse_error(spec), n_ctx=N_CTX) as ctx:
        ctx.prefill(tokens)
        for i in range(7):
            held.append(len(read_cells(ctx)[0]))
            ctx.decode([(int(np.argmax(ctx.logits(-1))), len(tokens) + i, 0, True)])
    p = budget(spec, len(tokens))
    if decode == 0:
        assert held == [p + i for i in range(7)]
    else:  # after generated tokens 3 and 6 the sequence is cut to B(n) again
        assert held == [
            p,
            p + 1,
            p + 2,
            budget(spec, len(tokens) + 3),
            budget(spec, len(tokens) + 3) + 1,
            budget(spec, len(tokens) + 3) + 2,
            budget(spec, len(tokens) + 6),
        ]


@pytest.mark.parametrize("method", ["tova", "snapkv", "knorm"])
def test_query_agnostic_compresses_the_context_as_if_the_question_were_not_there(tiny, method):
    """query=agnostic cuts a prompt's context where it ends, before its question is decoded: the
    context tokens it keeps are exactly those kept of the context alone as a prompt, and the
    question and generated tokens all stay (decode=0). Query-aware cuts the whole prompt, with the
    question's queries in its scores."""
    context = tiny.tokenize("The secret word is apple. Rivers carry sediment from the mountains to the sea.")
    question = tiny.tokenize(" What is the secret word?", add_special=False)
    prompt, c = context + question, len(context)

    def held_after(spec: str, tokens: list[int], spans=None, steps: int = 3) -> set[int]:
        with Context(tiny, OFF, parse_error(spec), n_ctx=N_CTX, n_batch=8) as ctx:
            next(generate_all(ctx, [tokens], steps + 1, items=[0], spans=spans, ignore_eos=True))
            return set(read_cells(ctx)[0].tolist())

    options = ",window=3,kernel=3" if method == "snapkv" else ""
    agnostic = held_after(f"evict:{method},0.5{options},decode=0,query=agnostic", prompt, [{"context": [(0, c)]}])
    alone = held_after(f"evict:{method},0.5{options},decode=0", context)
    assert {p for p in agnostic if p < c} == {p for p in alone if p < c} and len({p for p in agnostic if p < c}) == budget("x,0.5", c)
    assert set(range(c, len(prompt) + 3)) <= agnostic, "the question and the generated tokens stay"
    aware = held_after(f"evict:{method},0.5{options},decode=0", prompt)
    assert len({p for p in aware if p < len(prompt)}) == budget("x,0.5", len(prompt)), "the whole prompt cut to B(P)"
    with pytest.raises(SpecError, match=r"acts where each prompt's context ends, and nexttoken marks no context \(benches that do: gsm8k, niah, passkey, vt\)"):
        BENCHMARKS["nexttoken"].check(Configuration.parse("evict:knorm,0.5,query=agnostic"))


def test_specs_name_only_the_method_s_options_and_parse_back():
    for spec in ["evict:window,0.5", "evict:streaming,256,sinks=4", "evict:h2o,0.2,recent=0.5", "evict:snapkv,1024,window=64,kernel=5", "evict:tova,0.125"]:
        assert parse_error(spec).spec == spec and parse_error(parse_error(spec).spec) == parse_error(spec)
    assert parse_error("evict:streaming,0.25").spec == "evict:streaming,0.25,sinks=4"


def test_bits_per_element_are_the_kept_share():
    """Before a run, a ratio budget's share; after it, the share the sequences kept."""
    model = parse_error("evict:h2o,0.25")
    assert cache_bits(model, Target(), CacheOptions(), 4, 1, 64, 64) == 4
    assert cache_bits(model, Target(), CacheOptions(), 4, 1, 64, 64, [100, 300], [25, 75]) == 4
    assert cache_bits(parse_error("evict:window,64"), Target(), CacheOptions(), 4, 1, 64, 64, [128], [64]) == 8
