"""Parallel evaluation means the same as sequential: each item gets the noise it gets alone,
and on the CPU backend the same outputs and scores, with sequences refilled as they finish."""

from __future__ import annotations

from dataclasses import replace

import gguf
import numpy as np
import pytest

from kvinject.benchmarks import NextToken, Perplexity
from kvinject.engine.context import Context
from kvinject.engine.generation.batching import generate_all
from kvinject.engine.model import Model
from kvinject.engine.options import BackendOptions, CacheOptions
from kvinject.error_models import parse_error
from kvinject.error_models.configuration import Configuration
from kvinject.exceptions import InjectionError
from kvinject.experiments.runner import run

from .cache_state import read_cache
from .tiny_model import TINY, write_model

F32 = CacheOptions("f32", "f32", "on")
TEXTS = [
    "The quick brown fox jumps over the lazy dog while the cat watches.",
    "Rivers carry sediment from the mountains to the sea, building deltas",
    "In 1847 the railway reached the town, and with it came",
    "A recipe for bread needs flour, water, salt and",
    "The committee met on Tuesday to discuss the budget for the coming",
]


def layer0_factors(tiny, spec, decodes, seq):
    """Decode ``decodes`` (lists of (token, pos, seq) with items begun per seq) with and without
    noise; return the factor (noisy / clean) of layer 0's cached K and V of ``seq``. Layer 0's
    K and V do not depend on earlier injection, so the factor is exactly the injected 1 + e."""
    caches = []
    for error in ("none", spec):
        with Context(tiny, F32, parse_error(error), n_seq=2, n_ctx=256, seed=3) as ctx:
            for seq_of, item in decodes["items"]:
                ctx.begin_item(item, seq_of)
            for entries in decodes["batches"]:
                ctx.decode([(t, pos, s, False) for t, pos, s in entries])
            caches.append(read_cache(ctx, seq))
    return {c: caches[1][c, 0] / caches[0][c, 0] for c in "kv"}


def test_an_item_gets_the_same_noise_in_a_shared_decode_as_alone(tiny):
    a, b = (tiny.tokenize(t) for t in TEXTS[:2])
    alone = layer0_factors(tiny, "normal:0,0.25", {"items": [(0, 7)], "batches": [[(t, i, 0) for i, t in enumerate(a)]]}, 0)
    # Item 7 on sequence 1, decoded after item 4's rows in the same decode.
    shared_batch = [(t, i, 0) for i, t in enumerate(b)] + [(t, i, 1) for i, t in enumerate(a)]
    shared = layer0_factors(tiny, "normal:0,0.25", {"items": [(0, 4), (1, 7)], "batches": [shared_batch]}, 1)
    neighbour = layer0_factors(tiny, "normal:0,0.25", {"items": [(0, 4), (1, 7)], "batches": [shared_batch]}, 0)
    for c in "kv":
        assert np.std(alone[c] - 1) == pytest.approx(0.25, rel=0.1)
        np.testing.assert_allclose(shared[c], alone[c], rtol=1e-5)
        n = min(len(neighbour[c]), len(alone[c]))
        assert not np.allclose(neighbour[c][:n], alone[c][:n]), "another item must get other noise"


def generate(model, spec, n_seq, seed=0, stop=None):
    prompts = [model.tokenize(t) for t in TEXTS]
    with Context(model, error=parse_error(spec), n_seq=n_seq, n_ctx=n_seq * 64, seed=seed) as ctx:
        out = dict(generate_all(ctx, prompts, 12, stop=stop, items=range(len(prompts))))
        sites = dict(ctx.hook.site_counts) if ctx.hook else {}
    return [out[i].tokens for i in range(len(prompts))], sites


def test_parallel_generation_reproduces_sequential_outputs_on_cpu(tiny):
    """Sequences of different lengths (a stop rule on the tokens) so that finished ones are
    refilled while others run; every output equals the sequential one, noise included."""

    def stop(tokens):
        return tokens[-1] % 5 == 0

    sequential, _ = generate(tiny, "normal:0,0.25", 1, stop=stop)
    parallel, sites = generate(tiny, "normal:0,0.25", 3, stop=stop)
    assert len({len(o) for o in sequential}) > 1, "the test needs outputs of different lengths"
    assert parallel == sequential
    other_seed, _ = generate(tiny, "normal:0,0.25", 3, seed=1, stop=stop)
    assert other_seed != sequential
    # Fewer decodes than tokens: generated tokens of several sequences shared decodes.
    n_tokens = sum(len(o) for o in parallel)
    assert sites[("k", 0)] < len(TEXTS) + n_tokens


@pytest.fixture(scope="module")
def tiny_q4(tmp_path_factory, default_model_path):
    """The tiny model with quantized weights, whose matrix products compute each row alone (the
    tiny model's f16 ones sum a row otherwise when several rows share a decode)."""
    types = (gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.Q4_1)
    path = write_model(tmp_path_factory.mktemp("models") / "tiny-q4.gguf", default_model_path, replace(TINY, types=types))
    with Model(str(path)) as model:
        yield model


def test_a_stream_per_sequence_gives_sequential_logits_bit_for_bit(tiny_q4):
    """With flash attention off, attention over a pool the sequences share sums each row over
    every cell in use up to the last, the other sequences' masked ones too, and the logits move
    (on this machine, one item's of ten here); with a stream of cells per sequence every logit of
    every pick equals sequential decoding's, noise included, while finished sequences are
    refilled and the others' steps split around them (runs of consecutive sequences, each one
    graph, or the hook would miss its sites)."""
    prompts = [tiny_q4.tokenize(f"{t} {t}") for t in TEXTS * 2]

    def logits(n_seq):
        cache = CacheOptions("f16", "f16", "off")
        with Context(tiny_q4, cache, parse_error("normal:0,0.25"), n_seq=n_seq, n_ctx=n_seq * 128, seed=2, streams=True) as ctx:
            assert ctx.streams == (n_seq > 1)
            out = dict(generate_all(ctx, prompts, 24, ignore_eos=True, items=range(len(prompts)), keep_logits=True))
        return [out[i].logits for i in range(len(prompts))]

    for seq, par in zip(logits(1), logits(3)):
        assert np.array_equal(par, seq)


def test_greedy_generation_picks_what_a_token_by_token_loop_picks(tiny_q4):
    """generate_all's greedy tokens, three sequences at a time refilled as they stop, against a
    plain loop over one sequence's context: each prompt decoded, then each decode's argmax fed
    back, one token at a time, to the same stop (with a stream of cells per sequence, the same
    logits)."""
    cache = CacheOptions("f16", "f16", "off")
    prompts = [tiny_q4.tokenize(t) for t in TEXTS * 2]

    def stop(tokens):
        return tokens[-1] % 5 == 0

    def alone(prompt):
        with Context(tiny_q4, cache, n_ctx=128) as ctx:
            ctx.prefill(prompt)
            logits, out = ctx.logits(-1), []
            while True:
                token = int(np.argmax(logits))
                if tiny_q4.is_eog(token):
                    return out
                out.append(token)
                if stop(out) or len(out) == 16:
                    return out
                ctx.decode([(token, len(prompt) + len(out) - 1, 0, True)])
                logits = ctx.logits(0)

    expected = [alone(p) for p in prompts]
    assert len({len(o) for o in expected}) > 1, "the test needs outputs of different lengths"
    with Context(tiny_q4, cache, n_seq=3, n_ctx=3 * 128, streams=True) as ctx:
        out = dict(generate_all(ctx, prompts, 16, stop=stop))
    assert [out[i].tokens for i in range(len(prompts))] == expected


def test_sampled_generation_draws_the_same_tokens_sequentially_and_in_parallel(tiny_q4):
    """With a temperature each item samples from its own generator, seeded by (seed, run, item)
    whichever sequence it runs on: the same tokens three at a time as one at a time, others with
    another seed."""
    cache = CacheOptions("f16", "f16", "off")
    prompts = [tiny_q4.tokenize(t) for t in TEXTS]

    def sample(n_seq, seed=0):
        with Context(tiny_q4, cache, n_seq=n_seq, n_ctx=n_seq * 128, seed=seed, streams=True) as ctx:
            out = dict(generate_all(ctx, prompts, 12, temperature=0.8, items=range(len(prompts)), ignore_eos=True))
        return [out[i].tokens for i in range(len(prompts))]

    alone = sample(1)
    assert sample(3) == alone
    assert sample(3, seed=1) != alone


def test_a_cache_resident_model_and_shared_cells_need_one_pool(tiny):
    with pytest.raises(InjectionError, match="cannot run with a stream per sequence"):
        Context(tiny, error=parse_error("evict:window,0.5"), n_seq=2, n_ctx=128, streams=True)
    with Context(tiny, n_seq=2, n_ctx=128, streams=True) as ctx:
        ctx.decode([(t, i, 0, i == 3) for i, t in enumerate(tiny.tokenize(TEXTS[0])[:4])])
        with pytest.raises(InjectionError, match="cannot share cells"):
            ctx.share(0, 1)


@pytest.fixture(scope="module")
def tiny_models(tiny_path):
    models = {n: Model(str(tiny_path), BackendOptions(parallel=n)) for n in (1, 4)}
    yield models
    for m in models.values():
        m.close()


def test_benchmarks_score_the_same_sequentially_and_in_parallel(tiny_models):
    configs = [Configuration.parse("none"), Configuration.parse("normal:0,0.25")]
    results = {}
    for n, model in tiny_models.items():
        benches = [NextToken(limit=12), Perplexity(chunks=6, ctx=64)]
        results[n] = {(r.bench, r.config.label, r.run): r for r in run(model, benches, configs, runs=2, seed=0)}
    assert results[1].keys() == results[4].keys()
    for key, seq in results[1].items():
        par = results[4][key]
        if key[0] == "nexttoken":
            assert par.outputs == seq.outputs and par.items == seq.items
        else:
            for metric, value in seq.metrics.items():
                assert par.metrics[metric] == pytest.approx(value, rel=1e-5, abs=1e-7), (key, metric)
    noisy = [r for k, r in results[4].items() if k[1] != "none"]
    assert noisy[0].metrics != noisy[1].metrics, "the two runs must differ"


def test_a_steps_greedy_picks_are_each_rows_and_nonfinite_rows_are_left_to_the_step():
    """The picks of a generation step, computed for its rows at once, against each row's own
    argmax; a row holding a NaN or an infinity (anywhere) gets no pick, so that the step counts it
    and picks after replacing NaN, as for a row decoded alone."""
    from kvinject.engine.generation.batching import _picks

    rows = np.random.default_rng(0).standard_normal((6, 50)).astype(np.float32)
    rows[1, 7] = np.nan
    rows[2, 3] = np.inf
    rows[3, 40] = -np.inf
    rows[4, :] = rows[4, 0]  # ties: the first
    given = type("Decoded", (), {"output_logits": lambda self, n: rows[:n]})()
    view, picks = _picks(given, 6, 0.0)
    assert view is rows or np.shares_memory(view, rows)
    assert picks == [int(np.argmax(r)) if np.isfinite(r).all() else None for r in rows]
    assert picks[1:4] == [None, None, None] and picks[4] == 0
    assert _picks(given, 6, 0.7)[1] == [None] * 6, "sampling picks in the step, from its sequence's generator"


def test_a_fault_campaign_classifies_every_item_alike_sequentially_and_in_parallel(tiny_q4):
    """faults:K places its faults per item and keeps its cells in a stream of the item's own:
    at --parallel 4 every item gets the faults, tokens and outcome it gets at --parallel 1
    (what docs/faults.md tells campaigns)."""
    configs = [Configuration.parse(c) for c in ("none", "faults:1", "faults:1,bit=14", "faults:1@bf16", "faults:1,field=scale@q8_0")]
    results = {}
    for n in (1, 4):
        with Model(str(tiny_q4.path), BackendOptions(parallel=n)) as model:
            results[n] = [(r.config.label, r.faults, r.outputs, r.items) for r in run(model, [NextToken(limit=16)], configs, runs=1, seed=0)]
    assert repr(results[4]) == repr(results[1])  # NaN scores (a DUE item's) compare as text
    outcomes = [o for label, _, _, items in results[1] if label != "none" for o in ("masked", "benign", "sdc", "due") if any(items[o])]
    assert len(set(outcomes)) > 1, "the test needs faults with different outcomes"
