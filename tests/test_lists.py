"""Every list kvinject reads (a comma-separated option, a repeated flag, a grid's list, a spec's
list) goes through one parser (kvinject/values.py: split_list, unique) that refuses a value given
twice before any work: repeated, it would repeat identical items, cells or configurations. The
options are found by walking the command tree, the grid keys from the grid's own key set."""

from __future__ import annotations

from pathlib import Path
from typing import get_args

import pytest

from kvinject.benchmarks import BENCHMARKS, option_owners
from kvinject.benchmarks.base import GenerationBenchmark
from kvinject.exceptions import KvinjectError, SpecError
from kvinject.experiments.grid import SWEEP_KEYS, build_grid
from kvinject.values import split_list, unique
from tests.cli_tree import WorkStarted, annotation, commands, empty_store, flag, invoke, is_option

COMMA = {"--layers", "--heads", "--positions", "--faults"}  # comma-separated options whose value is text
SAMPLES = {
    "--error": "normal:0,0.5",
    "--choice": "quant:4",
    "--bench": "nexttoken",
    "--data": "x.txt",
    "--prompt": "Hi",
    "--filter": "bench=nexttoken",
    "--sbatch-arg": "--account=ml",
    "--layers": "1",
    "--heads": "0",
    "--positions": "0-3",
    "--faults": "bit",
    "stores": "STORE",
}
BY_METAVAR = {"INTEGER[,...]": "64", "NUMBER[,...]": "0.5", "TEXT[,...]": "x"}


def list_params() -> list[tuple[str, str, bool, bool]]:
    """(command, flag, repeatable, comma-separated) of every parameter that takes a list."""
    out = []
    for name, command in commands().items():
        for p in command.params:
            many = p.multiple if is_option(p) else p.nargs == -1
            comma = flag(p) in COMMA or (p.metavar or "").endswith("[,...]") or "comma-separated" in (p.help or "")
            if many or comma or get_args(annotation(p)):
                out.append((name, flag(p), many, comma))
    return out


def test_the_walk_finds_the_lists_of_every_command():
    found = {(c, f) for c, f, _, _ in list_params()}
    assert {("run", "--lengths"), ("run", "--bench"), ("generate", "--error"), ("divergence", "--prompt"), ("report", "stores")} <= found
    assert ("sweep", "--sbatch-arg") in found


def base(command: str, option: str, tmp_path: Path, model: Path) -> list[object]:
    """The smallest valid `kvinject COMMAND` that ``option`` applies to, without ``option``."""
    kind = GenerationBenchmark if command == "divergence" else None
    owner = option_owners(kind).get(option[2:].replace("-", "_"))
    bench = owner[0][1] if owner else "nexttoken"
    grid = tmp_path / "g.toml"
    grid.write_text("[bench.nexttoken]\nlimit = 1\n")
    pairs = {
        "generate": [("", "Hi"), ("--model", model)],
        "run": [("--bench", bench), ("--model", model)],
        "divergence": [("--error", "normal:0,0.5"), *([("--bench", bench)] if owner else [("--prompt", "Hi")]), ("--model", model)],
        "profile": [("--error", "normal:0,0.5"), ("--bench", bench), ("--model", model)],
        "tune": [("--bits", "4"), ("--bench", bench), ("--model", model)],
        "report": [("", empty_store(tmp_path))],
        "replay": [("", empty_store(tmp_path)), ("--item", "0")],
        "sweep": [("", grid), ("--slurm", None), ("--dry-run", None)],
    }
    if command not in pairs:
        pytest.fail(f"kvinject {command} takes the list {option}: give its smallest valid command here, so that its repeats are checked")
    args: list[object] = [command]
    for key, value in pairs[command]:
        if key != option and not (option == "stores" and key == ""):
            args += [a for a in (key, value) if a not in ("", None)]
    return args


@pytest.mark.parametrize("command,option,many,comma", list_params())
def test_every_list_refuses_a_value_given_twice_before_any_work(command, option, many, comma, tmp_path, tiny_path, no_work):
    """`run --bench passkey --lengths 1024,1024 --depths 50,50` scored 4 identical items for 1."""
    if command == "lm-eval":
        return  # its arguments are lm-eval's: test_lm_eval_lists_are_checked
    args = base(command, option, tmp_path, tiny_path)
    value = SAMPLES.get(option) or BY_METAVAR.get(next(p.metavar for p in commands()[command].params if flag(p) == option) or "")
    if value is None:
        pytest.fail(f"kvinject {command} {option} takes a list: give it a sample value in SAMPLES")
    value = empty_store(tmp_path) if value == "STORE" else value
    forms = ([[value, value]] if option == "stores" else [[option, value, option, value]] if many else []) + ([[option, f"{value},{value}"]] if comma else [])
    for form in forms:
        try:
            code, said = invoke([*args, *form])
        except WorkStarted:
            pytest.fail(f"kvinject {command} {' '.join(map(str, form))} started its work before refusing the repeat")
        assert code == 2 and "twice" in said, (form, said)


def test_the_passkey_grid_of_the_issue_is_refused(tmp_path, tiny_path, no_work):
    code, said = invoke(["run", "--bench", "passkey", "--lengths", "1024,1024", "--depths", "50,50", "--samples", "1", "--model", tiny_path])
    assert code == 2 and said == "passkey: --lengths gives '1024' twice: give each value once"


def test_values_that_read_alike_are_one_value(tiny_path, no_work):
    code, said = invoke(["generate", "Hi", "--error", "normal:0,0.25", "--error", "normal:0,.25", "--model", tiny_path])
    assert code == 2 and said == "--error gives 'normal:0,.25' twice (as 'normal:0,0.25'): give each value once"


def test_empty_items_are_refused():
    with pytest.raises(SpecError, match="empty item in '1024,,2048'"):
        split_list("--lengths", "1024,,2048")
    with pytest.raises(SpecError, match="empty item in '1,'"):
        split_list("--layers", "1,")
    assert split_list("--lengths", ["1024, 2048", "4096"]) == ["1024", "2048", "4096"]
    assert unique("x", [3, 1, 2]) == [3, 1, 2]


GRID_SAMPLES = {
    "models": "smollm2",
    "seeds": 0,
    "targets": "k",
    "layers": "0",
    "positions": "0-3",
    "heads": "0",
    "caches": "f16",
    "control": "none",
    "control_per_cache": True,
    "runs": 2,
    "threads": 2,
    "n_gpu_layers": 0,
    "parallel": 2,
    "flash_attn": "auto",
    "kv_rotation": True,
    "margin": 0.05,
    "confidence": 0.95,
}


@pytest.mark.parametrize("key", sorted(SWEEP_KEYS))
def test_every_grid_list_refuses_a_value_given_twice(key):
    """Each [sweep] key: where a list of one value is a grid, a list of that value twice is refused."""
    if key not in GRID_SAMPLES:
        pytest.fail(f"sweep.{key}: give it a sample value in GRID_SAMPLES")
    value = GRID_SAMPLES[key]
    raw = {"bench": {"nexttoken": {"limit": 1}}, "errors": [{"spec": "normal:0,0.5"}]}
    try:
        build_grid(Path("g.toml"), {**raw, "sweep": {key: [value]}})
    except KvinjectError:
        return  # not a list key
    with pytest.raises(KvinjectError, match="twice"):
        build_grid(Path("g.toml"), {**raw, "sweep": {key: [value, value]}})


def test_a_grid_refuses_repeats_in_specs_parameters_and_bench_options():
    raw = {"bench": {"nexttoken": {"limit": 1}}}
    for errors in ([{"spec": ["normal:0,0.5", "normal:0,0.5"]}], [{"model": "normal", "mean": 0, "std": [0.5, 0.5]}], [{"spec": "none"}, {"spec": "none"}]):
        with pytest.raises(KvinjectError, match="twice"):
            build_grid(Path("g.toml"), {**raw, "errors": errors})
    every_list_option = [(name, f) for name, owners in option_owners().items() for _, bench, f in owners if name != "data" and "tuple" in str(f.type)]
    assert every_list_option, "the benches' list options are found"
    for name, f in every_list_option:
        bench = next(b for _, b, g in option_owners()[name] if g is f)
        sample = {"int": 64, "float": 0.5}.get(str(f.type).split("[")[1].split(",")[0].strip(), "x")
        with pytest.raises(KvinjectError, match="twice"):
            build_grid(Path("g.toml"), {"bench": {bench: {name: [sample, sample]}}})
    assert set(BENCHMARKS) >= {bench for _, owners in option_owners().items() for _, bench, _ in owners}


def test_a_grid_refuses_identical_bench_tables_and_one_model_by_two_paths(tmp_path):
    """Identical [[bench.X]] tables, and two paths to one model file, each repeated every cell."""
    tables = {"bench": {"nexttoken": [{"limit": 1}, {"limit": 2}, {"limit": 1}]}}
    with pytest.raises(KvinjectError, match=r"\[\[bench.nexttoken\]\] #3 is the same as #1: give each table once"):
        build_grid(Path("g.toml"), tables)
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    (tmp_path / "sub").mkdir()
    paths = [str(model), str(tmp_path / "sub" / ".." / "m.gguf")]
    with pytest.raises(KvinjectError, match="sweep.models gives .* twice"):
        build_grid(Path("g.toml"), {"bench": {"nexttoken": {"limit": 1}}, "sweep": {"models": paths}})


def test_lm_eval_lists_are_checked():
    from kvinject.cli.harness import _check_args, _given

    with pytest.raises(SpecError, match="--model_args gives 'error' twice"):
        _check_args(_given("run", ["--model_args", "error=none,seed=1,error=none"]))
    with pytest.raises(SpecError, match="--model_args gives 'error' twice"):  # lm-eval merges every --model_args
        _check_args(_given("run", ["-a", "error=none", "--model_args=seed=1", "-aerror=none"]))
    with pytest.raises(SpecError, match="--tasks gives 'gsm8k' twice"):
        _check_args(_given("run", ["--tasks", "gsm8k,gsm8k"]))
    with pytest.raises(SpecError, match="--tasks gives 'gsm8k' twice"):
        _check_args(_given("run", ["-t", "gsm8k", "--tasks", "arc_easy", "gsm8k"]))
    with pytest.raises(SpecError, match="--model_args: layers gives '1' twice"):
        from kvinject.lmeval.settings import Settings

        Settings.parse({"layers": "1,1"})
