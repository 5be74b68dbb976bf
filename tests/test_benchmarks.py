"""Benchmarks on the tiny model and small data: loading, scoring, statistics wiring, bad input."""

from __future__ import annotations

import math
import os

import numpy as np
import pytest

from kvinject.benchmarks import IFEval, NextToken, Perplexity, make_bench
from kvinject.benchmarks.base import divergence
from kvinject.benchmarks.ifeval.bench import load_items
from kvinject.benchmarks.nexttoken import log_softmax, make_snippets
from kvinject.config import Configuration
from kvinject.exceptions import DataError
from kvinject.runner import aggregate, run

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
    metrics, items = divergence([[1, 2, 3], [4, 5], [6]], [[1, 2, 3], [4, 9], [6, 7]])
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
    with tiny.context(n_ctx=64, n_batch=64) as ctx:
        for chunk in range(2):
            piece = tokens[chunk * 64 : (chunk + 1) * 64]
            ctx.clear()
            ctx.decode([(t, pos, 0, True) for pos, t in enumerate(piece)])
            for pos in range(32, 63):
                nll.append(-log_softmax(ctx.logits(pos))[piece[pos + 1]])
    assert result.metrics["ppl"] == pytest.approx(math.exp(np.mean(nll)), rel=1e-6)
    assert len(result.items["mean_nll"]) == 2


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
        one_binary = bench.proxies.get(bench.primary, (bench.primary,))[0] in bench.binary
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
    flipped = [r for r in results if r.config is nan_error]
    assert all(r.nonfinite_items > 0 for r in flipped)
    assert all(r.realized.k.nonfinite > 0 for r in flipped)


def test_perplexity_in_batches_of_contexts_gives_the_same_results(tiny, monkeypatch):
    """Jobs run a batch of contexts at a time, each batch with the control recomputed: the same
    figures as all at once, the control reported once."""
    import kvinject.benchmarks.perplexity as perplexity_module
    from kvinject.runner import run

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
    with tiny.context(n_ctx=64, n_batch=64) as ctx:
        ctx.decode([(t, pos, 0, False) for pos, t in enumerate(piece[:32])])
        for start in range(32, 64, step):
            ctx.decode([(piece[pos], pos, 0, True) for pos in range(start, min(start + step, 64))])
            nll += [-log_softmax(ctx.logits(i))[piece[pos + 1]] for i, pos in enumerate(range(start, min(start + step, 63)))]
    assert result.metrics["ppl"] == pytest.approx(math.exp(np.mean(nll)), rel=1e-6)


@pytest.mark.parametrize("spec", ["kivi:2,group=8,residual=8", "evict:window,16"])
def test_cache_resident_compressors_change_perplexity_only_when_stepped(tiny, spec):
    """A chunk decoded at once never reads its cache after KIVI or eviction acted on it: the
    control's figures exactly. Stepped, the scored tokens attend to what they left."""
    configs = [CONTROL, Configuration.parse(spec)]
    control, at_once = (r.metrics for r in run(tiny, [Perplexity(chunks=2, ctx=64)], configs, runs=1))
    _, stepped = (r.metrics for r in run(tiny, [Perplexity(chunks=2, ctx=64, step=1)], configs, runs=1))
    assert at_once["ppl"] == control["ppl"] and abs(at_once["kld"]) < 1e-6 and at_once["same_top_p"] == 1
    assert stepped["kld"] > 1e-4 and stepped["bits"] < 16
