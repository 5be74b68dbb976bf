"""KVQuant against real llama.cpp: the cache, read back through llama.cpp's state export, must hold
what KVQuant's definition makes of the K/V rows.

The reference below is written from the paper (Hooper et al., arXiv 2401.18079: per-channel K
before RoPE with offline-calibrated ranges, per-token V, dense-and-sparse outliers, the first
tokens exact) and its simulated-quantization code's definitions (SqueezeAILab/KVQuant,
quant/kvquant/simquant_module_quantizer.py), value by value, not from kvinject's implementation.
K before RoPE is read and replaced by a graph callback of the test's own on a replica context,
so the check needs no RoPE of its own: the checked cache must equal the one llama.cpp's RoPE
makes of the reference quantization.
"""

from __future__ import annotations

import ctypes
import re

import numpy as np
import pytest
from llama_cpp import llama_cpp as ll

from kvinject.engine import ggml
from kvinject.engine.context import Context
from kvinject.engine.graph.graph_plan import GraphNode, GraphPlan
from kvinject.engine.options import CacheOptions
from kvinject.engine.target import Target
from kvinject.error_models import parse_error
from kvinject.error_models.kvquant import calibration_tokens
from kvinject.exceptions import ModelError, SpecError

from .cache_state import read_cache

PROMPT = "The quick brown fox jumps over the lazy dog while the cat watches from the warm window sill."
F32 = CacheOptions("f32", "f32", "off")  # flash attention would compute an f32 cache at f16
CALIB = 48
STEPS = [11, 500, 2024]  # tokens decoded one at a time after the prompt, the same in every context


def reference_level(x: float, lo: float, hi: float, bits: int) -> np.float32:
    """Uniform asymmetric quantization of one value onto 2^bits levels spanning [lo, hi], in
    float32 as the cache computes it (so that the replica's later layers see the same values)."""
    x, lo, hi = np.float32(x), np.float32(lo), np.float32(hi)
    if hi == lo:
        return lo
    step = (hi - lo) / np.float32(2**bits - 1)
    return lo + np.float32(min(max(np.rint((x - lo) / step), 0), 2**bits - 1)) * step


def reference_k(rows: np.ndarray, calibration: np.ndarray, bits: int, outliers: float | None) -> np.ndarray:
    """Per channel: thresholds are the calibration's percentiles p/2 and 1 - p/2 (without
    outliers, its minimum and maximum); a value beyond them stays exact (dense-and-sparse), or,
    without outliers, is clipped; the others are quantized over the thresholds."""
    out = rows.copy()
    for c in range(rows.shape[1]):
        column = calibration[:, c]
        lo, hi = (column.min(), column.max()) if outliers is None else np.percentile(column, [50 * outliers, 100 - 50 * outliers])
        lo, hi = np.float32(lo), np.float32(hi)
        for t in range(rows.shape[0]):
            if outliers is None or lo <= rows[t, c] <= hi:
                out[t, c] = reference_level(rows[t, c], lo, hi, bits)
    return out


def reference_v(rows: np.ndarray, bits: int, outliers: float | None) -> np.ndarray:
    """Per token: with outliers, the values at or beyond the token's own percentiles p/2 and
    1 - p/2 stay exact; the others are quantized over their own minimum and maximum."""
    out = rows.copy()
    for t in range(rows.shape[0]):
        row = rows[t]
        if outliers is None:
            sparse = np.zeros(len(row), bool)
        else:
            lo_t, hi_t = np.percentile(row, [50 * outliers, 100 - 50 * outliers])
            sparse = (row <= lo_t) | (row >= hi_t)
        lo, hi = row[~sparse].min(), row[~sparse].max()
        for c in np.flatnonzero(~sparse):
            out[t, c] = reference_level(row[c], lo, hi, bits)
    return out


def normalized(x: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """KVQuant's normalization to [-1, 1]: offset by the range's middle, divided by its half."""
    return (x - (hi + lo) / np.float32(2)) / ((hi - lo) / np.float32(2))


def reference_nuq(x: float, lo: float, hi: float, levels: np.ndarray) -> np.float32:
    """One value normalized over [lo, hi], replaced by the nearest level (the first on a tie, as
    argmin) and scaled back, in float32 (KVQuant's quant_fn_nuq_recon)."""
    x, lo, hi = np.float32(x), np.float32(lo), np.float32(hi)
    middle, half = (hi + lo) / np.float32(2), (hi - lo) / np.float32(2)
    return middle + half * levels[np.argmin(np.abs(levels - (x - middle) / half))]


def assert_k_means(values: np.ndarray, levels: np.ndarray) -> None:
    """``levels`` are a k-means solution of ``values``: sorted, and each the mean of the values
    nearest to it (Lloyd's fixed point), none without values."""
    assert np.all(np.diff(levels) > 0)
    nearest = np.argmin(np.abs(values[:, None] - levels[None, :].astype(np.float64)), axis=1)
    for i, level in enumerate(levels):
        assert (nearest == i).any(), f"level {i} holds no value"
        assert values[nearest == i].mean() == pytest.approx(level, rel=1e-5, abs=1e-6), i


class Replica:
    """A plain llama context whose own graph callback reads each layer's K as RoPE reads it (the
    ``Kcur-<il>`` reshape of the projection, in a llama graph) and may replace it."""

    def __init__(self, model, replace=None, n_ctx: int = 256):
        self.model, self.replace, self.k = model, replace, {}
        self._callback = ll.ggml_backend_sched_eval_callback(self._watch)
        params = ll.llama_context_default_params()
        params.n_ctx, params.n_batch, params.n_ubatch = n_ctx, n_ctx, n_ctx
        params.type_k = params.type_v = ggml.CACHE_TYPES["f32"]
        params.flash_attn_type, params.no_perf = 0, True
        params.n_threads = params.n_threads_batch = model.backend.n_threads
        params.cb_eval, params.cb_eval_user_data = self._callback, None
        self._ptr = ll.llama_init_from_model(model.ptr, params)
        self._batch = ll.llama_batch_init(n_ctx, 0, 1)

    def _watch(self, t, ask, user_data):
        tensor = ggml.tensor(t)
        if not (re.fullmatch(rb"Kcur-\d+", tensor.name) and ggml.lib().ggml_op_name(tensor.op) == b"RESHAPE"):
            return not ask
        if not ask:
            layer, n = int(tensor.name[5:]), ggml.numel(tensor)
            data = np.frombuffer((ctypes.c_float * n).from_address(tensor.data), np.float32).reshape(-1, tensor.ne[0] * tensor.ne[1])
            self.k.setdefault(layer, []).append(data.copy())
            if self.replace is not None:
                data[...] = self.replace(data, layer)
        return True

    def decode(self, tokens: list[int], start: int) -> None:
        for i, token in enumerate(tokens):
            self._batch.token[i], self._batch.pos[i], self._batch.n_seq_id[i], self._batch.logits[i] = token, start + i, 1, False
            self._batch.seq_id[i][0] = 0
        self._batch.n_tokens = len(tokens)
        assert ll.llama_decode(self._ptr, self._batch) == 0

    def close(self) -> None:
        ll.llama_batch_free(self._batch)
        ll.llama_free(self._ptr)


def pre_rope_calibration(model) -> dict[int, np.ndarray]:
    """Every layer's K before RoPE over the calibration tokens, read by the replica's callback."""
    replica = Replica(model, n_ctx=CALIB)
    replica.decode(calibration_tokens(model, CALIB), 0)
    replica.close()
    return {layer: np.concatenate(rows) for layer, rows in replica.k.items()}


def post_rope_calibration(model) -> dict[int, np.ndarray]:
    """Every layer's K after RoPE over the calibration tokens: a control's cache."""
    with Context(model, F32, n_ctx=CALIB) as ctx:
        ctx.prefill(calibration_tokens(model, CALIB))
        return {il: rows for (c, il), rows in read_cache(ctx).items() if c == "k"}


def checked(model, spec: str, target: Target | None = None, n_batch: int = 512) -> dict:
    """The cache after the prompt (in pieces of ``n_batch``) and STEPS, under ``spec``."""
    with Context(model, F32, parse_error(spec), target, n_ctx=256, n_batch=n_batch) as ctx:
        tokens = model.tokenize(PROMPT)
        ctx.prefill(tokens)
        for i, token in enumerate(STEPS):
            ctx.decode([(token, len(tokens) + i, 0, False)])
        return read_cache(ctx)


@pytest.mark.parametrize("outliers", [None, 0.05])
def test_k_in_the_cache_is_rope_of_k_quantized_before_rope(tiny, outliers):
    """Every layer: the checked cache equals the replica's, whose callback replaced K before RoPE
    by the reference quantization over ranges from its own capture of the calibration's K."""
    spec = f"kvquant:3,calib={CALIB}" + (f",outliers={outliers}" if outliers else "")
    got = checked(tiny, spec, Target("k"), n_batch=8)
    calibration = pre_rope_calibration(tiny)
    replica = Replica(tiny, lambda rows, layer: reference_k(rows, calibration[layer], 3, outliers))
    tokens = tiny.tokenize(PROMPT)
    for start in range(0, len(tokens), 8):
        replica.decode(tokens[start : start + 8], start)
    for i, token in enumerate(STEPS):
        replica.decode([token], len(tokens) + i)
    expect = read_cache(replica)
    replica.close()
    with Context(tiny, F32, n_ctx=256) as control:
        control.prefill(tokens)
        for i, token in enumerate(STEPS):
            control.decode([(token, len(tokens) + i, 0, False)])
        clean = read_cache(control)
    for site, rows in got.items():
        assert np.array_equal(rows, expect[site]), site
        if site[0] == "k":
            assert not np.allclose(rows, clean[site], rtol=1e-3, atol=1e-3), "K was not quantized"
    assert np.array_equal(got["v", 0], clean["v", 0]), "V is not targeted"
    # Quantizing after RoPE instead gives another cache: the site matters.
    post = reference_k(clean["k", 0], post_rope_calibration(tiny)[0], 3, outliers)
    assert not np.allclose(got["k", 0], post, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("outliers", [None, 0.05])
def test_post_rope_k_and_v_are_the_reference_quantization_of_what_entered(tiny, outliers):
    """Layer 0, whose input no quantization touches: K after RoPE per channel over ranges
    calibrated on the control's cache of the calibration tokens, V per token."""
    spec = f"kvquant:3,site=post-rope,calib={CALIB}" + (f",outliers={outliers}" if outliers else "")
    got = checked(tiny, spec, n_batch=8)
    clean = checked(tiny, "none")
    calibration = post_rope_calibration(tiny)[0]
    assert np.array_equal(got["k", 0], reference_k(clean["k", 0], calibration, 3, outliers))
    assert np.array_equal(got["v", 0], reference_v(clean["v", 0], 3, outliers))


def test_outliers_are_kept_exact_and_are_about_the_share_asked(tiny):
    got, clean = checked(tiny, f"kvquant:2,site=post-rope,outliers=0.05,calib={CALIB}"), checked(tiny, "none")
    # V: each token's tails beyond its own percentiles 2.5% and 97.5% are exactly the control's.
    v = clean["v", 0]
    lo, hi = np.percentile(v, [2.5, 97.5], axis=1, keepdims=True)
    sparse = (v <= lo) | (v >= hi)
    assert np.array_equal(got["v", 0][sparse], v[sparse])
    assert 0.03 < sparse.mean() < 0.07
    assert not np.array_equal(got["v", 0][~sparse], v[~sparse])
    # K: the values beyond the calibrated per-channel thresholds are the control's.
    calibration = post_rope_calibration(tiny)[0]
    klo, khi = np.percentile(calibration, [2.5, 97.5], axis=0)
    k = clean["k", 0]
    beyond = (k < klo) | (k > khi)
    assert beyond.any() and np.array_equal(got["k", 0][beyond], k[beyond])


@pytest.mark.parametrize("site", ["pre-rope", "post-rope"])
def test_sink_tokens_stay_exact(tiny, site):
    got, clean = checked(tiny, f"kvquant:2,site={site},sinks=3,calib={CALIB}", n_batch=2), checked(tiny, "none")
    for component in "kv":
        assert np.array_equal(got[component, 0][:3], clean[component, 0][:3]), component
        assert not np.any(np.all(got[component, 0][3:] == clean[component, 0][3:], axis=1)), "every later token is quantized"
    # Calibration counts the sinks in K's ranges, as KVQuant's SimQuant.quantize takes its
    # percentiles over every calibration token (its first_few_fp16 mask serves nuq's k-means only).
    if site == "post-rope":
        calibration = post_rope_calibration(tiny)[0]
        reference = reference_k(clean["k", 0][3:], calibration, 2, None)
        assert np.array_equal(got["k", 0][3:], reference)
        assert not np.array_equal(reference, reference_k(clean["k", 0][3:], calibration[3:], 2, None)), "the sinks widen the ranges"


def test_bits_count_scales_outliers_and_sinks_at_the_run_s_lengths(tiny):
    model = parse_error(f"kvquant:4,outliers=0.01,sinks=4,calib={CALIB}")
    row = tiny.n_head_kv * tiny.head_dim_k
    with Context(tiny, F32, model, n_ctx=64) as ctx:
        ctx.prefill(list(range(1, 21)))
        ctx.forget(0)
        ctx.prefill(list(range(1, 3)))
        exact = (4 + 2) / (20 + 2)  # the first 4 tokens of 20, both of 2, at the cache's 32 bits
        outlier_bits = 0.01 * (16 + 16) + 32 / row  # fp16 value and int16 index; an int32 row pointer per token
        k = 4 + outlier_bits  # K's ranges are per channel, calibrated once for the model
        v = 4 + outlier_bits + 32 / row  # V's fp16 scale and zero point per token
        expect = ((1 - exact) * k + exact * 32 + (1 - exact) * v + exact * 32) / 2
        assert ctx.cache_bits == pytest.approx(expect)
    assert parse_error("kvquant:2").bits_per_element(16, "k") == 2, "long sequences, no outliers: BITS"


def node(ptr, name, op, reads=()):
    return GraphNode(ptr, name.encode(), op, frozenset(reads))


def test_the_plan_claims_what_rope_reads():
    rope, sites = ggml.GGML_OP_ROPE, {b"Kcur-0": ("k", 0), b"Vcur-0": ("v", 0)}
    # llama: projection, reshape and RoPE all named Kcur: the reshape (run 1 of 2), V changed with it.
    llama = [node(1, "Vcur-0", 29), node(2, "Vcur-0", 36, {1}), node(3, "Kcur-0", 29), node(4, "Kcur-0", 36, {3}), node(5, "Kcur-0", rope, {4})]
    plan = GraphPlan.learn(llama, sites, pre_rope=True)
    assert (plan.n_runs[b"Kcur-0"], plan.claim_run[b"Kcur-0"], plan.final_op[b"Kcur-0"]) == (2, 1, 36)
    assert plan.claims == {b"Kcur-0": (b"Vcur-0", b"Kcur-0")}
    assert GraphPlan.learn(llama, sites).final_op[b"Kcur-0"] == rope, "after RoPE, as before"
    # Gemma: K normalized as Kcur_normed before RoPE, V after: K claimed alone (RoPE reads it before V).
    gemma = [node(1, "Kcur-0", 29), node(2, "norm-0", 25, {1}), node(3, "Kcur_normed-0", 7, {2}), node(4, "Kcur-0", rope, {3}), node(5, "Vcur-0", 29)]
    plan = GraphPlan.learn(gemma, {**sites, b"Kcur_normed-0": ("k", 0)}, pre_rope=True)
    assert (plan.n_runs[b"Kcur-0"], plan.claim_run[b"Kcur-0"], plan.final_op[b"Kcur-0"]) == (3, 2, 7)
    assert plan.claims == {b"Kcur-0": (b"Kcur-0",), b"Vcur-0": (b"Vcur-0",)}
    # RoPE reading something that is not K: refused.
    with pytest.raises(ModelError, match="before RoPE"):
        GraphPlan.learn([node(1, "Kcur-0", 29), node(2, "other", 7, {1}), node(3, "Kcur-0", rope, {2})], sites, pre_rope=True)


@pytest.mark.parametrize(
    "spec,message",
    [
        ("kvquant:0", "BITS must be in 1..16"),
        ("kvquant:4,site=middle", "site must be pre-rope or post-rope"),
        ("kvquant:4,outliers=1", "outliers is a share"),
        ("kvquant:4,sinks=0", "sinks must be >= 1"),
        ("kvquant:4,calib=1", "calib must be >= 2"),
        ("kvquant:4,levels=nf", "levels must be uniform or nuq"),
        ("kvquant:4,group=32", "has no option 'group'"),
    ],
)
def test_bad_specs_say_what_is_wrong(spec, message):
    with pytest.raises(SpecError, match=message):
        parse_error(spec)


def test_specs_name_only_the_options_given_and_parse_back():
    assert parse_error("kvquant:4").spec == "kvquant:4,site=pre-rope"
    spec = parse_error("kvquant:3,outliers=0.01,sinks=1,site=post-rope").spec
    assert spec == "kvquant:3,site=post-rope,outliers=0.01,sinks=1" and parse_error(spec).spec == spec
    assert parse_error("kvquant:4,levels=uniform").spec == "kvquant:4,site=pre-rope", "the default, one spec"
    assert parse_error("kvquant:2,levels=nuq").spec == "kvquant:2,site=pre-rope,levels=nuq"


@pytest.mark.parametrize("sinks", [0, 3])
def test_nuq_levels_are_k_means_of_the_normalized_calibration_and_the_cache_holds_the_nearest(tiny, sinks):
    """levels=nuq, post-RoPE, 5% outliers, 3 bits: K's levels are the k-means of the calibration's
    K normalized per channel over its percentiles (outliers out), V's of the calibration's V
    normalized per token over its dense range; the cache holds each value's nearest level. With
    sinks, K's percentiles still span every calibration token and the k-means leaves the sinks
    out (KVQuant's first_few_fp16), and the sinks stay exact in the cache."""
    spec = f"kvquant:3,site=post-rope,outliers=0.05,levels=nuq,calib={CALIB}" + (f",sinks={sinks}" if sinks else "")
    fitted = parse_error(spec).fit(tiny, F32)
    with Context(tiny, F32, n_ctx=CALIB) as ctx:
        ctx.prefill(calibration_tokens(tiny, CALIB))
        calibration = read_cache(ctx)
    k_lo, k_hi = (np.float32(q) for q in np.percentile(calibration["k", 0], [2.5, 97.5], axis=0))
    k = normalized(calibration["k", 0][sinks:], k_lo, k_hi).ravel().astype(np.float64)
    assert_k_means(k[np.abs(k) <= 1], fitted.k_levels[0])
    v_rows = []
    for row in calibration["v", 0][sinks:]:
        lo_t, hi_t = np.percentile(row, [2.5, 97.5])
        dense = row[(row > lo_t) & (row < hi_t)]
        v_rows.append(normalized(dense, dense.min(), dense.max()))
    assert_k_means(np.concatenate(v_rows).astype(np.float64), fitted.v_levels[0])
    assert fitted.k_levels.shape == fitted.v_levels.shape == (tiny.n_layer, 8)

    got, clean = checked(tiny, spec, n_batch=8), checked(tiny, "none")
    expect_k = clean["k", 0].copy()
    for (t, c), x in np.ndenumerate(clean["k", 0]):
        if t >= sinks and k_lo[c] <= x <= k_hi[c]:
            expect_k[t, c] = reference_nuq(x, k_lo[c], k_hi[c], fitted.k_levels[0])
    assert np.array_equal(got["k", 0], expect_k)
    expect_v = clean["v", 0].copy()
    for t, row in enumerate(clean["v", 0][sinks:], start=sinks):
        lo_t, hi_t = np.percentile(row, [2.5, 97.5])
        dense = (row > lo_t) & (row < hi_t)
        for c in np.flatnonzero(dense):
            expect_v[t, c] = reference_nuq(row[c], row[dense].min(), row[dense].max(), fitted.v_levels[0])
    assert np.array_equal(got["v", 0], expect_v)
    # Non-uniform: the levels are not the uniform grid's, and the cache differs from uniform's.
    assert not np.allclose(np.diff(fitted.k_levels[0]), np.diff(fitted.k_levels[0]).mean(), rtol=0.05)
    assert not np.array_equal(got["k", 0], checked(tiny, spec.replace(",levels=nuq", ""), n_batch=8)["k", 0])


def test_a_calibration_longer_than_the_training_context_is_refused_before_a_context_is_made(tiny):
    """calib=100000000 tried to allocate a 100M-token context."""
    with pytest.raises(SpecError, match="training context of 4096"):
        parse_error("kvquant:4,calib=100000000").fit(tiny, CacheOptions())
