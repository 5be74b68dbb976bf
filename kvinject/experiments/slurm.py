"""A sweep as a SLURM job array: a run folder with the job script, one store per array task
(SQLite's locking is not safe on the network filesystems of clusters, so no store is shared
across nodes), the submissions made, and what each task has done and left.

The run folder holds ``job.sh``, ``run.json`` (the grid, the number of tasks and every
submission's job id, tasks and kvinject version), ``logs/taskI.log`` and ``shardIofN.results.sqlite``. Array task
i always runs shard i/n of the grid, so a resubmitted task resumes its own store."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from .. import __version__
from ..exceptions import KvinjectError
from ..files import write_text
from .grid import MAX_CELLS, Grid, load_grid
from .schemas import MAX_TASKS, DamagedError, run_folder
from .store import Store
from .sweep import Planned, Sweep, shard_of

RUN_FILE = "run.json"
SCRIPT = "job.sh"
# Scheduler states in which a task still holds or waits for a node: not resubmitted.
LIVE = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "REQUEUED", "RESIZING", "SUSPENDED", "REQUEUE_HOLD", "REQUEUE_FED", "SIGNALING", "STAGE_OUT"}


class SlurmError(KvinjectError):
    """A scheduler command failed, or a run folder is not one."""


@dataclass(frozen=True)
class SlurmOptions:
    """What goes into the job script's #SBATCH lines; None leaves the cluster's default."""

    tasks: int = 4
    time: str | None = None  # --time, e.g. 4:00:00 (the cluster's format)
    partition: str | None = None
    gres: str | None = None  # --gres, e.g. gpu:1
    cpus_per_task: int | None = None
    requeue: bool = False  # let the scheduler requeue a preempted or failed task (it resumes its store)
    extra: tuple[str, ...] = ()  # more sbatch arguments, each one #SBATCH line
    parallel: int | None = None  # the tasks' sweep --parallel
    max_cells: int = MAX_CELLS  # and its --max-cells

    def __post_init__(self) -> None:
        if not 1 <= self.tasks <= MAX_TASKS:
            raise KvinjectError(f"--tasks takes 1 to {MAX_TASKS} array tasks, got {self.tasks}")
        if self.time is not None and not re.fullmatch(r"([0-9]+-)?[0-9]+(:[0-9]+){0,2}", self.time):
            raise KvinjectError(f"--time takes SLURM's [D-]HH:MM:SS, MM:SS or minutes, e.g. 4:00:00, got '{self.time}'")
        for arg in self.extra:
            if not re.match(r"--?[A-Za-z]", arg):
                raise KvinjectError(f"--sbatch-arg takes one sbatch option such as --account=ml or --qos=long, got '{arg}'")
            name = _sbatch_option(arg)
            if name in OWN:
                raise KvinjectError(f"--sbatch-arg {arg}: kvinject sets {name} itself (tasks, logs and folder)")
            if name is not None:
                raise KvinjectError(f"--sbatch-arg {arg}: give it as kvinject's own {name}")


# The script's #SBATCH options that an --sbatch-arg may not set, by long name and short letter:
# kvinject's own (the array and where its logs and stores are), and those its own flags set.
OWN = {"--array": "-a", "--output": "-o", "--chdir": "-D"}
FLAGS = {"--time": "-t", "--partition": "-p", "--gres": None, "--cpus-per-task": "-c"}


def _sbatch_option(arg: str) -> str | None:
    """Which of OWN and FLAGS ``arg`` sets, read as sbatch reads it (getopt_long): a long name
    or a prefix of one (`--arr=0-3`), a short letter with its value apart or attached (`-a0-3`)."""
    name = re.split(r"[=\s]", arg, maxsplit=1)[0]
    if name.startswith("--"):
        return next((o for o in [*OWN, *FLAGS] if len(name) > 2 and o.startswith(name)), None)
    return next((o for o, letter in {**OWN, **FLAGS}.items() if letter is not None and name[:2] == letter), None)


def default_folder(grid: Path) -> Path:
    """The run folder of a grid: beside it, named for it (examples/paper.toml: examples/paper.slurm)."""
    if grid.is_dir() or not grid.name:  # `.` has no name to put .slurm on: a ValueError traceback
        raise KvinjectError(f"cannot read {grid}: it is a folder; give the grid's file")
    return grid.with_suffix(".slurm")


@dataclass
class TaskStatus:
    task: int
    state: str  # the scheduler's, or "not submitted" / "ended" when it no longer knows the task
    job: str | None
    cells: int
    cells_done: int
    runs_left: int
    store: Path

    @property
    def finished(self) -> bool:
        return self.cells_done == self.cells


@dataclass
class SlurmRun:
    folder: Path
    grid: Path  # absolute: tasks start in the submission's folder, but the run folder may move with its stores
    tasks: int
    workdir: Path
    max_cells: int = MAX_CELLS
    submissions: list[dict] = field(default_factory=list)  # {"job": id, "tasks": [...], "time": epoch seconds, "kvinject": version}

    @classmethod
    def create(cls, grid: Path, folder: Path, options: SlurmOptions) -> SlurmRun:
        """A new run folder for `grid` with its job script; run.json is written at the first
        submission, so a failed one leaves nothing to refuse. A submitted run folder is refused:
        its stores belong to a split into its own number of tasks."""
        if (folder / RUN_FILE).exists():
            raise KvinjectError(f"{folder} already holds a submitted run: see it with --status, or resubmit its unfinished tasks with --resubmit")
        run = cls.draft(grid, folder, options)
        (run.folder / "logs").mkdir(parents=True, exist_ok=True)
        write_text(run.folder / SCRIPT, run.script(options), keep=False)
        return run

    @classmethod
    def draft(cls, grid: Path, folder: Path, options: SlurmOptions) -> SlurmRun:
        """The run as it would be created, written nowhere (--dry-run)."""
        return cls(folder.resolve(), grid.resolve(), options.tasks, Path.cwd(), options.max_cells)

    @classmethod
    def open(cls, folder: Path) -> SlurmRun:
        try:
            saved = json.loads((folder / RUN_FILE).read_text())
        except FileNotFoundError:
            raise KvinjectError(f"{folder} is not a run folder of kvinject sweep --slurm (no {RUN_FILE} in it)") from None
        except (OSError, UnicodeDecodeError, ValueError) as e:
            raise DamagedError(f"{folder / RUN_FILE}: damaged ({e}); restore it, or submit the grid again into a new run folder (--run-folder)") from None
        run_folder(folder / RUN_FILE, saved)
        return cls(folder.resolve(), Path(saved["grid"]), saved["tasks"], Path(saved["workdir"]), saved["max_cells"], saved["submissions"])

    def save(self) -> None:
        saved = {"grid": str(self.grid), "tasks": self.tasks, "workdir": str(self.workdir), "max_cells": self.max_cells, "submissions": self.submissions}
        write_text(self.folder / RUN_FILE, json.dumps(saved, indent=1) + "\n")

    def store(self, task: int) -> Path:
        return self.folder / f"shard{task}of{self.tasks}.results.sqlite"

    def script(self, options: SlurmOptions) -> str:
        """The job-array script: task i runs shard i/n of the grid into its own store. The
        interpreter is this one (the cluster's nodes share the login node's filesystem)."""
        lines = [
            "#!/bin/bash",
            f"#SBATCH --job-name={shlex.quote('kvinject-' + self.grid.stem)}",
            f"#SBATCH --array=0-{self.tasks - 1}",
            f"#SBATCH --output={shlex.quote(str(self.folder / 'logs' / 'task%a.log'))}",
            "#SBATCH --open-mode=append",  # a resubmitted or requeued task adds to its log
            f"#SBATCH --chdir={shlex.quote(str(self.workdir))}",  # the grid's relative paths as at submission
        ]
        lines += [
            f"#SBATCH --{name}={value}"
            for name, value in (("time", options.time), ("partition", options.partition), ("gres", options.gres), ("cpus-per-task", options.cpus_per_task))
            if value is not None
        ]
        lines += ["#SBATCH --requeue" if options.requeue else "#SBATCH --no-requeue"]
        lines += [f"#SBATCH {arg}" for arg in options.extra]
        task = '"$SLURM_ARRAY_TASK_ID"'
        store = shlex.quote(str(self.folder) + "/shard") + task + shlex.quote(f"of{self.tasks}.results.sqlite")
        lines += [
            "# kvinject sweep keeps every finished run when the time limit's SIGTERM comes and exits 143;",
            "# resubmit what is unfinished with: kvinject sweep " + shlex.quote(str(self.folder)) + " --resubmit",
            f"exec {shlex.quote(sys.executable)} -m kvinject sweep {shlex.quote(str(self.grid))} --shard {task}/{self.tasks} --store {store}"
            + f" --max-cells {self.max_cells}"
            + (f" --parallel {options.parallel}" if options.parallel else ""),
        ]
        return "\n".join(lines) + "\n"

    def submit(self, tasks: list[int]) -> str:
        """Submit the job script for these array tasks; returns the job id."""
        indices = ",".join(str(t) for t in tasks)
        out = _scheduler(["sbatch", "--parsable", f"--array={indices}", str(self.folder / SCRIPT)])
        job = out.strip().split(";")[0]  # --parsable: JOBID[;CLUSTER]
        self.submissions.append({"job": job, "tasks": tasks, "time": round(time.time()), "kvinject": __version__})
        self.save()
        return job

    def status(self) -> list[TaskStatus]:
        """Each task's state in the scheduler and what its store holds."""
        states = _states([s["job"] for s in self.submissions])
        _, planned = _plan(load_grid(self.grid, self.max_cells))
        out = []
        for task in range(self.tasks):
            job = next((s["job"] for s in reversed(self.submissions) if task in s["tasks"]), None)
            state = "not submitted" if job is None else states.get((job, task), "ended")
            done = _done(self.store(task))
            left = [Planned(p.cell, p.key, [r for r in p.runs if (p.key, r) not in done]) for p in _task(planned, task, self.tasks)]
            out.append(TaskStatus(task, state, job, len(left), sum(not p.runs for p in left), sum(len(p.runs) for p in left), self.store(task)))
        return out

    def unfinished(self) -> tuple[list[int], list[int]]:
        """The tasks to resubmit (runs left, not queued or running) and those still live."""
        tasks = self.status()
        live = [t.task for t in tasks if t.state in LIVE]
        return [t.task for t in tasks if not t.finished and t.state not in LIVE], live


def plan_tasks(grid_path: Path, options: SlurmOptions) -> list[tuple[list[Planned], float]]:
    """Before submitting: each task's cells and its estimated seconds (nothing is written)."""
    sweep, planned = _plan(load_grid(grid_path, options.max_cells))
    return [(cells, sweep.estimate_seconds(cells)) for cells in (_task(planned, task, options.tasks) for task in range(options.tasks))]


def _plan(grid: Grid) -> tuple[Sweep, list[Planned]]:
    """Every cell of the grid with all its runs, planned once for all tasks: the benches load
    their data and the models are hashed once, not once a task."""
    sweep = Sweep(grid, Store(Path(":memory:")))
    return sweep, sweep.plan()


def _task(planned: list[Planned], task: int, tasks: int) -> list[Planned]:
    """The cells array task ``task`` runs: shard task/tasks, as its `sweep --shard` takes them."""
    return [p for p in planned if shard_of(p.cell, tasks) == task]


def _done(store: Path) -> set[tuple[str, int]]:
    if not store.exists():
        return set()
    with Store(store, readonly=True) as s:
        return s.done()


def _scheduler(command: list[str]) -> str:
    if shutil.which(command[0]) is None:
        raise SlurmError(f"{command[0]} not found: --slurm works where SLURM's commands are (a cluster's login node); --dry-run shows the script anywhere")
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:  # its lines as one: an error is one line
        said = done.stderr.strip() or done.stdout.strip()
        raise SlurmError(f"{command[0]} failed: {'; '.join(line.strip() for line in said.splitlines() if line.strip())}")
    return done.stdout


def _states(jobs: list[str]) -> dict[tuple[str, int], str]:
    """(job, array task) -> state: squeue for tasks queued or running, sacct for the ended ones
    (where the cluster keeps accounting), else scontrol while it still remembers them."""
    if not jobs:
        return {}
    states: dict[tuple[str, int], str] = {}
    listed = ",".join(jobs)
    for line in _quiet(["sacct", "-n", "-P", "-X", "-j", listed, "--format=JobID,State"]).splitlines():
        m = re.fullmatch(r"(\d+)_(\d+)\|(\w+).*", line)
        if m:
            states[(m[1], int(m[2]))] = m[3]
    if not states:
        for job in jobs:
            for line in _quiet(["scontrol", "-o", "show", "job", job]).splitlines():
                m = re.search(r"ArrayJobId=(\d+) ArrayTaskId=(\d+) .*?JobState=(\w+)", line)
                if m:
                    states[(m[1], int(m[2]))] = m[3]
    for line in _queued(listed).splitlines():
        m = re.fullmatch(r"(\d+)\|(\d+)\|(\w+)", line.strip())
        if m:
            states[(m[1], int(m[2]))] = m[3]
    return states


def _queued(listed: str) -> str:
    """squeue's line for each array task still queued or running: the one answer that must come,
    since a task it does not list counts as ended and `--resubmit` would submit it again."""
    try:
        return _scheduler(["squeue", "-h", "-r", "-j", listed, "-o", "%F|%K|%T"])  # -r: one line per array task
    except SlurmError as e:
        if "Invalid job id" in str(e):  # the controller has forgotten these jobs: none of them runs
            return ""
        raise SlurmError(
            f"cannot tell which tasks are queued or running ({e}): try again when SLURM answers (nothing is resubmitted on an unknown state)"
        ) from None


def _quiet(command: list[str]) -> str:
    """A query's output, or nothing where the command is missing or fails (sacct without
    accounting, a job the scheduler has forgotten)."""
    if shutil.which(command[0]) is None:
        return ""
    done = subprocess.run(command, capture_output=True, text=True)
    return done.stdout if done.returncode == 0 else ""
