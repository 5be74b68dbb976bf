"""The CLI fuzzer (tests/fuzz_cli.py): commands generated from the command tree, each run as
the `kvinject` command runs (tests/fuzz_exec.py) and judged by tests/fuzz_verdict.py.

The plain test run takes a bounded, fixed sample; `pytest -m fuzz` runs KVINJECT_FUZZ_COMMANDS
(default 20,000) and writes each finding to KVINJECT_FUZZ_LOG (default fuzz-findings.log)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tests import fuzz_cli
from tests.fuzz_exec import execute
from tests.fuzz_verdict import run_one

SAMPLE = 30  # commands in the plain test run: about a minute on 2 cores
SAMPLE_SECONDS = 75  # and never more than this (with the fixtures, under 2 minutes)
LIMIT_SECONDS = 120  # per command: the smallest sizes take seconds, lm-eval's import 20


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory, tiny_path: Path) -> Path:
    """The workspace every generated command gets a fresh copy of, with a store that holds one
    fault campaign run (replay and report read it)."""
    folder = tmp_path_factory.mktemp("fuzz") / "template"
    fuzz_cli.workspace(folder, tiny_path)
    args = ["run", "--bench", "nexttoken", "--limit", "1", "--runs", "1", "--error", "faults:1", "--model", fuzz_cli.MODEL, "--store", fuzz_cli.STORE]
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


@pytest.mark.fuzz
def test_the_long_run(template, tmp_path):
    count = int(os.environ.get("KVINJECT_FUZZ_COMMANDS", "20000"))
    log = Path(os.environ.get("KVINJECT_FUZZ_LOG", "fuzz-findings.log")).resolve()
    findings = 0
    with log.open("a") as out:
        for i, args in enumerate(fuzz_cli.sample(count, seed=int(os.environ.get("KVINJECT_FUZZ_SEED", "0")))):
            problem = run_one(args, template, tmp_path / "w", LIMIT_SECONDS)
            if problem:
                findings += 1
                out.write(f"{i}\tkvinject {' '.join(args)}\t{problem}\n")
            if i % 20 == 0:
                out.write(f"# {i + 1} commands run, {findings} findings\n")
            out.flush()
    assert findings == 0, f"{findings} findings: see {log}"
