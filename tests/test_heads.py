"""--heads against real llama.cpp on the tiny model (2 KV heads of 64 components): exactly the
selected heads' components of K and V get the error, read back from the cache against a clean
replay (tests/replay.py), on the compiled multiplication, the compiled rounding and the Python
fallback."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from kvinject.benchmarks import make_bench
from kvinject.engine.context import Context
from kvinject.engine.target import Target
from kvinject.error_models import parse_error
from kvinject.error_models.configuration import Configuration
from kvinject.exceptions import SpecError
from kvinject.experiments.grid import GridError, build_grid
from kvinject.experiments.runner import run
from kvinject.experiments.store import Store

from .cli_runs import kvinject
from .replay import F32, Recorded, assert_selecting_everything_changes_nothing, prefill_and_step

PROMPT = "The quick brown fox jumps over the lazy dog while the cat watches from the warm window sill."
PATHS = ["normal:0,0.25", "float:e2m1", "quant:4", "bitflip:0.01,field=mantissa"]  # compiled multiplication, compiled rounding, Python, Python from fp16


def head_columns(tiny, heads):
    return np.isin(np.arange(tiny.n_head_kv * tiny.head_dim_k) // tiny.head_dim_k, heads)


@pytest.mark.parametrize("error", PATHS)
@pytest.mark.parametrize("heads", [[0], [1]])
def test_heads_reach_exactly_their_components(tiny, error, heads):
    assert tiny.n_head_kv == 2 and tiny.head_dim_k == tiny.head_dim_v
    rec = Recorded(tiny, error, Target.parse("kv", heads=",".join(map(str, heads))))
    prefill_and_step(rec, tiny.tokenize(PROMPT))
    _, changed = rec.changed()
    for c in "kv":
        assert np.array_equal(changed[c].any(axis=0), head_columns(tiny, heads)), c  # every component of the head, no other
        assert changed[c][:, head_columns(tiny, heads)].any(axis=1).all(), c  # at every position
    rec.close()


@pytest.mark.parametrize("error", PATHS)
def test_heads_compose_with_target_and_positions(tiny, error):
    rec = Recorded(tiny, error, Target.parse("k", None, "first:4", "1"))
    prefill_and_step(rec, tiny.tokenize(PROMPT))
    pos, changed = rec.changed()
    want = np.outer(pos < 4, head_columns(tiny, [1]))
    assert not changed["v"].any()
    assert not (changed["k"] & ~want).any(), "a value outside positions 0-3 of head 1 changed"
    assert changed["k"][pos < 4][:, head_columns(tiny, [1])].any(axis=1).all()
    rec.close()


@pytest.mark.parametrize("error", PATHS)
def test_every_head_is_bit_identical_to_no_selection(tiny, error):
    """Every layer's cache, the logits and the realized statistics, with sequences sharing decodes."""
    assert_selecting_everything_changes_nothing(tiny, error, [Target(), Target.parse("kv", heads="0-1")], [PROMPT, "Rivers carry sediment", "A short one"])


@pytest.mark.parametrize("error", PATHS)
def test_realized_statistics_count_the_selected_head_apart(tiny, error):
    rec = Recorded(tiny, error, Target.parse("kv", heads="0"))
    n = prefill_and_step(rec, tiny.tokenize(PROMPT), steps=6)
    summary = rec.ctx.realized.summary()
    head = tiny.n_layer * tiny.head_dim_k  # one head's components over the layers, per token
    for c in "kv":
        inside, other, total = summary["selection"]["selected"][c], summary["selection"]["other"][c], summary[c]
        assert inside["values"] == other["values"] == n * head and total["values"] == 2 * n * head
        assert other["changed"] == 0 and other["rel_err_std"] == 0
        assert inside["changed"] == total["changed"] > 0
        if error.startswith("normal"):
            assert inside["rel_err_std"] == pytest.approx(0.25, rel=0.1)
        if error.startswith("bitflip"):  # in the F32 cache's format: 23 mantissa bits, each flipped at 0.01
            assert inside["changed"] / inside["values"] == pytest.approx(1 - 0.99**23, abs=0.02)
    rec.close()


def test_kvquant_keys_by_head_keep_their_sinks(tiny):
    """K per channel before RoPE (RoPE turns pairs of one head's components), the first token
    exact: exactly head 1 of every later position changes."""
    rec = Recorded(tiny, "kvquant:4,sinks=1,calib=64", Target.parse("k", heads="1"))
    prefill_and_step(rec, tiny.tokenize(PROMPT))
    pos, changed = rec.changed()
    want = np.outer(pos >= 1, head_columns(tiny, [1]))
    assert not changed["v"].any() and not (changed["k"] & ~want).any()
    assert changed["k"][pos >= 1][:, head_columns(tiny, [1])].any(axis=1).all()
    rec.close()


@pytest.mark.parametrize(
    "spec,target,message",
    [
        ("quant:4,group=128", "kv", "'quant:4,group=128' on K: it computes 128 components together, across KV heads of 64"),
        ("float:e4m3,block=128", "v", "'float:e4m3,block=128' on V"),
        ("kvquant:4", "v", "'kvquant:4,site=pre-rope' on V: it computes 128 components together"),
    ],
)
def test_groups_across_heads_are_refused(tiny, spec, target, message):
    with pytest.raises(SpecError, match=message):
        Context(tiny, F32, parse_error(spec), Target.parse(target, heads="0"))
    bench = make_bench("perplexity", {"ctx": 64, "chunks": 1})
    with pytest.raises(SpecError, match=message):  # before the control runs
        list(run(tiny, [bench], [Configuration(), Configuration.parse(spec, Target.parse(target, heads="0"))], runs=1))
    Context(tiny, F32, parse_error("quant:4,group=64"), Target.parse("kv", heads="0")).close()  # a group of one head
    Context(tiny, F32, parse_error("kvquant:4,calib=64"), Target.parse("k", heads="0")).close()  # K per channel


def test_a_head_the_model_lacks_and_models_that_cannot_select_heads_are_refused(tiny):
    bench = make_bench("perplexity", {"ctx": 64, "chunks": 1})
    with pytest.raises(SpecError, match="--heads names KV head 2, but the model has KV heads 0-1"):
        list(run(tiny, [bench], [Configuration(), Configuration.parse("normal:0,0.1", Target.parse("kv", heads="2"))], runs=1))
    with pytest.raises(SpecError, match="--heads does not apply to 'kivi'"):
        Configuration.parse("kivi:2", Target.parse("kv", heads="0"))
    with pytest.raises(SpecError, match="--heads does not apply to 'faults'.*use bitflip:P"):
        Configuration.parse("faults:1", Target.parse("kv", heads="0"))
    with pytest.raises(SpecError, match="--positions does not apply to 'faults'"):
        Configuration.parse("faults:1", Target.parse("kv", None, "first:4"))


def test_labels_keys_and_grids_name_heads_only_when_given():
    config = Configuration.parse("normal:0,0.25", Target.parse("k", "0", None, "1"))
    assert config.label == "normal:0,0.25 [k:0 heads:1]"
    assert config.to_dict()["heads"] == "1"
    assert "heads" not in Configuration.parse("normal:0,0.25", Target.parse("k", "0")).to_dict()
    raw = {
        "sweep": {"models": ["m.gguf"], "heads": ["all", "0", "1"]},
        "bench": {"perplexity": {}},
        "errors": [{"spec": "normal:0,0.5"}],
        "cells": [{"error": "quant:4", "target": "v", "heads": "0-1"}],
    }
    grid = build_grid("g.toml", raw)
    assert [c.config.label for c in grid.cells] == [
        "none",
        "normal:0,0.5",
        "normal:0,0.5 [kv:all heads:0]",
        "normal:0,0.5 [kv:all heads:1]",
        "quant:4,group=32 [v:all heads:0-1]",
    ]
    with pytest.raises(GridError, match=r"g.toml: \[sweep\]: bad heads 'x'") as e:
        build_grid("g.toml", {**raw, "sweep": {"models": ["m.gguf"], "heads": ["x"]}})
    assert "\n" not in str(e.value)
    with pytest.raises(GridError, match=r"g.toml: cells\[0\]: --heads does not apply to 'faults'"):
        build_grid("g.toml", {**raw, "cells": [{"error": "faults:1", "heads": "0"}]})
    with pytest.raises(GridError, match=r"g.toml: errors 'faults:2': --heads does not apply to 'faults'"):
        build_grid("g.toml", {**raw, "errors": [{"spec": "faults:2"}]})


def test_profile_by_head_maps_each_head_as_a_targeted_run_measures_it(tmp_path, tiny_path, tiny):
    store, csv = tmp_path / "p.sqlite", tmp_path / "p.csv"
    args = ["--model", tiny_path, "--error", "normal:0,0.5", "--ctx", 64, "--chunks", 1, "--by-head", "--store", store, "--csv", csv]
    out = kvinject("profile", *args, timeout=600)
    assert out.returncode == 0, out.stderr
    table = pd.read_csv(csv, index_col="layer")
    assert list(table.index) == [0, 1] and list(table.columns) == ["k0", "k1", "v0", "v1"]
    with Store(store, readonly=True) as s:
        assert len(list(s.records())) == 1 + 2 * 2 * 2, "the control and one run per layer, component and head"
    bench = make_bench("perplexity", {"ctx": 64, "chunks": 1})
    _, alone = run(tiny, [bench], [Configuration(), Configuration.parse("normal:0,0.5", Target.parse("v", "1", None, "0"))], runs=1)
    assert table.loc[1, "v0"] == pytest.approx(alone.metrics["kld"], rel=1e-12)
    assert (table > 0).all().all()
