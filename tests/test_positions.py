"""--positions against real llama.cpp on the tiny model: exactly the selected cached tokens get
the error. Layer 0's K and V depend only on the token and its position (no earlier injection
reaches them), so each noisy run's layer-0 cache is compared with that of a clean context that
replays the same decodes: the selected positions must differ, every other one must be
bit-identical."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from kvinject.benchmarks import make_bench
from kvinject.engine.context import Context
from kvinject.engine.generation.batching import generate_all
from kvinject.engine.positions import Positions
from kvinject.engine.target import Target
from kvinject.error_models import parse_error
from kvinject.error_models.configuration import Configuration
from kvinject.exceptions import SpecError
from kvinject.experiments.grid import GridError, build_grid

from .replay import F32, Recorded, assert_selecting_everything_changes_nothing, prefill_and_step

PROMPT = "The quick brown fox jumps over the lazy dog while the cat watches from the warm window sill."
PROMPTS = [PROMPT, "Rivers carry sediment from the mountains to the sea", "A short one"]
PATHS = ["normal:0,0.25", "quant:4"]  # the compiled multiplication and the Python fallback


def selected(spec, n, spans=None):
    return set(np.flatnonzero(Positions.parse(spec).select(np.arange(n), spans or {})).tolist())


@pytest.mark.parametrize("spec", ["0-3", "first:2,10-12,20-", "5", "0-"])
@pytest.mark.parametrize("error", PATHS)
def test_ranges_and_first_n_reach_exactly_the_selected_cells(tiny, error, spec):
    rec = Recorded(tiny, error, Target.parse("kv", None, spec))
    n = prefill_and_step(rec, tiny.tokenize(PROMPT))
    diff, everything = rec.differing()
    assert len(everything) == n
    for c in "kv":
        assert diff[c] == selected(spec, n), c
    rec.close()


@pytest.mark.parametrize("error", PATHS)
@pytest.mark.parametrize("spec", ["prompt", "generated", "1-2,generated"])
def test_prompt_and_generated_with_several_sequences_sharing_a_context(tiny, error, spec):
    """Three prompts through two sequences (continuous batching: their generated tokens share
    decodes, each row with its own selection); the two left in the cache are checked."""
    rec = Recorded(tiny, error, Target.parse("kv", None, spec), n_seq=2)
    prompts = [tiny.tokenize(p) for p in PROMPTS]
    done = list(generate_all(rec.ctx, prompts, max_tokens=6, items=range(3)))
    assert len(done) == 3
    assert any(len(e) == 2 for e in rec.entries), "generated tokens of both sequences shared a decode"
    for seq in (0, 1):
        diff, everything = rec.differing(seq)
        want = selected(spec, max(everything) + 1, rec.marks[seq])
        assert want and want != everything
        for c in "kv":
            assert diff[c] == want, (seq, c)
    rec.close()


def test_the_needle_span_of_passkey_is_the_needle(tiny):
    bench = make_bench("passkey", {"lengths": [256], "depths": [50], "samples": 1, "max_tokens": 4})
    prompts = bench.prompts(tiny)
    (spans,) = bench.item_spans(tiny)
    tokens = prompts[0]
    ((a, b),) = spans["needle"]
    key = bench.items[0].expected[0]
    assert tiny.detokenize(tokens[a:b]).strip() == f"The pass key is {key}. Remember it. {key} is the pass key."
    ((c0, c1),) = spans["context"]
    assert spans["haystack"] == [(c0, a), (b, c1)]
    ((q0, q1),) = spans["question"]
    assert c1 <= q0 and tiny.detokenize(tokens[q0:q1]).strip() == "What is the pass key? Answer with the number only."
    for spec, want in (("needle", set(range(a, b))), ("haystack", set(range(c0, a)) | set(range(b, c1)))):
        rec = Recorded(tiny, "normal:0,0.25", Target.parse("kv", None, spec))
        list(generate_all(rec.ctx, prompts, max_tokens=4, items=[0], spans=[spans]))
        diff, _ = rec.differing()
        assert diff["k"] == diff["v"] == want, spec
        rec.close()


@pytest.mark.parametrize("error", PATHS)
def test_positions_compose_with_target_and_layers(tiny, error):
    rec = Recorded(tiny, error, Target.parse("k", None, "first:4"))
    prefill_and_step(rec, tiny.tokenize(PROMPT))
    diff, _ = rec.differing()
    assert diff == {"k": {0, 1, 2, 3}, "v": set()}
    rec.close()
    rec = Recorded(tiny, error, Target.parse("v", "1", "first:4"))  # layer 1 only: layer 0 is the control's
    n = prefill_and_step(rec, tiny.tokenize(PROMPT))
    diff, _ = rec.differing()
    assert diff == {"k": set(), "v": set()}
    summary = rec.ctx.realized.summary()
    assert summary["k"]["values"] == 0
    assert summary["selection"]["selected"]["v"]["values"] == 4 * tiny.n_head_kv * tiny.head_dim_v
    assert summary["selection"]["other"]["v"]["values"] == (n - 4) * tiny.n_head_kv * tiny.head_dim_v
    rec.close()


@pytest.mark.parametrize("error", [*PATHS, "bitflip:0.01", "signflip:0.1"])
def test_selecting_everything_is_bit_identical_to_no_selection(tiny, error):
    targets = [Target.parse("kv", None, positions) for positions in (None, "0-", "prompt,generated")]
    assert_selecting_everything_changes_nothing(tiny, error, targets, PROMPTS)


@pytest.mark.parametrize("error", PATHS)
def test_realized_statistics_per_span(tiny, error):
    rec = Recorded(tiny, error, Target.parse("kv", None, "first:8"))
    n = prefill_and_step(rec, tiny.tokenize(PROMPT), steps=10)
    summary = rec.ctx.realized.summary()
    row = tiny.n_layer * tiny.n_head_kv * tiny.head_dim_k
    for c in "kv":
        inside, other, total = summary["selection"]["selected"][c], summary["selection"]["other"][c], summary[c]
        assert inside["values"] == 8 * row and other["values"] == (n - 8) * row and total["values"] == n * row
        assert inside["sites"] == other["sites"] == total["sites"]
        assert other["changed"] == 0 and other["rel_err_std"] == 0 and other["snr_db"] == float("inf")
        assert inside["changed"] == total["changed"] > 0
        if error.startswith("normal"):
            assert inside["rel_err_std"] == pytest.approx(0.25, rel=0.1)
            assert total["rel_err_std"] < 0.15  # diluted by the unchanged tokens
    rec.close()


def test_parsing_is_canonical():
    assert Positions.parse("first:4,10,needle").spec == "0-3,10,needle"
    assert Positions.parse("20-,3-4,5-9").spec == "3-9,20-"
    assert Positions.parse("needle, Generated ,prompt").spec == "prompt,generated,needle"
    assert Positions.parse("all") is None and Positions.parse("") is None
    config = Configuration.parse("normal:0,0.25", Target.parse("k", "0", "first:4"))
    assert config.label == "normal:0,0.25 [k:0 pos:0-3]"
    assert config.to_dict()["positions"] == "0-3"
    assert "positions" not in Configuration.parse("normal:0,0.25", Target.parse("k", "0")).to_dict()


@pytest.mark.parametrize(
    "spec,message",
    [
        ("x-y", "'x-y' is not a position, a range A-B or A-, first:N or a span name"),
        ("4-2", "'4-2' selects no position"),
        ("first:0", "'first:0' selects no position"),
        ("first:x", "'first:x' is not a position"),
        ("-3", "'-3' is not a position"),
        ("99999999999", "beyond any position"),
    ],
)
def test_a_bad_spec_is_one_line(spec, message):
    with pytest.raises(SpecError, match=message) as e:
        Positions.parse(spec)
    assert "\n" not in str(e.value)


def test_spans_a_bench_does_not_declare_and_cache_resident_models_are_refused():
    with pytest.raises(SpecError, match="perplexity declares no span 'prompt'"):
        make_bench("perplexity", {}).check(Configuration.parse("normal:0,0.1", Target.parse("kv", None, "prompt")))
    with pytest.raises(SpecError, match=r"nexttoken declares no span 'needle' \(its spans: prompt, generated\)"):
        make_bench("nexttoken", {"limit": 2}).check(Configuration.parse("normal:0,0.1", Target.parse("kv", None, "needle")))
    make_bench("passkey", {"lengths": [256]}).check(Configuration.parse("normal:0,0.1", Target.parse("kv", None, "needle,question,prompt")))
    make_bench("gsm8k", {"limit": 2}).check(Configuration.parse("normal:0,0.1", Target.parse("kv", None, "context,question")))
    with pytest.raises(SpecError, match="--positions does not apply to 'kivi'"):
        Configuration.parse("kivi:2", Target.parse("kv", None, "0-3"))


def test_a_context_refuses_positions_with_a_cache_resident_model(tiny):
    with pytest.raises(SpecError, match="--positions does not apply to 'kivi'"):
        Context(tiny, F32, parse_error("kivi:2"), Target.parse("kv", None, "first:4"))


def test_gsm8k_declares_its_worked_examples_and_the_question(tiny):
    bench = make_bench("gsm8k", {"limit": 1, "shots": 2})
    (tokens,) = bench.prompts(tiny)
    (spans,) = bench.item_spans(tiny)
    ((a, b),) = spans["context"]
    ((c, d),) = spans["question"]
    assert (a, b, d) == (0, c, len(tokens))
    assert tiny.detokenize(tokens[a:b]) == bench.shot_texts[0]
    assert tiny.detokenize(tokens[c:d]) == f"Question: {bench.items[0].question}\nAnswer:"


GRID = {
    "sweep": {"models": ["m.gguf"], "positions": ["all", "first:4", "needle"]},
    "bench": {"passkey": {"lengths": [256]}},
    "errors": [{"spec": "normal:0,0.5"}],
}


def test_positions_are_a_grid_axis():
    grid = build_grid("g.toml", GRID)
    assert [c.config.label for c in grid.cells] == ["none", "normal:0,0.5", "normal:0,0.5 [kv:all pos:0-3]", "normal:0,0.5 [kv:all pos:needle]"]
    keys = {c.key("sha") for c in grid.cells}
    assert len(keys) == 4


@pytest.mark.parametrize(
    "change,message",
    [
        ({"sweep": {"positions": ["1-x"]}}, r"g.toml: \[sweep\]: bad positions '1-x'"),
        ({"bench": {"nexttoken": {}}}, r"g.toml: \[bench.nexttoken\] --positions 'needle': nexttoken declares no span 'needle'"),
        ({"errors": [{"spec": "kivi:2"}]}, "--positions does not apply to 'kivi'"),
    ],
)
def test_a_bad_grid_positions_is_one_line(change, message):
    raw = {**GRID, **{k: {**GRID[k], **v} if isinstance(v, dict) and k == "sweep" else v for k, v in change.items()}}
    with pytest.raises((GridError, SpecError), match=message) as e:
        build_grid("g.toml", raw)
    assert "\n" not in str(e.value)


def test_the_cli_refuses_a_span_the_bench_does_not_declare_in_one_line(tiny_path):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "kvinject",
            "run",
            "--bench",
            "nexttoken",
            "--limit",
            "2",
            "--error",
            "normal:0,0.1",
            "--positions",
            "needle",
            "--model",
            str(tiny_path),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "nexttoken declares no span 'needle'" in out.stderr
