"""Every registered benchmark, through what derives from its class: the listing, the run flags,
grid keys, option checking, the time estimate and a small run under the control and an error."""

from __future__ import annotations

import json
import math
import re
from dataclasses import fields
from pathlib import Path

import pytest

from kvinject.benchmarks import BENCHMARKS, make_bench, make_benches
from kvinject.benchmarks.options import flag
from kvinject.benchmarks.speed import Speed
from kvinject.error_models.configuration import Configuration
from kvinject.exceptions import SpecError
from kvinject.experiments.runner import run

from .test_cli import kvinject

LMEVAL = Path(__file__).resolve().parent / "fixtures" / "lmeval"

# Options that keep each benchmark's run small on the tiny model; a benchmark not named here
# runs one item with its defaults.
FAST = {
    "gsm8k": {"max_tokens": 8, "shots": 1},
    "ifeval": {"max_tokens": 6},
    "perplexity": {"ctx": 64},
    "passkey": {"lengths": (256,)},
    "niah": {"lengths": (256,), "max_tokens": 8},
    "vt": {"lengths": (1024,), "max_tokens": 8},  # its worked example alone is about 500 tokens
    "lmeval": {"task": ("kvinject_tiny_choice",), "include_path": str(LMEVAL), "data": str(LMEVAL / "items.jsonl")},
}


def test_the_listing_shows_every_benchmark_and_option():
    out = kvinject("benchmarks", "--format", "json")
    assert out.returncode == 0, out.stderr
    listing = {b["name"]: b for b in json.loads(out.stdout)}
    assert set(listing) == set(BENCHMARKS)
    for name, cls in BENCHMARKS.items():
        assert [o["name"] for o in listing[name]["options"]] == [f.name for f in fields(cls.Options)]
        assert listing[name]["primary"] in cls.higher_is_better


def test_run_help_has_a_flag_for_every_option():
    out = kvinject("run", "--help")
    assert out.returncode == 0
    for cls in BENCHMARKS.values():
        for f in fields(cls.Options):  # the whole flag: --data is not --data-seed
            assert re.search(rf"{re.escape(flag(f.name))}(?![\w-])", out.stdout), f.name


@pytest.mark.parametrize("name", sorted(BENCHMARKS))
def test_options_refuse_what_they_cannot_mean(name):
    cls = BENCHMARKS[name]
    assert cls.Options.parse({}) == cls.Options()
    with pytest.raises(SpecError, match="has no option 'nonsense'"):
        cls.Options.parse({"nonsense": 1})
    with pytest.raises(SpecError, match="at least 1"):
        cls.Options.parse({"limit": 0})
    for bad in (True, 1.5, "1_000", "ten"):
        with pytest.raises(SpecError, match="must be an integer"):
            cls.Options.parse({"limit": bad})


def test_an_option_given_where_it_changes_nothing_is_refused():
    """Each option that applies only with some values of another (niah's needles with the multi-
    families, gsm8k's problems without data) is refused beside any other value, taken with its own."""
    checked = 0
    for cls in BENCHMARKS.values():
        known = {f.name: f for f in fields(cls.Options)}
        for f in known.values():
            if f.metadata.get("only") is None:
                continue
            other, allowed = f.metadata["only"]
            value = f.default if f.default is not None else "x.txt"
            outside = next(c for c in known[other].metadata.get("choices") or ("x.txt",) if c not in allowed)
            with pytest.raises(SpecError, match=rf"^{flag(f.name)} applies only with(out)? {flag(other)}"):
                cls.Options.parse({f.name: value, other: outside}, cli=True)
            assert getattr(cls.Options.parse({f.name: value, other: allowed[0]}), f.name) == value
            checked += 1
    assert checked >= 6  # niah's needles, gsm8k's problems and data_seed, the haystack benches' data


@pytest.mark.parametrize("name", sorted(BENCHMARKS))
def test_every_benchmark_runs_under_the_control_and_an_error(name, tiny):
    bench = make_bench(name, {"limit": 1, **FAST.get(name, {})})
    assert math.isfinite(bench.estimate_seconds(2, Speed())) and bench.estimate_seconds(2, Speed()) > 0
    results = list(run(tiny, [bench], [Configuration(), Configuration.parse("normal:0,0.5")], runs=2, seed=1))
    assert [(r.config.label, r.run) for r in results] == [("none", 0), ("normal:0,0.5", 0), ("normal:0,0.5", 1)]
    control, noisy, _ = results
    assert bench.primary in control.metrics and bench.primary in noisy.metrics
    assert control.realized.k.values == 0 and noisy.realized.k.values > 0
    assert all(len(v) == len(bench) for v in control.items.values())
    assert control.metrics["bits"] == noisy.metrics["bits"] == 16, "an f16 cache, and noise compresses nothing"


def test_a_flag_no_selected_benchmark_takes_is_an_error_not_ignored():
    with pytest.raises(SpecError, match="--max-tokens applies to .*ifeval"):
        make_benches(["nexttoken"], {"max_tokens": 5})
    (ifeval,) = make_benches(["ifeval"], {"max_tokens": "5", "exclude_instructions": ["punctuation:no_comma,keywords:existence", "detectable_format:title"]})
    assert ifeval.options.max_tokens == 5 and ifeval.options.exclude_instructions == ("punctuation:no_comma", "keywords:existence", "detectable_format:title")


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "1_0"])
def test_float_options_refuse_non_finite_negative_and_underscored_values(value):
    with pytest.raises(SpecError, match="--temperature must be"):
        make_benches(["ifeval"], {"temperature": value})
