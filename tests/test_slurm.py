"""`kvinject sweep --slurm` against a real SLURM: a single-node cluster that tests/slurm/cluster.sh
starts in a folder of its own (Debian's slurm-wlm and munge; `.ci/run` installs them). Where it
cannot start (no SLURM installed, not root), these tests skip."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvinject import __version__ as kvinject_version
from kvinject.experiments.slurm import SlurmRun
from kvinject.experiments.store import Store

CLUSTER = Path(__file__).parent / "slurm" / "cluster.sh"

GRID = """
[sweep]
models = ["{model}"]
runs = {runs}
seeds = [0, 1]
threads = 1

[bench.nexttoken]
limit = {limit}

[[errors]]
model = "normal"
mean = 0
std = [0.25, 0.5]
"""


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    """The cluster's environment (SLURM_CONF); its jobs cancelled and its daemons stopped by their
    process ids afterwards."""
    folder = tmp_path_factory.mktemp("slurm")
    out = subprocess.run(["bash", str(CLUSTER), "start", str(folder)], capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        pytest.skip(f"no SLURM cluster starts here: {out.stderr.strip().splitlines()[-1:]}")
    pids = [int(p) for p in out.stdout.split()]
    env = os.environ | {"SLURM_CONF": str(folder / "slurm.conf")}
    try:
        yield env
    finally:
        jobs = subprocess.run(["squeue", "-h", "-o", "%F"], capture_output=True, text=True, env=env).stdout.split()
        if jobs:
            subprocess.run(["scancel", *set(jobs)], env=env, check=False)
            _wait(lambda: not subprocess.run(["squeue", "-h"], capture_output=True, text=True, env=env).stdout.strip(), 60)
        for pid in reversed(pids):  # slurmd, slurmctld, then munged
            os.kill(pid, signal.SIGTERM)
            if not _wait(lambda: _gone(pid), 10):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture
def cluster(slurm, monkeypatch):
    """The cluster for commands run here too (SlurmRun's queries), not only in subprocesses."""
    monkeypatch.setenv("SLURM_CONF", slurm["SLURM_CONF"])
    return slurm


def _wait(done, seconds: float) -> bool:
    deadline = time.time() + seconds
    while time.time() < deadline:
        if done():
            return True
        time.sleep(0.5)
    return done()


def kvinject(*args, env, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kvinject", *map(str, args)], capture_output=True, text=True, env=env, cwd=cwd, timeout=600)


def write_grid(folder: Path, model: Path, runs: int, limit: int) -> Path:
    grid = folder / "grid.toml"
    grid.write_text(GRID.format(model=model, runs=runs, limit=limit))
    return grid


def queued(env, job: str) -> bool:
    return bool(subprocess.run(["squeue", "-h", "-j", job], capture_output=True, text=True, env=env).stdout.strip())


def records(folder: Path) -> list[tuple[str, int, str]]:
    """(cell, run, its record as JSON) of every store in the run folder."""
    out = []
    for path in sorted(folder.glob("*.results.sqlite")):
        with Store(path, readonly=True) as store:
            out += [(r["cell"], r["run"], json.dumps(r, sort_keys=True)) for r in store.records()]
    return out


def submitted(out: subprocess.CompletedProcess) -> str:
    assert out.returncode == 0, out.stderr
    return out.stdout.split("submitted job ")[1].split(":")[0]


def test_a_grid_on_slurm_runs_each_cell_once_and_reports_as_a_local_sweep(cluster, tiny_path, tmp_path):
    grid = write_grid(tmp_path, tiny_path, runs=2, limit=3)
    job = submitted(kvinject("sweep", grid, "--slurm", "--tasks", 3, "--time", "5", env=cluster, cwd=tmp_path))
    assert _wait(lambda: not queued(cluster, job), 300), "the array did not finish in 5 minutes"
    status = kvinject("sweep", tmp_path / "grid.slurm", "--status", env=cluster, cwd=tmp_path)
    assert status.returncode == 0 and "every task is finished" in status.stdout, status.stdout + status.stderr
    run = SlurmRun.open(tmp_path / "grid.slurm")
    tasks = run.status()  # two cell groups in three tasks: one or two have none, not submitted
    assert len(tasks) == 3 and all(t.state == ("COMPLETED" if t.cells else "not submitted") for t in tasks) and any(t.cells for t in tasks)
    assert [s["kvinject"] for s in run.submissions] == [kvinject_version]
    on_slurm = records(tmp_path / "grid.slurm")
    local = tmp_path / "local.sqlite"
    assert kvinject("sweep", grid, "--store", local, env=cluster, cwd=tmp_path).returncode == 0
    with Store(local, readonly=True) as store:
        here = {(r["cell"], r["run"]) for r in store.records()}
    keys = [(cell, run) for cell, run, _ in on_slurm]
    assert len(keys) == len(set(keys)) == len(here) == 2 * (1 + 2 * 2) and set(keys) == here  # per seed: control once, two noises twice
    reports = [kvinject("report", where, "--format", "json", env=cluster, cwd=tmp_path) for where in (tmp_path / "grid.slurm", local)]
    assert reports[0].returncode == 0, reports[0].stderr
    rows = [sorted(json.dumps(row, sort_keys=True) for row in json.loads(r.stdout)) for r in reports]  # experiments in the order stores give them
    assert rows[0] == rows[1]  # same records, same aggregates


def test_a_cancelled_task_resubmitted_completes_its_shard_with_nothing_lost_or_repeated(cluster, tiny_path, tmp_path):
    grid = write_grid(tmp_path, tiny_path, runs=20, limit=60)
    job = submitted(kvinject("sweep", grid, "--slurm", "--tasks", 1, env=cluster, cwd=tmp_path))
    folder = tmp_path / "grid.slurm"
    assert _wait(lambda: len(records(folder)) >= 3, 300), "no run was stored"
    subprocess.run(["scancel", job], env=cluster, check=True)
    assert _wait(lambda: not queued(cluster, job), 60)
    before = records(folder)
    run = SlurmRun.open(folder)
    (task,) = run.status()
    assert task.state == "CANCELLED" and not task.finished and task.runs_left == 2 * (1 + 2 * 20) - len(before), "the cancel must land mid-shard"
    again = kvinject("sweep", grid, "--resubmit", env=cluster, cwd=tmp_path)
    assert again.returncode == 0 and "resubmitted 1 task (0) as job" in again.stdout, again.stdout + again.stderr
    second = again.stdout.split("as job ")[1].split()[0]
    assert _wait(lambda: not queued(cluster, second), 300)
    after = records(folder)
    keys = [(cell, run) for cell, run, _ in after]
    assert len(keys) == len(set(keys)) == 2 * (1 + 2 * 20)
    assert set(before) <= set(after), "a run stored before the cancel was computed again"
    nothing = kvinject("sweep", folder, "--resubmit", env=cluster, cwd=tmp_path)
    assert "nothing to resubmit: every task is finished" in nothing.stdout, nothing.stdout + nothing.stderr


def test_a_task_stopped_at_its_time_limit_keeps_its_finished_runs(cluster, tiny_path, tmp_path):
    grid = write_grid(tmp_path, tiny_path, runs=100, limit=300)  # minutes of work against a 1-minute limit
    job = submitted(kvinject("sweep", grid, "--slurm", "--tasks", 1, "--time", "1", env=cluster, cwd=tmp_path))
    folder = tmp_path / "grid.slurm"
    assert _wait(lambda: not queued(cluster, job), 240), "the time limit did not stop the task"
    (task,) = SlurmRun.open(folder).status()
    assert task.state == "TIMEOUT" and 0 < task.cells_done < task.cells
    log = (folder / "logs" / "task0.log").read_text()
    assert "stopped by SIGTERM: every finished run is in" in log, log[-2000:]
    kept = records(folder)
    assert kept and len(kept) == 2 * (1 + 2 * 100) - task.runs_left  # every stored run is whole: the store plans the rest


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity on this platform")
def test_threads_default_to_the_cpus_a_task_may_run_on():
    # A SLURM task bound to its CPUs (task/affinity, cgroups) must not run a thread per core of the node.
    code = (
        "import os; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); "
        "from kvinject.engine.options import BackendOptions; print(BackendOptions().n_threads)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "1"


def test_dry_run_shows_the_script_and_each_tasks_estimate_and_writes_nothing(tiny_path, tmp_path):
    grid = write_grid(tmp_path, tiny_path, runs=2, limit=3)
    sbatch = ["--sbatch-arg=--account=ml", "--sbatch-arg=--gres-flags=enforce-binding"]
    out = kvinject("sweep", grid, "--slurm", "--tasks", 2, "--time", "1:00:00", "--gres", "gpu:1", *sbatch, "--dry-run", env=os.environ, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    # --gres-flags begins as kvinject's own --gres does, and is another option
    for line in (
        "#SBATCH --array=0-1",
        "#SBATCH --time=1:00:00",
        "#SBATCH --gres=gpu:1",
        "#SBATCH --account=ml",
        "#SBATCH --gres-flags=enforce-binding",
        f"#SBATCH --chdir={tmp_path}",
    ):
        assert line in out.stdout.splitlines(), line
    assert '--shard "$SLURM_ARRAY_TASK_ID"/2' in out.stdout and "longest task: about" in out.stdout and "nothing submitted" in out.stdout
    # two tasks share the grid's four cell groups (two seeds, control and two noises each)
    assert sum(int(line.split()[3]) for line in out.stdout.splitlines() if line.startswith("│")) == 2 * 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["grid.toml"]


@pytest.mark.parametrize(
    "args, message",
    [
        (("--tasks", "2"), "--tasks goes with --slurm"),
        (("--slurm", "--shard", "0/2"), "leave out --shard and --store"),
        (("--slurm", "--time", "an hour"), "--time takes SLURM's"),
        (("--slurm", "--sbatch-arg", "account=ml"), "--sbatch-arg takes one sbatch option"),
        (("--slurm", "--sbatch-arg=--", "--dry-run"), "--sbatch-arg takes one sbatch option"),
        (("--slurm", "--sbatch-arg=--array=0-3"), "kvinject sets --array itself"),
        # each as sbatch reads it: a prefix of the long name, a short letter, its value attached or apart
        (("--slurm", "--sbatch-arg=--arr=0-3", "--dry-run"), "--sbatch-arg --arr=0-3: kvinject sets --array itself"),
        (("--slurm", "--sbatch-arg=-D/tmp", "--dry-run"), "--sbatch-arg -D/tmp: kvinject sets --chdir itself"),
        (("--slurm", "--sbatch-arg=--output x", "--dry-run"), "kvinject sets --output itself"),
        (("--slurm", "--sbatch-arg=-t 10", "--dry-run"), "--sbatch-arg -t 10: give it as kvinject's own --time"),
        (("--slurm", "--sbatch-arg=-c4", "--dry-run"), "give it as kvinject's own --cpus-per-task"),
        (("--status",), "is not a run folder of kvinject sweep --slurm"),
        (("--resubmit", "--tasks", "3"), "--status and --resubmit take the run folder's own settings: leave out --tasks"),
    ],
)
def test_slurm_flags_misused_say_what_to_change(tiny_path, tmp_path, args, message):
    grid = write_grid(tmp_path, tiny_path, runs=2, limit=3)
    out = kvinject("sweep", grid, *args, env=os.environ, cwd=tmp_path)
    assert out.returncode == 2 and message in out.stderr and "Traceback" not in out.stderr, out.stderr


def test_a_folder_given_as_the_grid_of_a_slurm_run_is_refused_in_one_line(tmp_path):
    """`sweep . --slurm --dry-run` ended in a ValueError traceback ('.' has an empty name)."""
    out = kvinject("sweep", ".", "--slurm", "--dry-run", env=os.environ, cwd=tmp_path)
    assert out.returncode == 2 and "it is a folder; give the grid's file" in out.stderr and "Traceback" not in out.stderr, out.stderr


def test_without_slurms_commands_submitting_says_where_it_works(tiny_path, tmp_path):
    grid = write_grid(tmp_path, tiny_path, runs=2, limit=3)
    out = kvinject("sweep", grid, "--slurm", env=os.environ | {"PATH": str(Path(sys.executable).parent)}, cwd=tmp_path)
    assert out.returncode == 2 and "sbatch not found: --slurm works where SLURM's commands are" in out.stderr, out.stderr
    assert not (tmp_path / "grid.slurm" / "run.json").exists()  # nothing submitted: trying again is not refused


def test_report_of_a_folder_without_stores_says_so(tmp_path):
    out = kvinject("report", tmp_path, env=os.environ, cwd=tmp_path)
    assert out.returncode == 2 and "holds no results stores" in out.stderr, out.stderr


def _fake_slurm(folder: Path, squeue: str) -> dict:
    """PATH with an sbatch that accepts (job 12, counted in sbatch.calls), an sacct without
    accounting and an squeue that runs `squeue`'s shell body."""
    folder.mkdir()
    tools = {
        "sbatch": f"echo x >> {folder}/sbatch.calls; echo 12",
        "sacct": "echo 'sacct: error: Slurm accounting storage is disabled' >&2; exit 1",
        "scontrol": "exit 1",
        "squeue": squeue,
    }
    for name, body in tools.items():
        (folder / name).write_text(f"#!/bin/sh\n{body}\n")
        (folder / name).chmod(0o755)
    return os.environ | {"PATH": f"{folder}:{os.environ['PATH']}"}


@pytest.mark.parametrize("flag", ["--status", "--resubmit"])
def test_a_scheduler_that_cannot_answer_is_an_error_and_nothing_is_resubmitted(tiny_path, tmp_path, flag):
    """squeue failing ("DNS SRV lookup failed") showed every task as ended, so --resubmit would
    submit tasks that may still be running. Its lines are one line of the error."""
    grid = write_grid(tmp_path, tiny_path, runs=2, limit=3)
    env = _fake_slurm(tmp_path / "bin", "echo 'squeue: error: DNS SRV lookup failed' >&2; echo 'squeue: fatal: no configuration' >&2; exit 1")
    assert kvinject("sweep", grid, "--slurm", "--tasks", "2", env=env, cwd=tmp_path).returncode == 0
    out = kvinject("sweep", tmp_path / "grid.slurm", flag, env=env, cwd=tmp_path)
    said = "cannot tell which tasks are queued or running (squeue failed: squeue: error: DNS SRV lookup failed; squeue: fatal: no configuration)"
    assert out.returncode == 2 and said in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert (tmp_path / "bin" / "sbatch.calls").read_text().count("x") == 1


def test_tasks_without_cells_are_not_submitted_and_said(tiny_path, tmp_path):
    """--tasks 100 on a grid of two cell groups planned 98 empty tasks without a word."""
    grid = write_grid(tmp_path, tiny_path, runs=2, limit=3)
    env = _fake_slurm(tmp_path / "bin", "exit 0")
    out = kvinject("sweep", grid, "--slurm", "--tasks", "100", env=env, cwd=tmp_path)
    # the tasks the two groups hash to (shard_of): one in a hundred model paths send both to the same task
    busy = len(re.findall(r"│\s*\d+ │\s*[1-9]\d* │", out.stdout))
    assert busy in (1, 2), out.stdout
    assert out.returncode == 0 and f"{100 - busy} tasks of 100 (" in out.stdout and "and this grid has 2" in out.stdout, out.stdout + out.stderr
    [submitted] = json.loads((tmp_path / "grid.slurm" / "run.json").read_text())["submissions"]
    assert len(submitted["tasks"]) == busy
    status = kvinject("sweep", tmp_path / "grid.slurm", "--status", env=env, cwd=tmp_path)
    assert status.returncode == 0 and f"{busy} task{'s' if busy > 1 else ''} unfinished" in status.stdout, status.stdout + status.stderr


def test_jobs_the_controller_has_forgotten_are_ended(tiny_path, tmp_path):
    grid = write_grid(tmp_path, tiny_path, runs=2, limit=3)
    env = _fake_slurm(tmp_path / "bin", "echo 'slurm_load_jobs error: Invalid job id specified' >&2; exit 1")
    assert kvinject("sweep", grid, "--slurm", "--tasks", "2", env=env, cwd=tmp_path).returncode == 0
    out = kvinject("sweep", tmp_path / "grid.slurm", "--status", env=env, cwd=tmp_path)
    [submitted] = json.loads((tmp_path / "grid.slurm" / "run.json").read_text())["submissions"]
    states = [line.split("│")[3].strip() for line in out.stdout.splitlines() if line.startswith("│")]
    assert out.returncode == 0 and states.count("ended") == len(submitted["tasks"]) > 0, out.stdout + out.stderr


def test_commands_suggested_paste_into_a_shell(tiny_path, tmp_path):
    """A path with spaces or non-ASCII letters was shown unquoted, which fails when pasted."""
    folder = tmp_path / "dir with spaces"
    folder.mkdir()
    grid = folder / "grïd ü.toml"
    grid.write_text(GRID.format(model=tiny_path, runs=1, limit=2))
    out = kvinject("sweep", grid, env=os.environ, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    [said] = [line for line in out.stdout.splitlines() if "report with:" in line]
    suggested = said.split("report with: ", 1)[1]
    assert suggested == f"kvinject report '{folder}/grïd ü.results.sqlite'"
    assert subprocess.run(["sh", "-c", f"ls {suggested.removeprefix('kvinject report ')}"], capture_output=True).returncode == 0
