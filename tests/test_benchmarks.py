"""Benchmarks on the tiny model and small data: loading, scoring, statistics wiring, bad input."""

from __future__ import annotations

import math
import os

import numpy as np
import pytest

from kvinject.analysis.aggregate import aggregate
from kvinject.benchmarks import IFEval, NextToken, Perplexity, make_bench
from kvinject.benchmarks.base import token_divergence
from kvinject.benchmarks.ifeval.bench import load_items
from kvinject.benchmarks.nexttoken import log_softmax, make_snippets
from kvinject.engine.context import Context
from kvinject.error_models.configuration import Configuration
from kvinject.exceptions import DataError, SpecError
from kvinject.experiments.runner import run

from .conftest import SHARED

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")
WIKITEXT = SHARED / "data/wikitext-2-raw/wiki.test.raw"
IFEVAL = SHARED / "data/ifeval/input_data.jsonl"
needs_shared = pytest.mark.skipif(not WIKITEXT.exists() or not IFEVAL.exists(), reason="../shared/data not present")

CONTROL, NOISY, QUANT = (Configuration.parse(s) for s in ("none", "normal:0,0.5", "none@q8_0"))


def test_snippets_skip_headings_undo_wikitext_marks_and_do_not_overlap():
    text = " = Title = \n\n one two three @-@ four five , six seven eight nine ten eleven twelve\n\n = = Sub = = \n\n short para\n"
    snippets = make_snippets(text, n_words=5)
    assert [(s.prompt, s.target) for s in snippets] == [("one two three-four five,", "six"), ("seven eight nine ten", "eleven")]


def test_bundled_corpus_gives_over_1000_snippets_spread_over_it():
    from kvinject.data import read_text

    text = read_text(None, "encyclopedia")
    assert len(make_snippets(text)) >= 1000
    spread = make_snippets(text, limit=10)
    assert len(spread) == 10 and spread[0] != spread[1]
    assert all(len(s.prompt.split()) == 9 for s in spread)


@needs_shared
def test_wikitext_file_loads_as_snippets():
    assert len(NextToken(data=str(WIKITEXT), limit=1000)) == 1000


@needs_shared
def test_ifeval_data_loads_from_a_file_and_through_datasets(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    local = tmp_path / "ifeval"
    local.mkdir()
    (local / "input_data.jsonl").symlink_to(IFEVAL)
    from_file = load_items(str(IFEVAL))
    from_hub = load_items(f"hf:{local}@train")
    assert len(from_file) == len(from_hub) == 541
    assert [i.prompt for i in from_file[:20]] == [i.prompt for i in from_hub[:20]]


def test_bundled_ifeval_set_covers_every_instruction_and_the_study_subset():
    from kvinject.benchmarks.ifeval import INSTRUCTIONS

    bench = IFEval()
    ids = {i for item in bench.items for i in item.instruction_id_list}
    assert len(bench) >= 150 and ids == set(INSTRUCTIONS)
    assert len(IFEval(exclude_instructions=("length_constraints:number_words",))) >= 128


def test_malformed_data_names_the_file_and_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"key": 1, "prompt": "p", "instruction_id_list": ["punctuation:no_comma"], "kwargs": [{}]}\n{"key": 2,\n')
    with pytest.raises(DataError, match=r"bad.jsonl:2: bad JSON"):
        IFEval(data=str(bad))
    with pytest.raises(DataError, match="cannot read"):
        NextToken(data=str(tmp_path / "missing.txt"))


def test_divergence_counts_differing_outputs_and_first_difference():
    # Token match per item: 3 of 3 positions agree, 1 of 2, 1 of 2 (the longer output counts).
    metrics, items = token_divergence([[1, 2, 3], [4, 5], [6]], [[1, 2, 3], [4, 9], [6, 7]])
    assert metrics == {"diverged": 2 / 3, "first_diff": 1.0, "token_match": (1 + 1 / 2 + 1 / 2) / 3}
    assert items == {"diverged": [0, 1, 1], "token_match": [1, 1 / 2, 1 / 2]}


def test_perplexity_matches_an_independent_per_position_computation(tiny, tmp_path):
    """The benchmark decodes several chunks at once and reads all logits together; recompute
    each scored position of each chunk on its own and compare (float32 exponentials, as in
    llama-perplexity, against float64 here)."""
    from kvinject.data import read_text

    bench = Perplexity(chunks=2, ctx=64)
    (result,) = run(tiny, [bench], [CONTROL], runs=1)
    tokens = tiny.tokenize(read_text(None, "encyclopedia"), add_special=True, parse_special=False)
    nll = []
    with Context(tiny, n_ctx=64, n_batch=64) as ctx:
        for chunk in range(2):
            piece = tokens[chunk * 64 : (chunk + 1) * 64]
            ctx.clear()
            ctx.decode([(t, pos, 0, True) for pos, t in enumerate(piece)])
            for pos in range(32, 63):
                nll.append(-log_softmax(ctx.logits(pos))[piece[pos + 1]])
    assert result.metrics["ppl"] == pytest.approx(math.exp(np.mean(nll)), rel=1e-6)
    assert len(result.items["mean_nll"]) == 2


@pytest.mark.parametrize("decode_tokens", [512, 16])
def test_kld_same_top_and_rms_dp_match_an_independent_computation(tiny, monkeypatch, decode_tokens):
    """3-bit quantization of K and V against the control, as llama-perplexity --kl-divergence
    defines them:
    KL(control || configuration) per scored position, the share of positions whose argmax
    agrees, and the RMS of the change in the true token's probability, each chunk on its own
    here; the per-chunk items give the same values (the intervals' data). With decodes of 16
    tokens, each chunk is decoded in 4 pieces, 2 of them scored, every job's in turn: the
    comparison gathers a chunk's rows over its pieces."""
    from kvinject.data import read_text
    from kvinject.engine.model import Model

    monkeypatch.setattr(Model, "decode_tokens", property(lambda self: decode_tokens))

    bench = Perplexity(chunks=2, ctx=64)
    coarse = Configuration.parse("quant:3")
    _, result = run(tiny, [bench], [CONTROL, coarse], runs=1)
    tokens = tiny.tokenize(read_text(None, "encyclopedia"), add_special=True, parse_special=False)
    kld, same, dp = [], [], []
    for chunk in range(2):
        piece = tokens[chunk * 64 : (chunk + 1) * 64]
        rows = {}
        for name, error in (("base", None), ("quant", coarse.error)):
            span = min(64, decode_tokens)  # each chunk decoded as the bench decodes it
            rows[name] = []
            with Context(tiny, error=error, n_ctx=64, n_batch=span) as ctx:
                for a in range(0, 64, span):
                    ctx.decode([(piece[pos], pos, 0, True) for pos in range(a, a + span)])
                    rows[name] += [log_softmax(ctx.logits(pos - a)) for pos in range(max(a, 32), min(a + span, 63))]
            rows[name] = np.array(rows[name])
        base, q = rows["base"], rows["quant"]
        kld += list((np.exp(base) * (base - q)).sum(axis=1))
        same += list(base.argmax(axis=1) == q.argmax(axis=1))
        targets = np.array(piece[33:64])
        dp += list(np.exp(q[np.arange(31), targets]) - np.exp(base[np.arange(31), targets]))
    m = result.metrics
    assert m["kld"] > 1e-2 and m["kld"] == pytest.approx(np.mean(kld), rel=1e-3)
    assert m["same_top_p"] == pytest.approx(np.mean(same), abs=1 / 62) and m["rms_dp"] == pytest.approx(math.sqrt(np.mean(np.square(dp))), rel=1e-3)
    items = result.items
    assert np.mean(items["same_top_p"]) == pytest.approx(m["same_top_p"]) and math.sqrt(np.mean(items["mean_dp2"])) == pytest.approx(m["rms_dp"])


def test_kld_is_from_the_control_to_the_configuration():
    """KL(control || configuration). The tiny model's distributions are too even for the two
    directions to differ (0.4602 against 0.4603 under quant:2), so the scoring is given a
    peaked control and a flat configuration, where they differ several-fold."""
    from kvinject.benchmarks.perplexity import _Base, _score, _Scratch, _Tally

    rng = np.random.default_rng(0)
    peaked, flat = (rng.normal(size=(6, 40)).astype(np.float32) * scale for scale in (6, 0.5))
    targets = rng.integers(0, 40, 6)
    scratch, base, tally = _Scratch(6, 40), _Base(6, 40), _Tally()
    _score(_Tally(), peaked.copy(), targets, scratch, None, base)  # the control's chunk
    _score(tally, flat.copy(), targets, scratch, base, None)
    lp, lf = log_softmax(peaked), log_softmax(flat)
    forward, reverse = (np.exp(lp) * (lp - lf)).sum(axis=1).mean(), (np.exp(lf) * (lf - lp)).sum(axis=1).mean()
    assert tally.kld / tally.compared == pytest.approx(forward, rel=1e-5) and max(forward, reverse) > 2 * min(forward, reverse)


def test_scoring_in_blocks_of_rows_gives_each_figure_of_the_whole_chunk(monkeypatch):
    """Rows are scored a block at a time (work arrays of a whole chunk grew to gigabytes at long
    contexts), by several threads side by side, and a long context's control probabilities are
    computed again per job instead of kept; each row's arithmetic is the same, so every figure is
    bit for bit that of one block; a row of NaN in any thread's block marks the chunk."""
    from kvinject.benchmarks import perplexity
    from kvinject.benchmarks.perplexity import _Base, _score, _Scratch, _Tally

    rng = np.random.default_rng(3)
    control, job = (rng.normal(size=(7, 50)).astype(np.float32) * scale for scale in (4, 2))
    targets = rng.integers(0, 50, 7)

    def tallies(block_rows: int, kept: bool = True, threads: int = 1, scored: np.ndarray = job) -> list[dict]:
        monkeypatch.setattr(perplexity, "BLOCK_BYTES", block_rows * 4 * 50 * threads)
        monkeypatch.setattr(perplexity, "BASE_BYTES", 7 * 50 * 4 if kept else 0)
        scratch, base, first, second = _Scratch(7, 50, threads), _Base(7, 50), _Tally(), _Tally()
        assert scratch.block == block_rows and (base.p is not None) == kept
        _score(first, control, targets, scratch, None, base)
        _score(second, scored, targets, scratch, base, None)
        return [vars(first), vars(second)]

    whole = tallies(7)
    assert whole[1]["compared"] == 7 and whole[1]["kld"] > 0
    assert tallies(2) == whole and tallies(1) == whole
    assert tallies(7, kept=False) == whole and tallies(3, kept=False) == whole, "the control's probabilities computed again"
    assert tallies(2, threads=3) == whole and tallies(1, threads=4) == whole and tallies(3, kept=False, threads=2) == whole
    broken = job.copy()
    broken[5, 7] = np.nan  # in the third block of 2 rows, the third thread's
    nonfinite = tallies(2, threads=3, scored=broken)[1]
    assert nonfinite["nonfinite"] == 1 and nonfinite["count"] == 0 and math.isnan(nonfinite["chunk_nll"][0])


def test_a_run_compares_each_configuration_with_the_control(tiny):
    benches = [NextToken(limit=6), Perplexity(chunks=2, ctx=64), IFEval(data=os.path.join(FIXTURES, "ifeval/input_data.jsonl"), max_tokens=8)]
    results = list(run(tiny, benches, [CONTROL, NOISY, QUANT], runs=3, seed=1))
    runs = {(r.bench, r.config.label): 0 for r in results}
    for r in results:
        runs[r.bench, r.config.label] += 1
    # Deterministic configurations (greedy control, native q8_0 cache) run once; noise runs 3 times.
    assert set(runs.values()) == {1, 3} and all(runs[b, "normal:0,0.5"] == 3 for b in ("nexttoken", "perplexity", "ifeval"))
    for bench in benches:
        rows = {(a["label"], a["metric"]): a for a in aggregate(bench, [r for r in results if r.bench == bench.name])}
        control, noisy = rows["none", bench.primary], rows["normal:0,0.5", bench.primary]
        assert control["test"] is None and noisy["test"] is not None
        assert control["diff_ci"] is None and noisy["diff_ci"][0] <= noisy["diff_ci"][1]
        # Over items: one run of pass/fail values gets Wilson's interval, anything else the bootstrap.
        one_binary = bench.proxies.get(bench.primary, (bench.primary,))[0] in bench.pass_fail(bench.options)
        assert (control["items_ci_method"], noisy["items_ci_method"]) == ("wilson" if one_binary else "bootstrap", "bootstrap")
        # The paired ratio's interval: undefined where the control scores 0 (the tiny model's ifeval).
        assert noisy["percent_ci"][0] <= noisy["percent_ci"][1] or (control["mean"] == 0 and all(map(math.isnan, noisy["percent_ci"])))
        assert noisy["n"] == 3 and control["n"] == 1 and math.isnan(control["ci_low"])
        assert control["percent_of_control"] == pytest.approx(100.0) or control["mean"] == 0
    noisy_runs = [r for r in results if r.bench == "perplexity" and r.config.label == "normal:0,0.5"]
    assert all(r.metrics["kld"] > 0 and r.metrics["same_top_p"] < 1 for r in noisy_runs)
    assert len({r.metrics["ppl"] for r in noisy_runs}) == 3, "each run draws its own noise"
    assert all(r.realized.k.values > 0 for r in noisy_runs)


def test_extreme_error_is_counted_not_fatal(tiny):
    nan_error = Configuration.parse("bitflip:0.3,field=exponent")
    results = list(run(tiny, [NextToken(limit=3), Perplexity(chunks=1, ctx=64)], [CONTROL, nan_error, Configuration.parse("uniform:-2,2")], runs=1))
    flipped = [r for r in results if r.config.label == nan_error.label]
    assert len(flipped) == 2 and all(r.nonfinite_items > 0 for r in flipped)
    assert all(r.realized.k.nonfinite > 0 for r in flipped)


def test_perplexity_in_batches_of_contexts_gives_the_same_results(tiny, monkeypatch):
    """Jobs run a batch of contexts at a time, each batch with the control recomputed: the same
    figures as all at once, the control reported once."""
    import kvinject.benchmarks.perplexity as perplexity_module
    from kvinject.experiments.runner import run

    configs = [Configuration(), *(Configuration.parse(s) for s in ("normal:0,0.5", "quant:4", "signflip:0.05"))]
    bench = make_bench("perplexity", {"ctx": 64, "chunks": 3})
    together = [r.to_dict() for r in run(tiny, [bench], configs, runs=1)]
    monkeypatch.setattr(perplexity_module, "MAX_BATCH", 2)
    batched = [r.to_dict() for r in run(tiny, [bench], configs, runs=1)]
    for record in together + batched:
        record.pop("seconds")
    assert batched == together


@pytest.mark.parametrize("step", [1, 7])
def test_stepped_perplexity_matches_an_independent_per_position_computation(tiny, step):
    """With ``step`` each chunk's first half is one decode and its scored half STEP tokens a
    decode (7 leaves a shorter last step); recompute each scored position so, chunk by chunk
    (one chunk a decode: llama.cpp's kernels sum in another order for other batch shapes)."""
    from kvinject.data import read_text

    (result,) = run(tiny, [Perplexity(chunks=1, ctx=64, step=step)], [CONTROL], runs=1)
    piece = tiny.tokenize(read_text(None, "encyclopedia"), add_special=True, parse_special=False)[:64]
    nll = []
    with Context(tiny, n_ctx=64, n_batch=64) as ctx:
        ctx.decode([(t, pos, 0, False) for pos, t in enumerate(piece[:32])])
        for start in range(32, 64, step):
            ctx.decode([(piece[pos], pos, 0, True) for pos in range(start, min(start + step, 64))])
            nll += [-log_softmax(ctx.logits(i))[piece[pos + 1]] for i, pos in enumerate(range(start, min(start + step, 63)))]
    assert result.metrics["ppl"] == pytest.approx(math.exp(np.mean(nll)), rel=1e-6)


def test_a_long_chunk_is_decoded_in_llama_perplexity_s_ubatches(tiny, monkeypatch):
    """A chunk longer than a decode (512 tokens on a CPU) is decoded in pieces of 512 from
    position 0, as llama-perplexity's ubatches cut it, every job's piece in turn, so no context
    holds more than one piece's logits (a whole scored half of Gemma 3 at --ctx 8192 was 4.3 GB,
    twice). Recomputed so, piece by piece, each scored position gives the same NLL; decoded at
    once, the figure agrees to float32 rounding (llama.cpp's kernels may sum in another order
    for other batch shapes)."""
    from kvinject.data import read_text
    from kvinject.engine.model import Model

    bench = Perplexity(chunks=1, ctx=2048)
    assert bench.decodes(512) == [(0, 512), (512, 1024), (1024, 1536), (1536, 2048)]
    (pieces,) = run(tiny, [bench], [CONTROL], runs=1)
    piece = tiny.tokenize(read_text(None, "encyclopedia"), add_special=True, parse_special=False)[:2048]
    nll = []
    with Context(tiny, n_ctx=2048, n_batch=512) as ctx:
        for start in range(0, 2048, 512):
            ctx.decode([(piece[pos], pos, 0, pos >= 1024) for pos in range(start, start + 512)])
            if start >= 1024:
                nll += [-log_softmax(ctx.logits(i))[piece[pos + 1]] for i, pos in enumerate(range(start, min(start + 512, 2047)))]
    assert len(nll) == 1023 and pieces.metrics["ppl"] == pytest.approx(math.exp(np.mean(nll)), rel=1e-6)
    monkeypatch.setattr(Model, "decode_tokens", property(lambda self: 4096))  # the whole chunk in one decode
    (once,) = run(tiny, [bench], [CONTROL], runs=1)
    assert once.metrics["ppl"] == pytest.approx(pieces.metrics["ppl"], rel=1e-6)


@pytest.mark.parametrize("spec", ["kivi:2,group=8,residual=8", "evict:window,16"])
def test_cache_resident_compressors_change_perplexity_only_when_stepped(tiny, spec):
    """A chunk decoded at once never reads its cache after KIVI or eviction acted on it (it gave
    the control's figures exactly): refused, naming --step, before anything runs. Stepped, the
    scored tokens attend to what they left."""
    configs = [CONTROL, Configuration.parse(spec)]
    with pytest.raises(SpecError, match="--step"):
        next(run(tiny, [Perplexity(chunks=2, ctx=64)], configs, runs=1))
    _, stepped = (r.metrics for r in run(tiny, [Perplexity(chunks=2, ctx=64, step=1)], configs, runs=1))
    assert stepped["kld"] > 1e-4 and stepped["bits"] < 16
