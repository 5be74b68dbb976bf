"""`kvinject run` as a sweep of its cells into a results store: --store keeps each finished run,
and the same command again evaluates only what the store lacks, with the same records."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest

from kvinject.benchmarks import make_bench
from kvinject.error_models.configuration import configurations
from kvinject.experiments.runner import records, run
from kvinject.experiments.store import Store

from .cli_runs import kvinject

ARGS = ["--bench", "nexttoken", "--limit", "6", "--error", "normal:0,0.5", "--error", "signflip:0.1"]


def _records(path) -> list[dict]:
    """The output's records without their wall-clock seconds (which no two runs share)."""
    return [{k: v for k, v in r.items() if k != "seconds"} for r in json.loads(path.read_text())["records"]]


def test_a_run_resumed_from_its_store_has_the_records_of_one_run_through(tmp_path, tiny_path):
    whole, first, resumed, store = tmp_path / "whole.json", tmp_path / "first.json", tmp_path / "resumed.json", tmp_path / "run.results.sqlite"
    common = ["run", "--model", str(tiny_path), *ARGS]
    assert kvinject(*common, "--runs", "3", "-o", str(whole)).returncode == 0
    out = kvinject(*common, "--runs", "1", "-o", str(first), "--store", str(store))
    assert out.returncode == 0, out.stderr
    out = kvinject(*common, "--runs", "3", "-o", str(resumed), "--store", str(store))
    assert out.returncode == 0, out.stderr
    # control, normal and signflip once each before; two runs more of each noisy one now
    assert "3 of 7 runs are in" in out.stderr and out.stderr.count(" run ") == 4, out.stderr
    assert _records(resumed) == _records(whole)
    assert _records(first) == [r for r in _records(whole) if r["run"] == 0]
    assert json.loads(resumed.read_text())["aggregates"] == json.loads(whole.read_text())["aggregates"]
    with Store(store, readonly=True) as s:
        assert len(list(s.records())) == 7
    report = kvinject("report", str(store), "--format", "json")
    assert report.returncode == 0, report.stderr
    assert {row["configuration"] for row in json.loads(report.stdout)} == {"none", "normal:0,0.5", "signflip:0.1"}


def test_runs_kept_when_a_scheduler_stops_a_run_are_not_evaluated_again(tmp_path, tiny_path):
    store, output = tmp_path / "run.results.sqlite", tmp_path / "r.json"
    argv = [sys.executable, "-m", "kvinject", "run", "--model", str(tiny_path), "--bench", "nexttoken", "--limit", "40", "--error", "normal:0,0.5"]
    argv += ["--runs", "50", "--store", str(store), "-o", str(output)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in proc.stderr:
        if " run 1: " in line:
            break
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143 and f"finished runs kept in {output} and {store}" in err, err
    stopped = _records(output)
    assert len(stopped) >= 3
    again = subprocess.run([*argv[:-4], "--runs", "2", *argv[-4:]], capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert " run 0: " not in again.stderr and " run 1: " not in again.stderr  # both were kept
    assert _records(output) == [r for r in stopped if r["run"] < 2]


def test_the_api_yields_the_runs_it_evaluates_and_the_store_holds_all(tmp_path, tiny):
    bench = make_bench("nexttoken", {"limit": 4})
    configs = configurations("none", ["normal:0,0.5"])
    with Store(tmp_path / "api.results.sqlite") as store:
        first = list(run(tiny, [bench], configs, runs=1, seed=3, store=store))
        notices = []
        second = list(run(tiny, [bench], configs, runs=2, seed=3, store=store, notice=notices.append))
        kept = records(store, tiny, [bench], configs, runs=2, seed=3)
    assert [(r.config.label, r.run) for r in first] == [("none", 0), ("normal:0,0.5", 0)]
    assert [(r.config.label, r.run) for r in second] == [("normal:0,0.5", 1)] and len(notices) == 1
    assert [(r["label"], r["run"]) for r in kept] == [("none", 0), ("normal:0,0.5", 0), ("normal:0,0.5", 1)]
    assert kept[2]["items"] == json.loads(json.dumps(second[0].to_dict()["items"]))


@pytest.mark.parametrize(
    "bench,control",
    [
        (["--bench", "nexttoken", "--limit", "4"], "normal:0,0.5"),
        (["--bench", "perplexity", "--chunks", "1", "--ctx", "64"], "normal:0,0.5"),
        (["--bench", "ifeval", "--limit", "2", "--max-tokens", "4", "--temperature", "0.8"], "none"),
    ],
    ids=["random-control", "random-control-perplexity", "sampling"],
)
def test_a_control_with_randomness_has_all_its_runs_and_resumes(tmp_path, tiny_path, bench, control):
    """A control that differs from run to run (a random error, sampling) is run --runs times
    like any configuration, and a resumed run adds the runs it lacks: its runs past the first
    once went unevaluated while the sweep asked for them again, for ever."""
    store, output = tmp_path / "run.results.sqlite", tmp_path / "r.json"
    common = ["run", "--model", str(tiny_path), *bench, "--control", control, "--error", "signflip:0.1", "--store", str(store), "-o", str(output)]
    for runs in (2, 3):
        out = kvinject(*common, "--runs", str(runs), timeout=240)
        assert out.returncode == 0, out.stderr
        assert [(r["label"], r["run"]) for r in _records(output)] == [(label, run) for label in (control, "signflip:0.1") for run in range(runs)]
