"""The CLI fuzzer (tests/fuzz_cli.py): commands generated from the command tree, each run as
the `kvinject` command runs (tests/fuzz_exec.py) and judged by tests/fuzz_verdict.py; and the
files kvinject reads (tests/fuzz_files.py: grids, stores, run files, run folders, lm-eval
tasks and --config files), changed one key, row or field at a time, read by the commands that read them and judged
the same way; and
each command stopped part way by a Ctrl-C or SIGTERM (tests/fuzz_stops.py).

The plain test run takes a bounded, fixed sample of each; `pytest -m fuzz` runs
KVINJECT_FUZZ_COMMANDS (default 20,000) commands, then every changed file (KVINJECT_FUZZ_FILES
of them where set), then KVINJECT_FUZZ_STOPS (default 1,000) stopped commands, each from number
KVINJECT_FUZZ_FROM (to run them in pieces), and writes each finding to KVINJECT_FUZZ_LOG
(default fuzz-findings.log)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tests import fuzz_cli, fuzz_files, fuzz_stops
from tests.fuzz_exec import execute
from tests.fuzz_verdict import run_one

SAMPLE = 120  # commands in the plain test run: about 40 s on 2 cores
SAMPLE_SECONDS = 65  # and never more than this (with the fixtures and the files', under 2 minutes)
FILE_SAMPLE = 6  # changed files of each kind in the plain test run: 24 commands, about 8 s
FILE_SAMPLE_SECONDS = 25  # and never more than this
STOP_SAMPLE = 8  # commands stopped part way in the plain test run: about 30 s
STOP_SAMPLE_SECONDS = 45  # and never more than this
LIMIT_SECONDS = 120  # per command: the smallest sizes take seconds, lm-eval's import 20


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory, tiny_path: Path) -> Path:
    """The workspace every generated command gets a fresh copy of, with a store that holds one
    fault campaign run (replay and report read it) and the same run's --output file."""
    folder = tmp_path_factory.mktemp("fuzz") / "template"
    fuzz_cli.workspace(folder, tiny_path)
    args = ["run", "--bench", "nexttoken", "--limit", "1", "--runs", "1", "--error", "faults:1", "--model", fuzz_cli.MODEL]
    args += ["--store", fuzz_cli.STORE, "--output", fuzz_files.RUN_FILE]
    outcome = execute(args, folder, 300)
    assert outcome.code == 0, outcome.stderr
    for capture in folder.glob(".std*"):
        capture.unlink()
    return folder


def test_every_command_option_bench_and_error_model_has_a_strategy():
    assert fuzz_cli.missing() == []


def test_the_strategies_reach_every_option_and_bench():
    commands = fuzz_cli.all_single()
    runs = [c for c in commands if c[0] == "run"]
    for name in fuzz_cli.BENCHES:
        assert any(c[2] == name for c in runs), name
    assert ["generate", "Hi", "--max-tokens", "2", "--ctx", "64", "--model", "tiny.gguf", "--error", "evict:streaming,1e10,sinks=4"] in commands
    assert any("--csv" in c and "./same.out" in c for c in runs)  # two outputs, one file


def test_a_fixed_sample_of_generated_commands_holds(template, tmp_path):
    deadline = time.monotonic() + SAMPLE_SECONDS
    findings = []
    for i, args in enumerate(fuzz_cli.sample(SAMPLE)):
        if time.monotonic() > deadline:
            break
        problem = run_one(args, template, tmp_path / "w", LIMIT_SECONDS)
        if problem:
            findings.append(f"kvinject {' '.join(args)}: {problem}")
    assert findings == []


def test_every_kind_of_file_is_changed_key_by_key_and_read_by_each_command(template):
    cases = fuzz_files.all_cases(template)
    assert {c.kind for c in cases} == {"grid", "store", "run file", "run folder", "task", "lm-eval config"}
    for kind, commands in (
        ("grid", fuzz_files.SMALL_COMMANDS),
        ("store", fuzz_files.STORE_COMMANDS),
        ("run file", fuzz_files.RUN_FILE_COMMANDS),
        ("run folder", fuzz_files.FOLDER_COMMANDS),
        ("task", fuzz_files.TASK_COMMANDS),
        ("lm-eval config", [["lm-eval", "--config", "lm-eval.yaml"]]),
    ):
        assert all(any(c.kind == kind and c.args == args for c in cases) for args in commands), kind
    changes = {c.change for c in cases}
    for example in sorted(fuzz_files.EXAMPLES.glob("*.toml")):
        assert f"examples/{example.name} as it is" in changes
    for change in (
        "grid.toml sweep.runs = 1e10",
        "grid.toml sweep.models = ['tiny.gguf', 'tiny.gguf']",
        "examples/fault-campaign.toml errors.0.bit.stop = nan",
        "row 2 record.faults.0.0.bit = None",
        "ALTER TABLE runs DROP COLUMN record",
        "run.json meta.configurations.1.cache = []",
        "not submitted: grid.slurm/run.json tasks = 100000000000000000000",
        "tasks/mine.yaml metric_list.0.metric = 'x'",
        "tasks/mine.yaml doc_to_text: !function no_module.fn",
        "lm-eval.yaml model = 'hf'",
    ):
        assert change in changes, change


def unread(cases: list[fuzz_files.Case], template: Path, folder: Path) -> list[str]:
    """The files as they are that a command does not read without an error (but the scheduler's:
    none answers here): the changed ones would test the refusals of a file that never works."""
    out = []
    for case in cases:
        problem = run_one(case.args, template, folder, LIMIT_SECONDS, case.prepare)
        said = (folder / ".stderr").read_text()
        if problem or ("error:" in said and "squeue" not in said):
            out.append(f"{case.change}: kvinject {' '.join(case.args)}: {problem or said.strip()}")
    return out


def test_the_valid_file_of_each_kind_is_read_without_error(template, tmp_path):
    cases = [c for c in fuzz_files.all_cases(template) if c.change.endswith("as it is") and not c.change.startswith("examples/")]
    assert len(cases) == 7 and unread(cases, template, tmp_path / "w") == []


def test_a_fixed_sample_of_changed_files_holds(template, tmp_path):
    deadline = time.monotonic() + FILE_SAMPLE_SECONDS
    findings = []
    cases = fuzz_files.sample(template, FILE_SAMPLE)
    # lm-eval's commands import it (seconds each): one of each kind here, all in the long run
    slow = ("task", "lm-eval config")
    for case in [next(c for c in cases if c.kind == kind) for kind in slow] + [c for c in cases if c.kind not in slow]:
        if time.monotonic() > deadline:
            break
        problem = run_one(case.args, template, tmp_path / "w", LIMIT_SECONDS, case.prepare)
        if problem:
            findings.append(f"{case.kind} {case.change}: kvinject {' '.join(case.args)}: {problem}")
    assert findings == []


def test_a_fixed_sample_of_stopped_commands_holds(template, tmp_path):
    deadline = time.monotonic() + STOP_SAMPLE_SECONDS
    findings = []
    for stop in fuzz_stops.sample(STOP_SAMPLE):
        if time.monotonic() > deadline:
            break
        problem = fuzz_stops.run_stopped(stop, template, tmp_path / "w")
        if problem:
            findings.append(f"{stop}: {problem}")
    assert findings == []


@pytest.mark.fuzz
def test_the_long_run(template, tmp_path):
    count = int(os.environ.get("KVINJECT_FUZZ_COMMANDS", "20000"))
    commands = fuzz_cli.sample(count, seed=int(os.environ.get("KVINJECT_FUZZ_SEED", "0")))
    first = int(os.environ.get("KVINJECT_FUZZ_FROM", "0"))  # a run in pieces: each its own range of the same draw
    results = ((f"kvinject {' '.join(args)}", run_one(args, template, tmp_path / "w", LIMIT_SECONDS)) for args in commands[first:])
    logged(results, "commands run", first)


@pytest.mark.fuzz
def test_the_long_run_of_files(template, tmp_path):
    cases = fuzz_files.sample(template, seed=int(os.environ.get("KVINJECT_FUZZ_SEED", "0")))
    assert unread([c for c in cases if c.change.endswith("as it is")], template, tmp_path / "w") == []  # the examples cut to the smallest sizes too
    first = int(os.environ.get("KVINJECT_FUZZ_FROM", "0"))
    cases = cases[first : int(os.environ.get("KVINJECT_FUZZ_FILES", len(cases)))]
    results = ((f"{c.kind} {c.change}\tkvinject {' '.join(c.args)}", run_one(c.args, template, tmp_path / "w", LIMIT_SECONDS, c.prepare)) for c in cases)
    logged(results, "changed files read", first)


@pytest.mark.fuzz
def test_the_long_run_of_stops(template, tmp_path):
    stops = fuzz_stops.sample(int(os.environ.get("KVINJECT_FUZZ_STOPS", "1000")), seed=int(os.environ.get("KVINJECT_FUZZ_SEED", "0")))
    first = int(os.environ.get("KVINJECT_FUZZ_FROM", "0"))
    logged(((str(stop), fuzz_stops.run_stopped(stop, template, tmp_path / "w")) for stop in stops[first:]), "stopped commands", first)


def logged(results, noun: str, first: int = 0) -> None:
    """A long run's (what ran, its problem or None), numbered from ``first``, each finding written
    to KVINJECT_FUZZ_LOG as it comes and a count every 20; fails if any."""
    log = Path(os.environ.get("KVINJECT_FUZZ_LOG", "fuzz-findings.log")).resolve()
    findings = ran = 0
    with log.open("a") as out:
        for i, (what, problem) in enumerate(results, first):
            ran += 1
            if problem:
                findings += 1
                out.write(f"{i}\t{what}\t{problem}\n")
            if ran % 20 == 0:
                out.write(f"# {ran} {noun} ({first} to {i}), {findings} findings\n")
            out.flush()
        out.write(f"# {ran} {noun} ({first} to {first + ran - 1}), {findings} findings: done\n")
    assert findings == 0, f"{findings} findings: see {log}"
