"""KIVI against real llama.cpp: after every decode the cache, read back through llama.cpp's own
state export, must be exactly what KIVI's definition makes of the K/V rows as they entered.

The reference below is written from KIVI's paper and code (github.com/jy-yuan/KIVI:
quant/new_pack.py for the quantizer, models/llama_kivi.py for which tokens are quantized when),
group by group, not from kvinject's implementation.
"""

from __future__ import annotations

import numpy as np
import pytest

from kvinject.engine.context import Context
from kvinject.engine.generation.batching import generate_all
from kvinject.engine.options import CacheOptions
from kvinject.engine.target import Target
from kvinject.error_models import parse_error
from kvinject.error_models.configuration import Configuration
from kvinject.exceptions import SpecError

from .cache_state import read_cache, read_cells

PROMPTS = [
    "The quick brown fox jumps over the lazy dog while the cat watches",
    "Rivers carry sediment from the mountains to the sea",
    "A short one",
]
BITS, GROUP, RESIDUAL = 2, 4, 8
F32 = CacheOptions("f32", "f32", "on")


def quantize_group(values: np.ndarray, bits: int) -> np.ndarray:
    """One group, as quant/new_pack.py: scale = (max - min) / (2^b - 1), q = round(clamp((x - min) / scale)), x' = q * scale + min."""
    lo, hi = values.min(), values.max()
    scale = (hi - lo) / np.float32(2**bits - 1)
    return np.round(np.clip((values - lo) / scale, 0, 2**bits - 1)) * scale + lo


def kivi_reference(entered: np.ndarray, component: str, bits: int, group: int, residual: int) -> np.ndarray:
    """The cache KIVI holds for a sequence of ``n`` tokens whose rows entered as ``entered``:
    K blocks of ``residual`` tokens, once complete, quantized per channel in groups of ``group``
    tokens; V quantized per token in groups of ``group`` channels, except the last ``residual``."""
    n, width = entered.shape
    out = entered.copy()
    if component == "k":
        for start in range(0, n // residual * residual, group):
            for channel in range(width):
                out[start : start + group, channel] = quantize_group(entered[start : start + group, channel], bits)
    else:
        for token in range(n - residual):
            for start in range(0, width, group):
                out[token, start : start + group] = quantize_group(entered[token, start : start + group], bits)
    return out


def bf16(x: np.ndarray) -> np.ndarray:
    """Rounded to bfloat16 (the high 16 bits of a float32), nearest even, as float32."""
    bits = x.view(np.uint32).astype(np.uint64)
    return (((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16).astype(np.uint32).view(np.float32)


class Watch:
    """Wraps a context's cache-resident step: before it, notes each new token's rows as they
    entered (from the cache); after it, checks every sequence of the decode against the reference."""

    def __init__(self, ctx, spec: str, target: Target = Target()):
        self.ctx, self.model, self.target = ctx, parse_error(spec), target
        self.stored = {"f32": lambda x: x, "f16": lambda x: x.astype(np.float16).astype(np.float32), "bf16": bf16}[ctx.cache.type_k]
        self.entered: dict[int, dict[tuple[str, int], dict[int, np.ndarray]]] = {}
        self.checks = 0
        step = ctx.resident.after_decode

        def watched(entries, writes):
            seqs = dict.fromkeys(seq for _, _, seq, _ in entries)
            for seq in seqs:
                if any(pos == 0 for _, pos, s, _ in entries if s == seq):
                    self.entered[seq] = {}  # a new item on this sequence
                positions, cache = read_cells(ctx, seq)
                for site, rows in cache.items():
                    for pos, row in zip(positions.tolist(), rows):
                        self.entered[seq].setdefault(site, {}).setdefault(pos, row)
            step(entries, writes)
            for seq in seqs:
                self.check(seq)

        ctx.resident.after_decode = watched

    def check(self, seq: int) -> None:
        positions, cache = read_cells(self.ctx, seq)
        order = np.argsort(positions)
        assert positions[order].tolist() == list(range(len(positions)))
        for (component, layer), rows in cache.items():
            entered = np.array([row for _, row in sorted(self.entered[seq][component, layer].items())])
            expect = entered
            if self.target.wants(component, layer):
                m = self.model
                expect = self.stored(kivi_reference(entered, component, m.bits, m.group, m.residual))
            assert np.array_equal(rows[order], expect), (seq, component, layer, len(positions))
        self.checks += 1


def generate(model, spec: str, cache=F32, target=None, n_seq=1, n_batch=6, prompts=PROMPTS[:1], max_tokens=12):
    """Greedy generation after each prompt (prompts decoded in pieces of ``n_batch``, generated
    tokens of all sequences in one decode), every step watched."""
    with Context(model, cache, parse_error(spec), target, n_ctx=256, n_seq=n_seq, n_batch=n_batch) as ctx:
        watch = Watch(ctx, spec, target or Target())
        out = dict(generate_all(ctx, [model.tokenize(p) for p in prompts], max_tokens, ignore_eos=True))
        return out, watch, ctx.realized


@pytest.mark.parametrize(
    "cache,bits",
    [
        (F32, 2),
        (F32, 4),
        (CacheOptions("f32", "f32", "off"), 2),
        (CacheOptions("f16", "f16", "on"), 3),
        (CacheOptions("f16", "f16", "off"), 2),
        (CacheOptions("bf16", "bf16", "on"), 2),
    ],
    ids=lambda v: v.label if isinstance(v, CacheOptions) else f"{v}bit",
)
def test_the_cache_is_kivi_of_what_entered_after_every_decode(tiny, cache, bits):
    """One sequence: a prompt in pieces of 6, then generated tokens one by one across several
    K blocks; transposed V (flash attention off) and f16 caches included."""
    out, watch, realized = generate(tiny, f"kivi:{bits},group={GROUP},residual={RESIDUAL}", cache)
    n = len(tiny.tokenize(PROMPTS[0])) + len(out[0].tokens) - 1  # the last token is never decoded
    assert n >= 3 * RESIDUAL and watch.checks == -(-len(tiny.tokenize(PROMPTS[0])) // 6) + len(out[0].tokens) - 1
    row = tiny.n_head_kv * tiny.head_dim_k
    assert realized.k.values == n // RESIDUAL * RESIDUAL * row * tiny.n_layer
    assert realized.v.values == (n - RESIDUAL) * row * tiny.n_layer
    assert 0 < realized.k.changed <= realized.k.values and np.isfinite(realized.v.snr_db)


def test_sequences_sharing_a_context_each_get_kivi_of_their_own_tokens(tiny):
    """Three prompts on two sequences: generated tokens of both share decodes (their cells
    interleave), and a sequence is reused for the third prompt once its first finishes."""
    out, watch, _ = generate(tiny, f"kivi:2,group={GROUP},residual={RESIDUAL}", n_seq=2, prompts=PROMPTS, max_tokens=14)
    assert sorted(out) == [0, 1, 2] and watch.checks > 30


def test_target_v_on_one_layer_changes_only_that_layer_s_v(tiny):
    target = Target("v", frozenset({1}))
    _, watch, realized = generate(tiny, f"kivi:2,group={GROUP},residual={RESIDUAL}", target=target)
    assert realized.k.values == 0 and realized.v.values > 0 and watch.checks > 0


def test_a_residual_covering_everything_is_bit_identical_to_the_control(tiny):
    spec = "kivi:2,group=4,residual=4096"
    with Context(tiny, F32, parse_error("none"), n_ctx=256) as clean, Context(tiny, F32, parse_error(spec), n_ctx=256) as kivi:
        tokens = tiny.tokenize(PROMPTS[0])
        logits = []
        for ctx in (clean, kivi):
            ctx.prefill(tokens)
            steps = [ctx.logits(-1).copy()]
            for i in range(6):
                ctx.decode([(int(np.argmax(steps[-1])), len(tokens) + i, 0, True)])
                steps.append(ctx.logits(-1).copy())
            logits.append(np.array(steps))
        assert np.array_equal(logits[0], logits[1])
        a, b = read_cache(clean), read_cache(kivi)
        assert all(np.array_equal(a[site], b[site]) for site in a)
        assert kivi.realized.k.values == kivi.realized.v.values == 0


def test_prompt_pieces_change_what_later_pieces_attend_to_but_not_where_kivi_ends(tiny):
    """A prompt decoded in one piece attends in full precision; in pieces, later pieces see the
    quantized earlier ones (docs/compressors.md). Layer 0's K/V do not depend on attention, so
    its final cache is the same either way; layer 1's is not."""
    tokens = tiny.tokenize(PROMPTS[0] + " " + PROMPTS[1])
    caches = []
    for n_batch in (len(tokens), 8):
        with Context(tiny, F32, parse_error(f"kivi:2,group={GROUP},residual={RESIDUAL}"), n_ctx=256, n_batch=n_batch) as ctx:
            ctx.prefill(tokens)
            caches.append(read_cache(ctx))
    assert np.array_equal(caches[0]["k", 0], caches[1]["k", 0]) and np.array_equal(caches[0]["v", 0], caches[1]["v", 0])
    assert not np.array_equal(caches[0]["k", 1], caches[1]["k", 1])


@pytest.mark.parametrize(
    "cache,target,message",
    [
        (CacheOptions("q8_0", "f16", "on"), Target(), "cannot be done in a q8_0 cache: use --cache-type-k f16"),
        (CacheOptions("f16", "q4_0", "on"), Target(), "use --cache-type-v f16"),
    ],
)
def test_quantized_caches_are_refused_in_one_line(tiny, cache, target, message):
    with pytest.raises(SpecError, match=message):
        Context(tiny, cache, parse_error("kivi:2"), target)
    with pytest.raises(SpecError, match=message):  # and before any run
        Configuration.parse("kivi:2", target, cache)


def test_a_quantized_cache_kivi_does_not_touch_is_fine(tiny):
    with Context(tiny, CacheOptions("f16", "q8_0", "on"), parse_error("kivi:2,group=4,residual=8"), Target("k"), n_ctx=256) as ctx:
        ctx.prefill(tiny.tokenize(PROMPTS[0]))
        assert ctx.realized.k.values > 0 and ctx.realized.v.values == 0


def test_v_groups_must_divide_the_head_dimension(tiny):
    with pytest.raises(SpecError, match="group 48 does not divide the head dimension 64"):
        Context(tiny, F32, parse_error("kivi:2,group=48,residual=96"))


@pytest.mark.parametrize(
    "spec,message",
    [
        ("kivi:0", "BITS must be in 1..16"),
        ("kivi:2,group=32,residual=48", "multiple of group"),
        ("kivi:2,group=0", "group must be >= 1"),
        ("kivi:2,residual=0", "multiple of group"),
    ],
)
def test_bad_kivi_specs_say_what_is_wrong(spec, message):
    with pytest.raises(SpecError, match=message):
        parse_error(spec)
