"""Property-based fuzzing of what users type: error specs, configuration specs, layer lists,
bench option values, grid files and data files. Each either works with the meaning it reads
as, or fails with kvinject's one-line error (a KvinjectError) — never another exception, a
hang or a silently different meaning."""

from __future__ import annotations

import json
import math
import tomllib
from dataclasses import fields

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvinject.benchmarks import BENCHMARKS
from kvinject.engine.target import Target, parse_layers
from kvinject.error_models import REGISTRY, parse_error
from kvinject.error_models.configuration import Configuration
from kvinject.exceptions import KvinjectError
from kvinject.experiments.generate import generate
from kvinject.experiments.grid import load_grid

# Derandomized: CI checks the same examples every time; explore with --hypothesis-seed=random.
FAST = settings(max_examples=300, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])

numbers = st.one_of(
    st.integers(-(10**6), 10**6).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["1_000", "0x10", "1e400", "-0", ".5", "5.", "nan", "inf", "", " ", "1,5", "١"]),
)
names = st.sampled_from([*REGISTRY, "gauss", "", "NORMAL", " normal"])
keys = st.sampled_from(["group", "field", "p", "std", "bits", "x", "", "bit", "format", "stage", "only", "count"])


@st.composite
def error_specs(draw) -> str:
    args = draw(st.lists(numbers, max_size=4))
    words = st.sampled_from(["sign", "any", "top", "scale", "code", "q8_0", "q4_0", "bf16", "generated", "prompt"])
    options = draw(st.lists(st.tuples(keys, st.one_of(numbers, words)), max_size=3))
    body = ",".join(args + [f"{k}={v}" for k, v in options])
    cache = draw(st.sampled_from(["", "", "@q8_0", "@q4_0", "@q4_1", "@bf16", "@f32/q8_0"]))
    return draw(names) + (":" + body if body or draw(st.booleans()) else "") + cache


@FAST
@given(error_specs())
def test_an_error_spec_parses_to_what_it_says_or_fails_cleanly(spec):
    try:  # with the cache types after @, as a configuration: resolved to the stored format
        Configuration.parse(spec)
    except KvinjectError:
        pass
    spec = spec.partition("@")[0]
    try:
        model = parse_error(spec)
    except KvinjectError:
        return
    assert parse_error(model.spec) == model  # what was read is what the spec says
    for f in fields(model):
        value = getattr(model, f.name)
        assert not (isinstance(value, float) and not math.isfinite(value))
    positional = spec.partition(":")[2].split(",") if ":" in spec else []
    values = [v.strip() for v in positional if v.strip() and "=" not in v]
    for f, text in zip([f for f in fields(model)], values):  # no 1_000 read as 1000, no nan
        assert float(text) == float(getattr(model, f.name))
        assert "_" not in text


ADVERSARIAL = ["1e10", "1e-400", "1e400", "inf", "-inf", "nan", "0x10", "-0", "1_000", "0.5", "-1", "0", "99999999999999999999", "", "١"]


def _mutations() -> list[str]:
    """Each registered model's documented example with one field at a time replaced by each
    adversarial number: a first field that is a name (evict's METHOD) keeps the later ones in
    reach, where random specs never got past it."""
    out = []
    for cls in REGISTRY.values():
        name, _, body = cls.example.partition(":")
        parts = body.split(",") if body else []
        for i, part in enumerate(parts):
            key = part.partition("=")[0] + "=" if "=" in part else ""
            out += [f"{name}:{','.join([*parts[:i], key + value, *parts[i + 1 :]])}" for value in ADVERSARIAL]
    return out


@pytest.mark.parametrize("spec", _mutations())
def test_each_field_of_each_documented_example_takes_any_number_cleanly(spec, tiny):
    """Parsed and run on the tiny model for two tokens: `evict:window,1e10` parsed, then ended
    in a ValueError traceback where the budget was first used."""
    try:
        configuration = Configuration.parse(spec)
    except KvinjectError:
        return
    assert parse_error(configuration.error.spec) == configuration.error
    try:
        generate(tiny, "The cat sat on the", [configuration], max_tokens=2, n_ctx=64)
    except KvinjectError:
        pass


@FAST
@given(st.text(max_size=30), st.sampled_from(["kv", "k", "v", "K", "x"]))
def test_a_configuration_spec_or_layer_list_works_or_fails_cleanly(text, target):
    try:
        Configuration.parse(text)
    except KvinjectError:
        pass
    try:
        Target.parse(target, text)
    except KvinjectError:
        pass
    try:
        layers = parse_layers(text)
    except KvinjectError:
        return
    assert layers is None or all(0 <= layer <= 4095 for layer in layers)


option_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 10**6),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.lists(st.one_of(st.text(max_size=8), st.integers()), max_size=3),
)


@FAST
@given(
    st.sampled_from(sorted(BENCHMARKS)),
    st.dictionaries(
        st.sampled_from(["limit", "max_tokens", "temperature", "ctx", "chunks", "data", "exclude_instructions", "nope"]), option_values, max_size=4
    ),
    st.booleans(),
)
def test_bench_options_are_checked_values_or_a_clean_error(name, values, cli):
    options_class = BENCHMARKS[name].Options
    try:
        options = options_class.parse(values, cli)
    except KvinjectError:
        return
    for f in fields(options):
        value = getattr(options, f.name)
        assert not isinstance(value, bool) or f.type in ("bool", "bool | None")
        if isinstance(value, float):
            assert math.isfinite(value)
        minimum = f.metadata.get("minimum")
        if minimum is not None and isinstance(value, (int, float)) and not isinstance(value, bool):
            assert value >= minimum


toml_values = st.one_of(
    st.integers(-3, 20),
    st.booleans(),
    st.floats(-2, 2, allow_nan=False),
    st.text(alphabet="abcnor0123456789:.,-_@/ ", max_size=12),
    st.lists(st.integers(-2, 4), max_size=3),
    st.fixed_dictionaries({"start": st.integers(-1, 2), "stop": st.integers(-1, 3), "step": st.floats(-0.5, 1, allow_nan=False)}),
)


def toml_value(value) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {toml_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return json.dumps(value)


@st.composite
def grids(draw) -> str:
    sweep = draw(
        st.dictionaries(
            st.sampled_from(
                [
                    "runs",
                    "seeds",
                    "threads",
                    "parallel",
                    "layers",
                    "targets",
                    "caches",
                    "flash_attn",
                    "control",
                    "bogus",
                    "margin",
                    "confidence",
                    "control_per_cache",
                ]
            ),
            toml_values,
            max_size=4,
        )
    )
    bench = draw(st.sampled_from([*BENCHMARKS, "mmlu"]))
    options = draw(st.dictionaries(st.sampled_from(["limit", "ctx", "max_tokens", "temperature", "chunks", "nope"]), toml_values, max_size=3))
    error = draw(st.dictionaries(st.sampled_from(["model", "mean", "std", "p", "spec", "a", "b", "cache"]), toml_values, max_size=3))
    lines = ["[sweep]", *(f"{k} = {toml_value(v)}" for k, v in sweep.items()), f"[bench.{bench}]", *(f"{k} = {toml_value(v)}" for k, v in options.items())]
    if error:
        lines += ["[[errors]]", *(f"{k} = {toml_value(v)}" for k, v in error.items())]
    return "\n".join(lines) + "\n"


@FAST
@given(grids())
def test_a_grid_file_loads_or_names_what_is_wrong(tmp_path_factory, text):
    tomllib.loads(text)  # the generator writes valid TOML: the grid's checks are under test
    path = tmp_path_factory.mktemp("grid") / "g.toml"
    path.write_text(text)
    try:
        grid = load_grid(path)
    except KvinjectError as e:
        assert "\n" not in str(e).strip() or "valid form" in str(e).lower()  # the spec help lists the forms
        return
    for cell in grid.cells:
        assert cell.runs >= 1 and not isinstance(cell.runs, bool) and cell.seed >= 0


jsonl_lines = st.one_of(
    st.text(max_size=40),
    st.dictionaries(
        st.sampled_from(["key", "prompt", "instruction_id_list", "kwargs", "x"]),
        st.one_of(
            st.integers(),
            st.text(max_size=8),
            st.lists(st.text(max_size=30), max_size=2),
            st.lists(st.dictionaries(st.text(max_size=5), st.integers(), max_size=2), max_size=2),
        ),
        max_size=5,
    ).map(json.dumps),
)


@FAST
@given(st.lists(jsonl_lines, max_size=4), st.text(max_size=300))
def test_a_data_file_loads_or_names_what_is_wrong(tmp_path_factory, lines, text):
    folder = tmp_path_factory.mktemp("data")
    (folder / "items.jsonl").write_text("\n".join(lines))
    (folder / "text.txt").write_text(text)
    for name, data in (("ifeval", "items.jsonl"), ("nexttoken", "text.txt"), ("perplexity", "text.txt")):
        try:
            bench = BENCHMARKS[name](data=str(folder / data))
        except KvinjectError:
            continue
        assert name == "perplexity" or len(bench) > 0
