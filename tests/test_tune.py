"""`kvinject tune` on the tiny model (2 layers): the three sweeps into one store, what they find,
resuming, and the mistakes refused before anything runs."""

from __future__ import annotations

import numpy as np
import pytest

from kvinject.analysis.report import load_records
from kvinject.benchmarks import make_bench
from kvinject.engine.options import BackendOptions, CacheOptions
from kvinject.error_models.configuration import Configuration
from kvinject.exceptions import KvinjectError
from kvinject.experiments.runner import run
from kvinject.experiments.store import Store
from kvinject.experiments.sweep import Sweep
from kvinject.experiments.tune import plan_tuning

from .cli_runs import PNG, kvinject

CHOICES = ["quant:2", "quant:8"]
OPTIONS = {"ctx": 32, "chunks": 3}


def tuning(path, store, bits=5.0, max_metric=None, choices=CHOICES, **more):
    return plan_tuning(str(path), CacheOptions(), BackendOptions(), choices, "perplexity", {**OPTIONS, **more}, None, None, None, bits, max_metric, 1, 0, store)


def execute(store):
    def go(grid):
        with Store(store) as s:
            Sweep(grid, s).run()

    return go


def test_tune_finds_an_allocation_within_its_budget_and_proves_it_on_held_out_chunks(tmp_path, tiny_path, tiny):
    store = tmp_path / "t.sqlite"
    t = tuning(tiny_path, store)
    result = t.run(execute(store), lambda: load_records([store]))
    assert result.chosen.bits <= 5.0 and result.rival is not None and result.rival.spec == "quant:2,group=32"
    uniform = {p.spec: p for p in result.points if p.spec in t.uniform()}
    assert set(uniform) == {"quant:2,group=32", "quant:8,group=32"}
    # The front: nothing run beats one of its points at no more bits.
    for p in result.front:
        assert not any(q.bits <= p.bits and q.value < p.value for q in result.points)
    # The chosen allocation is a spec run takes, and its record on the tuning text is what run measures.
    config = Configuration.parse(result.chosen.spec)
    _, alone = run(tiny, [make_bench("perplexity", OPTIONS)], [Configuration(), config], runs=1)
    assert alone.metrics["kld"] == pytest.approx(result.chosen.value, rel=1e-9)
    held = [r for r in result.records if r["settings"]["options"].get("skip") == 3]
    assert {r["settings"]["error"] for r in held} >= {"none", "quant:2,group=32"} and all(r["settings"]["options"]["chunks"] == 3 for r in held)
    with Store(store, readonly=True) as s:
        stored = len(list(s.records()))
    again = t.run(execute(store), lambda: load_records([store]))  # resumes: nothing left to run
    assert again.chosen == result.chosen
    with Store(store, readonly=True) as s:
        assert len(list(s.records())) == stored


def test_the_spec_of_an_allocation_puts_each_choice_where_it_was_picked(tmp_path, tiny_path):
    t = tuning(tiny_path, tmp_path / "t.sqlite", choices=["none", "quant:2", "quant:4"])
    # cells: K of layers 0, 1, then V of layers 0, 1; choices: exact, quant:2, quant:4
    assert t.spec(np.array([1, 2, 1, 2])) == "quant:2,group=32[kv:0]+quant:4,group=32[kv:1]"
    assert t.spec(np.array([0, 1, 1, 1])) == "quant:2,group=32[k:1]+quant:2,group=32[v]"
    assert t.spec(np.array([2, 2, 2, 2])) == "quant:4,group=32"
    assert t.spec(np.array([0, 0, 0, 0])) == "none"
    config = Configuration.parse(t.spec(np.array([0, 1, 2, 1])))
    assert [(m.spec, w.components, w.layers) for m, w in config.error.parts_on(config.target)] == [
        ("quant:2,group=32", "kv", frozenset({1})),
        ("quant:4,group=32", "v", frozenset({0})),
    ]


def test_skipped_chunks_are_the_same_chunks_as_scored_after_others(tiny):
    """--skip 2 scores chunks 2 and 3 of the text: their per-chunk values are those of a run over
    4 chunks (to float32 summation: the chunks share their decodes with other chunks)."""
    (four,) = run(tiny, [make_bench("perplexity", {"ctx": 32, "chunks": 4})], [Configuration()], runs=1)
    (later,) = run(tiny, [make_bench("perplexity", {"ctx": 32, "chunks": 2, "skip": 2})], [Configuration()], runs=1)
    assert later.items["mean_nll"] == pytest.approx(four.items["mean_nll"][2:], rel=1e-5)


@pytest.mark.parametrize(
    "args,message",
    [
        ([], "give one budget"),
        (["--bits", "3", "--max-metric", "0.1"], "give one budget"),
        (["--bits", "3", "--choice", "quant:2"], "at least two --choice"),
        (["--bits", "3", "--choice", "quant:2[k]+quant:4[v]", "--choice", "quant:8"], "give one error model"),
        (["--bits", "3", "--choice", "evict:knorm,0.5", "--choice", "quant:8"], "removes tokens"),
        (["--bits", "3", "--choice", "quant:2@q8_0", "--choice", "quant:8"], "one per cache"),
        (["--bits", "3", "--metric", "bits"], "what tune spends"),
        (["--bits", "3", "--bench", "nexttoken"], "--holdout-data"),
        (["--bits", "3", "--chunks", "0"], "give --chunks"),
    ],
)
def test_mistakes_are_refused_in_one_line_before_anything_runs(tmp_path, tiny_path, args, message):
    store = tmp_path / "t.sqlite"
    sizes = [] if "--chunks" in args or "--bench" in args else ["--ctx", 32, "--chunks", 2]
    args = [a for a in args if a not in ("--chunks", "0")]  # no --chunks at all
    out = kvinject("tune", "--model", tiny_path, "--store", store, *sizes, *args)
    assert out.returncode != 0 and message in out.stderr and "Traceback" not in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    assert not store.exists()


def test_the_command_prints_the_front_and_the_chosen_spec_and_draws_it(tmp_path, tiny_path):
    store, png, csv = tmp_path / "t.sqlite", tmp_path / "f.png", tmp_path / "f.csv"
    args = ["--model", tiny_path, "--store", store, "--bits", "5", "--ctx", 32, "--chunks", 3, *[a for c in CHOICES for a in ("--choice", c)]]
    dry = kvinject("tune", *args, "--dry-run")
    assert dry.returncode == 0 and "profile: 9 cells" in dry.stdout and not store.exists(), dry.stderr
    out = kvinject("tune", *args, "--plot", png, "--csv", csv, timeout=600)
    assert out.returncode == 0, out.stderr
    assert "held out:" in out.stdout and "wilcoxon p =" in out.stdout
    (spec,) = [line.removeprefix("chosen: ") for line in out.stdout.splitlines() if line.startswith("chosen: ")]
    assert Configuration.parse(spec)  # the chosen allocation, as run takes it
    assert png.read_bytes()[:8] == PNG and csv.read_text().startswith("bits,value,spec")
    md = kvinject("tune", *args, "--format", "markdown")  # the finished store: nothing runs, the tables print
    assert md.returncode == 0 and md.stdout.startswith("|   bits |") and "| held out " in md.stdout and f"chosen: `{spec}`" in md.stdout, md.stderr


def test_no_candidate_within_a_max_metric_says_the_best_found(tmp_path, tiny_path):
    store = tmp_path / "t.sqlite"
    t = tuning(tiny_path, store, bits=None, max_metric=-1.0)
    with pytest.raises(KvinjectError, match="no candidate keeps kld within -1"):
        t.run(execute(store), lambda: load_records([store]))
