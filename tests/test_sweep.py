"""Grid files, the results store under SIGKILL, workers sharing a store, and reports."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import sqlite3
import subprocess
import sys
import time

import pytest

from kvinject.analysis.report import summarize
from kvinject.benchmarks.speed import Speed
from kvinject.engine.model import CPU_PARALLEL
from kvinject.experiments.grid import GridError, bench_labels, load_grid
from kvinject.experiments.store import Store
from kvinject.experiments.sweep import Sweep

GRID = """
[sweep]
models = ["{model}"]
runs = 2

[bench.nexttoken]
limit = {limit}

[bench.perplexity]
ctx = 64
chunks = 1

[[errors]]
model = "normal"
mean = 0
std = [0.25, 0.5]

[[cells]]
error = "none@bf16"
"""
# Per bench: the control and none@bf16 once each (no randomness), two noisy configurations twice.
EXPECTED_RUNS = 2 * (1 + 1 + 2 * 2)


def write_grid(tmp_path, model, limit=3, text=GRID):
    path = tmp_path / "grid.toml"
    path.write_text(text.format(model=model, limit=limit))
    return path


def sweep(*args, **kwargs):
    return subprocess.Popen(
        [sys.executable, "-m", "kvinject", "sweep", *map(str, args)], **{"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True, **kwargs}
    )


def count(store):
    if not store.exists():
        return 0
    with sqlite3.connect(store, timeout=30) as db:
        try:
            return db.execute("SELECT COUNT(*) FROM runs").fetchone()[0]
        except sqlite3.OperationalError:  # table not created yet
            return 0


def claims(store):
    with sqlite3.connect(store, timeout=30) as db:
        try:
            return db.execute("SELECT COUNT(*) FROM claims").fetchone()[0]
        except sqlite3.OperationalError:  # table not created yet
            return 0


def test_ranges_expand_and_the_cells_are_the_cross_product(tmp_path):
    grid = load_grid(write_grid(tmp_path, "smollm2", text=GRID.replace("std = [0.25, 0.5]", "std = {{start = 0, stop = 1, step = 0.125}}")))
    labels = [c.config.label for c in grid.cells if c.bench == "nexttoken"]
    assert labels[0] == "none" and labels[-1] == "none @bf16"
    assert [label for label in labels if label.startswith("normal")] == [f"normal:0,{v:g}" for v in [i * 0.125 for i in range(9)]]
    assert sum(c.control for c in grid.cells) == 2


@pytest.mark.parametrize(
    "change,message",
    [
        (("[bench.perplexity]", "[bench.mmlu]"), r"\[bench.mmlu\] is not a benchmark"),
        (("chunks = 1", "chunk = 1"), r"\[bench.perplexity\] has no option 'chunk'"),
        (("runs = 2", "runs = 0"), "sweep.runs must be between 1 and 10000, got 0"),
        (('model = "normal"', 'model = "gauss"'), r"errors\[0\].model: unknown error model 'gauss'"),
        (("std = [0.25, 0.5]", "sd = 1"), r"errors\[0\]: 'normal' has no parameter 'sd'"),
        (("std = [0.25, 0.5]", "std = {{start = 1, stop = 0, step = 0.1}}"), r"errors\[0\].std: a range needs"),
        (("runs = 2", "runs = 2\ncaches = ['f16/q4_0']\nflash_attn = 'off'"), r"sweep.caches\[0\]: a quantized V cache"),
        (("runs = 2", "runs = 2 2"), "not valid TOML"),
        (("runs = 2", "runs = true"), "sweep.runs must be an integer, got True"),
        (("runs = 2", "runs = 99999999999999999999"), "sweep.runs must be between 1 and 10000, got 99999999999999999999"),
        (('[sweep]\nmodels = ["{model}"]\nruns = 2', "sweep = true"), r"sweep must be a table \(\[sweep\]\), got True"),  # was a TypeError
        (("runs = 2", "runs = 2\nseeds = [0, -1]"), "sweep.seeds must be integers >= 0"),
        (("runs = 2", "runs = 2\nthreads = 0"), r"\[sweep\]: threads must be between 1 and 512"),
        (("runs = 2", "runs = 2\nparallel = 'x'"), "sweep.parallel must be an integer"),
        (("runs = 2", "runs = 2\nparallel = 0"), r"\[sweep\]: parallel must be between 1 and 256"),
        (("runs = 2", "runs = 2\nflash_attn = 'maybe'"), "sweep.flash_attn must be auto, on or off, got 'maybe'"),  # was caches[0]'s --flash-attn
        (("runs = 2", "runs = 2\nflash_attn = ['on']"), r"sweep.flash_attn must be auto, on or off, got \['on'\]"),
        (("runs = 2", "runs = 2\nlayers = '3-1'"), r"\[sweep\]: bad layers '3-1'"),
        (("ctx = 64", "ctx = 2.5"), r"\[bench.perplexity\] ctx must be an integer, got 2.5"),
        (("chunks = 1", "chunks = 1\ndata = 3"), r"\[bench.perplexity\] data must be a non-empty string"),
        (("runs = 2", "runs = 2\nmargin = 3"), r"\[sweep\] the margin is a share in \(0, 1\), e.g. 0.03 for ±3%, got 3"),
        (("runs = 2", "runs = 2\nmargin = 0.03\nconfidence = '95%'"), "sweep.margin and sweep.confidence must be numbers"),
        (("runs = 2", "runs = 2\nconfidence = 0.9"), "sweep.confidence goes with sweep.margin"),
        (("runs = 2", "runs = 2\ncontrol_per_cache = 1"), "sweep.control_per_cache must be true or false, got 1"),
        (("std = [0.25, 0.5]", "std = [0.25, 0.5]\ncache = 3"), r"errors\[0\].cache must be cache types such as 'q8_0'"),
        (("runs = 2", "runs = 2\ncontrol_per_cache = true"), r"'none @bf16' stores K/V as bf16/bf16, which has no control: add it to sweep.caches"),
    ],
)
def test_a_bad_grid_names_the_key(tmp_path, change, message):
    path = write_grid(tmp_path, "smollm2", text=GRID.replace(*change))
    with pytest.raises(GridError, match=message) as info:
        load_grid(path)
    assert str(info.value).startswith(f"{path}: "), "the message names the file"


def test_a_grid_that_is_not_utf8_is_refused_in_one_line(tmp_path):
    """A byte that is no UTF-8 ended `sweep` in a UnicodeDecodeError."""
    path = write_grid(tmp_path, "smollm2")
    path.write_bytes(path.read_bytes() + b"\xff")
    with pytest.raises(GridError, match=f"{path}: not valid TOML: 'utf-8' codec can't decode byte 0xff"):
        load_grid(path)


def test_a_range_or_grid_too_large_is_refused_before_it_is_expanded(tmp_path):
    huge_range = GRID.replace("std = [0.25, 0.5]", "std = {{start = 0, stop = 1000000, step = 0.001}}")
    with pytest.raises(GridError, match=r"errors\[0\].std: the range has 1000000001 values"):
        load_grid(write_grid(tmp_path, "smollm2", text=huge_range))
    many = GRID.replace("std = [0.25, 0.5]", "std = {{start = 0, stop = 10, step = 0.01}}")  # 1001 stds
    with pytest.raises(GridError, match="expands to 2006 cells, more than 1000; narrow it, or allow it with --max-cells 2006"):
        load_grid(write_grid(tmp_path, "smollm2", text=many), max_cells=1000)
    assert len(load_grid(write_grid(tmp_path, "smollm2", text=many), max_cells=2006).cells) == 2006


def test_dry_run_checks_layers_against_the_model_before_anything_runs(tmp_path, tiny_path):
    grid = write_grid(tmp_path, tiny_path, text=GRID.replace("runs = 2", "runs = 2\nlayers = ['all', '5']"))
    out = subprocess.run([sys.executable, "-m", "kvinject", "sweep", str(grid), "--dry-run"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "--layers names layer 5, but the model has layers 0-1" in out.stderr


def test_dry_run_lists_cells_without_creating_a_store(tmp_path, tiny_path):
    grid = write_grid(tmp_path, tiny_path)
    out = subprocess.run([sys.executable, "-m", "kvinject", "sweep", str(grid), "--dry-run"], check=False, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "8 cells" in out.stdout and f"{EXPECTED_RUNS} runs left" in out.stdout and "estimate" in out.stdout
    assert not list(tmp_path.glob("*.sqlite"))


def test_a_bad_bench_option_value_names_its_section(tmp_path, tiny_path):
    grid = write_grid(tmp_path, tiny_path, limit=0)
    out = subprocess.run([sys.executable, "-m", "kvinject", "sweep", str(grid), "--dry-run"], check=False, capture_output=True, text=True, timeout=300)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "[bench.nexttoken] limit must be at least 1, got 0" in out.stderr


def test_several_option_sets_of_one_bench_are_separate_experiments(tmp_path, tiny_path):
    text = GRID.replace("[bench.perplexity]\nctx = 64\nchunks = 1", "[[bench.perplexity]]\nctx = 64\n\n[[bench.perplexity]]\nctx = 128\nchunks = 0")
    with pytest.raises(GridError, match=r"\[\[bench.perplexity\]\] #2 chunks must be at least 1"):
        load_grid(write_grid(tmp_path, tiny_path, text=text))
    grid = load_grid(write_grid(tmp_path, tiny_path, text=text.replace("chunks = 0", "chunks = 2")))
    perplexity = [c for c in grid.cells if c.bench == "perplexity"]
    assert sorted({dict(c.options)["ctx"] for c in perplexity}) == [64, 128]
    assert len(perplexity) == 2 * 4 and sum(c.control for c in perplexity) == 2, "each option set has its control"
    assert len({c.group for c in perplexity}) == 2
    labels = dict(zip(map(id, grid.cells), bench_labels(grid.cells)))
    assert {labels[id(c)] for c in perplexity} == {"perplexity chunks=2 ctx=128", "perplexity ctx=64"}
    assert {labels[id(c)] for c in grid.cells if c.bench == "nexttoken"} == {"nexttoken"}, "options all cells share stay out"


def test_sigkill_then_resume_loses_and_duplicates_nothing(tmp_path, tiny_path):
    grid, store = write_grid(tmp_path, tiny_path, limit=40), tmp_path / "s.sqlite"
    proc = sweep(grid, "--store", store)
    deadline = time.time() + 240
    while count(store) < 2 and proc.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed_at = count(store)
    assert 0 < killed_at < EXPECTED_RUNS, "the kill must land mid-sweep"
    resumed = sweep(grid, "--store", store)
    _, err = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, err
    # Its log (no terminal: no bars) has a timed line for each run it stored, none for the control
    # it evaluated again, each with the runs left, down to none.
    lines = [line for line in err.splitlines() if " stored " in line]
    assert len(lines) == EXPECTED_RUNS - killed_at and all(
        re.match(r"\d\d:\d\d:\d\d stored (nexttoken|perplexity) tiny-llama.gguf ", line) for line in lines
    ), err
    assert [int(re.search(r"; (\d+) runs? left$", line)[1]) for line in lines] == list(reversed(range(len(lines)))), err
    with Store(store) as s:
        keys = [(r["cell"], r["run"]) for r in s.records()]
    assert len(keys) == len(set(keys)) == EXPECTED_RUNS


# Three groups (seeds) of a control and one noisy configuration run twice: nine runs.
SHARED_GRID = """
[sweep]
models = ["{model}"]
runs = 2
seeds = [0, 1, 2]

[bench.perplexity]
ctx = 64
chunks = 1

[[errors]]
spec = ["normal:0,0.25"]
"""


def stop_once_claiming(store, proc):
    """SIGSTOP proc as soon as it holds a claim, at a moment it cannot hold the store's write
    lock (the test holds it), so the other workers are not blocked; False until it claims."""
    if not store.exists():
        return False
    db = sqlite3.connect(store, timeout=60, isolation_level=None)
    try:
        db.execute("BEGIN IMMEDIATE")
        if db.execute("SELECT 1 FROM claims WHERE pid = ?", (proc.pid,)).fetchone():
            proc.send_signal(signal.SIGSTOP)
            return True
        return False
    except sqlite3.OperationalError:  # no claims table yet
        return False
    finally:
        db.close()


def test_two_workers_on_one_store_split_the_groups_and_compute_each_run_once(tmp_path, tiny_path):
    """The first worker is frozen (SIGSTOP) right after it claims a group, so that the split does
    not depend on timing: the second must compute the other groups, leave the frozen worker's
    claim alone and wait for it; then the first, continued, finishes its group."""
    grid, store, log = write_grid(tmp_path, tiny_path, text=SHARED_GRID), tmp_path / "shared.sqlite", tmp_path / "second.err"
    first = sweep(grid, "--store", store)
    deadline = time.time() + 300  # a loaded machine takes long to start a worker
    with open(log, "w") as err:
        try:
            while not stop_once_claiming(store, first):
                if first.poll() is not None:
                    raise AssertionError(f"the first worker ended ({first.returncode}) before it was seen claiming: {first.communicate()[1][-2000:]}")
                assert time.time() < deadline, "the first worker claimed nothing in 300 s"
                time.sleep(0.01)
            second = sweep(grid, "--store", store, stderr=err)
            while "waiting" not in log.read_text():
                assert second.poll() is None and time.time() < deadline + 60, log.read_text()
                time.sleep(0.05)
        finally:
            first.send_signal(signal.SIGCONT)
        for p in (first, second):
            out, _ = p.communicate(timeout=300)
            assert p.returncode == 0 and "nothing left to run" in out, log.read_text()
    assert f":{first.pid})" in log.read_text()  # whom it waited for
    with sqlite3.connect(store) as db:
        rows = db.execute("SELECT cell, run, json_extract(settings, '$.seed'), worker FROM runs").fetchall()
    assert claims(store) == 0
    assert len(rows) == len({(cell, run) for cell, run, _, _ in rows}) == 9
    by_seed = {}
    for _, _, seed, worker in rows:
        by_seed.setdefault(seed, set()).add(int(worker.split(":")[1]))
    assert by_seed == {0: {first.pid}, 1: {second.pid}, 2: {second.pid}}  # a group is one worker's
    started = time.time()
    again = sweep(grid, "--store", store)
    out, err = again.communicate(timeout=300)
    assert again.returncode == 0 and "0 runs written" in out and "waiting" not in err, err
    assert count(store) == 9 and time.time() - started < 60


@pytest.mark.parametrize("signum, code, word", [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "stopped by SIGTERM")])
def test_ctrl_c_or_a_scheduler_s_sigterm_releases_the_claim(tmp_path, tiny_path, signum, code, word):
    grid, store = write_grid(tmp_path, tiny_path, limit=200), tmp_path / "s.sqlite"  # still running at the signal
    proc = sweep(grid, "--store", store)
    deadline = time.time() + 120
    while count(store) < 1:
        assert proc.poll() is None and time.time() < deadline, proc.stderr.read()
        time.sleep(0.01)
    assert claims(store) == 1
    proc.send_signal(signum)  # once: one landing in a llama.cpp callback is not lost
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == code and f"{word}: every finished run is in" in err, err
    assert claims(store) == 0 and 0 < count(store) < EXPECTED_RUNS


def test_workers_killed_at_random_moments_lose_and_duplicate_nothing(tmp_path, tiny_path):
    """Rounds of two workers on one store, SIGKILLed once the round has written something, the
    second after a seeded random delay (mid-evaluation, mid-write, waiting), then one worker
    that finishes: the claims of the killed ones are taken over at once, their processes gone."""
    rng = random.Random(7)
    grid, store = write_grid(tmp_path, tiny_path, text=SHARED_GRID), tmp_path / "shared.sqlite"
    deadline, killed_mid_sweep = time.time() + 120, 0
    for _ in range(3):
        before = count(store)
        workers = [sweep(grid, "--store", store) for _ in range(2)]
        while count(store) == before and before < 9:
            assert all(p.poll() is None for p in workers) and time.time() < deadline, [p.stderr.read() for p in workers if p.poll() is not None]
            time.sleep(0.02)
        for i, proc in enumerate(workers):
            time.sleep(rng.uniform(0, 1) if i else 0)  # the first at once, so some kill lands mid-sweep however fast
            killed_mid_sweep += count(store) < 9
            proc.send_signal(signal.SIGKILL)
            proc.wait()
    assert killed_mid_sweep, "the kills must land mid-sweep"
    with Store(store, readonly=True) as s:
        sw = Sweep(load_grid(grid), s)
        unfinished = {p.cell.group for p in sw.plan() if p.runs}
        orphaned = [g for g in sw.claimed() if g in unfinished]
    final = sweep(grid, "--store", store)
    _, err = final.communicate(timeout=300)
    assert final.returncode == 0 and "waiting" not in err, err  # no wait for a dead worker's claim to expire
    assert all(f"seed {g[3]} from" in err for g in orphaned), err
    with sqlite3.connect(store) as db:
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        keys = db.execute("SELECT cell, run FROM runs").fetchall()
    assert claims(store) == 0
    with Store(store, readonly=True) as s:
        assert not any(p.runs for p in Sweep(load_grid(grid), s).plan())
    assert len(keys) == len(set(keys)) == 9


def test_shards_split_the_cells_and_report_merges_them(tmp_path, tiny_path):
    grid = write_grid(tmp_path, tiny_path)
    stores = [tmp_path / f"shard{i}.sqlite" for i in range(2)]
    for i, store in enumerate(stores):
        p = sweep(grid, "--store", store, "--shard", f"{i}/2")
        _, err = p.communicate(timeout=600)
        assert p.returncode == 0, err
    assert sum(count(s) for s in stores) == EXPECTED_RUNS
    out = subprocess.run(
        [sys.executable, "-m", "kvinject", "report", *map(str, stores), "--format", "json"], check=False, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    assert {(r["bench"], r["configuration"]) for r in rows} == {
        (b, c) for b in ("nexttoken", "perplexity") for c in ("none", "none @bf16", "normal:0,0.25", "normal:0,0.5")
    }
    control = [r for r in rows if r["configuration"] == "none"]
    assert all(r["% control"] == pytest.approx(100) for r in control if r["score"])
    for fmt, marker in (("markdown", "| bench"), ("csv", "model,bench"), ("latex", "\\begin{tabular}")):
        out = subprocess.run(
            [sys.executable, "-m", "kvinject", "report", *map(str, stores), "--format", fmt, "--filter", "bench=perplexity"],
            check=False,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert out.returncode == 0 and marker in out.stdout and "nexttoken" not in out.stdout, out.stderr


def test_report_draws_degradation_curves(tmp_path, tiny_path):
    grid, store, png = write_grid(tmp_path, tiny_path), tmp_path / "s.sqlite", tmp_path / "curves.png"
    _, err = (p := sweep(grid, "--store", store)).communicate(timeout=600)
    assert p.returncode == 0, err
    out = subprocess.run([sys.executable, "-m", "kvinject", "report", str(store), "--plot", str(png)], check=False, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_dry_run_estimate_counts_parallel_generation(tmp_path, tiny_path):
    estimates = {}
    for parallel in (1, 8, 32):
        path = write_grid(tmp_path, tiny_path, text=GRID.replace("runs = 2", f"runs = 2\nparallel = {parallel}"))
        with Store(tmp_path / f"p{parallel}.sqlite") as store:
            sw = Sweep(load_grid(path), store)
            estimates[parallel] = sw.estimate_seconds(sw.plan())
    assert estimates[1] > estimates[8] == estimates[32]  # no gain beyond 8 sequences on 2 cores


def test_dry_run_estimate_counts_a_prompt_once_for_the_eviction_configurations_sharing_it(tmp_path, tiny_path):
    """With one sequence per context, the second and later eviction configurations that read
    what the first reads restore its prompts (kvinject/engine/cache/prefills.py): they cost generation only."""
    grid = "[sweep]\nmodels = ['{model}']\nruns = 1\nparallel = {parallel}\nflash_attn = 'off'\n[bench.niah]\nlengths = [1024]\n[[errors]]\nspec = {specs}\n"
    seconds = {}
    grids = [(1, ["evict:knorm,0.5"]), (1, ["evict:knorm,0.5", "evict:window,0.5"]), (1, ["evict:knorm,0.5", "evict:tova,0.5"])]
    for parallel, specs in grids:
        path = tmp_path / f"g{len(seconds)}.toml"
        path.write_text(grid.format(model=tiny_path, parallel=parallel, specs=specs).replace("'", '"'))
        with Store(tmp_path / f"e{len(seconds)}.sqlite") as store:
            sw = Sweep(load_grid(path), store)
            seconds[parallel, tuple(specs)] = sw.estimate_seconds([p for p in sw.plan() if not p.cell.control])
    one = seconds[1, ("evict:knorm,0.5",)]
    generation = Speed(1, prompts=False).generation(1, 1024, 128) * 10  # niah's 10 items at 1024 tokens, 128 generated
    assert seconds[1, ("evict:knorm,0.5", "evict:window,0.5")] == pytest.approx(one + generation)
    assert seconds[1, ("evict:knorm,0.5", "evict:tova,0.5")] == pytest.approx(2 * one), "tova reads attention: it decodes its own"
    assert generation < one / 2


def test_dry_run_estimate_counts_a_prompt_once_for_faults_placed_after_it(tmp_path, tiny_path):
    """Faults in generated tokens: the second configuration restores the prompts the first decoded."""
    grid = "[sweep]\nmodels = ['{model}']\nruns = 1\n[bench.niah]\nlengths = [1024]\n[[errors]]\nspec = {specs}\n"
    seconds = {}
    for specs in (["faults:1,stage=generated"], ["faults:1,stage=generated", "faults:1,bit=3,stage=generated"], ["faults:1", "faults:1,bit=3"]):
        path = tmp_path / f"g{len(seconds)}.toml"
        path.write_text(grid.format(model=tiny_path, specs=specs).replace("'", '"'))
        with Store(tmp_path / f"f{len(seconds)}.sqlite") as store:
            sw = Sweep(load_grid(path), store)
            seconds[tuple(specs)] = sw.estimate_seconds([p for p in sw.plan() if not p.cell.control])
    one = seconds[("faults:1,stage=generated",)]
    generation = Speed(CPU_PARALLEL, prompts=False).generation(1, 1024, 128) * 10
    assert seconds[("faults:1,stage=generated", "faults:1,bit=3,stage=generated")] == pytest.approx(one + generation)
    assert seconds[("faults:1", "faults:1,bit=3")] == pytest.approx(2 * one), "faults in the prompt decode it"


def test_report_rows_from_different_grids_show_the_settings_they_differ_in(tmp_path, tiny_path):
    small = "[sweep]\nmodels = ['{model}']\nruns = 1\n[bench.nexttoken]\nlimit = {limit}\n"
    stores = []
    for limit in (2, 3):
        folder = tmp_path / f"limit{limit}"
        folder.mkdir()
        grid, store = write_grid(folder, tiny_path, limit=limit, text=small), folder / "s.sqlite"
        _, err = (p := sweep(grid, "--store", store)).communicate(timeout=600)
        assert p.returncode == 0, err
        stores.append(store)

    def report(*paths):
        out = subprocess.run([sys.executable, "-m", "kvinject", "report", *map(str, paths), "--format", "json"], capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)

    merged = report(*stores)
    assert sorted(r["option.limit"] for r in merged) == [2, 3]  # two "none" rows, told apart
    assert "option.limit" not in report(stores[0])[0]  # a setting all rows share is not a column
    table = subprocess.run(
        [sys.executable, "-m", "kvinject", "report", *map(str, stores)], capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "100"}
    )
    assert table.returncode == 0, table.stderr
    assert re.search(r"[┃ ]limit ┃", table.stdout) and "option.limit" not in table.stdout and "nexttoken: accuracy, model tiny-llama.gguf" in table.stdout
    assert max(map(len, table.stdout.splitlines())) <= 100 and "…" not in table.stdout


def test_report_keeps_apart_what_differs_only_in_flash_attention(tmp_path, tiny_path):
    """Labels leave flash attention out: rows of two grids that differ only there are two
    experiments, each against its own control, not one row pooling both."""
    records = []
    for flash in ("on", "off"):
        grid = write_grid(tmp_path, tiny_path, text=f"[sweep]\nmodels = ['{{model}}']\nruns = 1\nflash_attn = '{flash}'\n[bench.nexttoken]\nlimit = 3\n")
        with Store(tmp_path / f"{flash}.sqlite") as store:
            Sweep(load_grid(grid), store).run()
            records += list(store.records())
    rows = summarize(records)
    control = rows[(rows["label"] == "none") & (rows["metric"] == "accuracy")]
    assert sorted(control["flash_attn"]) == ["off", "on"] and list(control["n"]) == [1, 1]


RESUME_GRID = """
[sweep]
models = ["{model}"]
runs = 1
control = "recompute@f32"
flash_attn = "off"

[bench.gsm8k]
limit = 4
shots = 1
max_tokens = 24

[[errors]]
spec = {specs}
"""


def swept_units(grid, store) -> int:
    """Run the sweep of ``grid`` on ``store``; the items it evaluated (its progress units)."""
    units = []

    def progress(name, total):
        if name.startswith("gsm8k"):
            units.append(total)
        return lambda n: None

    Sweep(load_grid(grid), store).run(progress)
    return sum(units)


def gsm8k_records(store) -> dict[str, dict]:
    return {r["label"]: r for r in store.records()}


def test_a_resumed_generation_sweep_takes_the_control_from_the_store(tmp_path, tiny_path):
    """A store that holds the control's run gives later configurations its tokens and scores:
    the control is not generated again (cache-free generation is the slowest configuration),
    and what is stored equals an uninterrupted sweep's. A control stored without its tokens (a
    record of format 1) is evaluated again once, and gets them."""
    full = tmp_path / "full.toml"
    full.write_text(RESUME_GRID.format(model=tiny_path, specs='["none@f16", "none@bf16"]'))
    first = tmp_path / "first.toml"
    first.write_text(RESUME_GRID.format(model=tiny_path, specs='["none@f16"]'))
    with Store(tmp_path / "whole.sqlite") as whole:
        assert swept_units(full, whole) == 3 * 4
        expected = gsm8k_records(whole)
    with Store(tmp_path / "resumed.sqlite") as resumed:
        assert swept_units(first, resumed) == 2 * 4
        assert swept_units(full, resumed) == 4, "only none@bf16's items: the control came from the store"
        got = gsm8k_records(resumed)
    assert set(got) == set(expected) == {"recompute @f32", "none", "none @bf16"}
    control = expected["recompute @f32"]
    assert len(control["outputs"]) == 4 and all(len(tokens) > 0 for tokens in control["outputs"])
    for label, record in expected.items():
        assert got[label]["outputs"] == record["outputs"], label
        assert got[label]["metrics"] | {"seconds": 0} == record["metrics"] | {"seconds": 0}, label
        assert got[label]["items"] == record["items"], label
    assert "flip_rate" in got["none @bf16"]["metrics"] and "token_match" in got["none @bf16"]["metrics"]

    # Record format 1: the control's record has no tokens.
    with Store(tmp_path / "whole.sqlite") as whole:
        whole._db.execute("UPDATE runs SET record = json_remove(record, '$.outputs')")
        whole._db.execute("DELETE FROM runs WHERE json_extract(settings, '$.label') = 'none @bf16'")
        assert swept_units(full, whole) == 2 * 4, "the control again, then none@bf16"
        again = gsm8k_records(whole)
    assert again["recompute @f32"]["outputs"] == control["outputs"], "the control's tokens were added to its record"
    assert again["none @bf16"]["metrics"] | {"seconds": 0} == expected["none @bf16"]["metrics"] | {"seconds": 0}
