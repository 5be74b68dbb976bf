"""`kvinject sweep`: every cell of a grid into a results store, resumable."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table
from rich.text import Text

from ..exceptions import KvinjectError
from ..values import unique
from .flags import ParallelOpt, VerboseOpt
from .outputs import check_writable
from .render import console, count, interrupted, run_sweep, shell_words

SLURM = "SLURM (clusters)"


GridArg = Annotated[Path, typer.Argument(help="Grid file (TOML, see docs/grid-format.md); with --status or --resubmit also a run folder of --slurm.")]
StoreOpt = Annotated[Optional[Path], typer.Option("--store", help="Results store (SQLite). Default: GRID.results.sqlite, or GRID.shardIofN.results.sqlite.")]
ShardOpt = Annotated[
    Optional[str], typer.Option("--shard", help="Run a deterministic 1/n of the cells: i/n, e.g. $SLURM_ARRAY_TASK_ID/$SLURM_ARRAY_TASK_COUNT.")
]
DryRunOpt = Annotated[
    bool,
    typer.Option(
        "--dry-run",
        help="List the expanded cells, what is left to run, which other workers compute what, and a time estimate; run nothing. "
        "With --slurm: the job script and each task's estimate.",
    ),
]
MaxCellsOpt = Annotated[int, typer.Option("--max-cells", min=1, help="Refuse a grid that expands to more cells (a guard against a mistyped range).")]
SlurmOpt = Annotated[
    bool,
    typer.Option(
        "--slurm",
        help="Submit the grid as a SLURM job array: a run folder GRID.slurm/ beside the grid holds the script, "
        "one store per task (never one store shared across nodes) and the logs (docs/cluster.md).",
        rich_help_panel=SLURM,
    ),
]
TasksOpt = Annotated[
    Optional[int],
    typer.Option("--tasks", min=1, help="Array tasks: the grid's cell groups are split into this many shards. Default: 4.", rich_help_panel=SLURM),
]
TimeOpt = Annotated[
    Optional[str], typer.Option("--time", help="Each task's time limit, as sbatch --time (4:00:00); see --dry-run's estimate.", rich_help_panel=SLURM)
]
PartitionOpt = Annotated[Optional[str], typer.Option("--partition", help="sbatch --partition.", rich_help_panel=SLURM)]
GresOpt = Annotated[Optional[str], typer.Option("--gres", help="Generic resources per task, e.g. gpu:1 (sbatch --gres).", rich_help_panel=SLURM)]
CpusOpt = Annotated[Optional[int], typer.Option("--cpus-per-task", min=1, help="sbatch --cpus-per-task.", rich_help_panel=SLURM)]
RequeueOpt = Annotated[bool, typer.Option("--requeue", help="Let the scheduler requeue a preempted task; it resumes its store.", rich_help_panel=SLURM)]
SbatchOpt = Annotated[
    Optional[list[str]], typer.Option("--sbatch-arg", help="Another sbatch option, repeatable, e.g. --sbatch-arg=--account=ml.", rich_help_panel=SLURM)
]
RunFolderOpt = Annotated[Optional[Path], typer.Option("--run-folder", help="The run folder, instead of GRID.slurm/.", rich_help_panel=SLURM)]
StatusOpt = Annotated[
    bool, typer.Option("--status", help="Each task of a submitted run: its state in the scheduler, cells done and runs left.", rich_help_panel=SLURM)
]
ResubmitOpt = Annotated[
    bool,
    typer.Option("--resubmit", help="Submit again the tasks with runs left that are not queued or running; they resume their stores.", rich_help_panel=SLURM),
]


def sweep(
    grid: GridArg,
    store: StoreOpt = None,
    shard: ShardOpt = None,
    dry_run: DryRunOpt = False,
    max_cells: MaxCellsOpt = 5000,
    parallel: ParallelOpt = None,
    verbose: VerboseOpt = False,
    slurm: SlurmOpt = False,
    tasks: TasksOpt = None,
    time_limit: TimeOpt = None,
    partition: PartitionOpt = None,
    gres: GresOpt = None,
    cpus_per_task: CpusOpt = None,
    requeue: RequeueOpt = False,
    sbatch_args: SbatchOpt = None,
    run_folder: RunFolderOpt = None,
    status: StatusOpt = False,
    resubmit: ResubmitOpt = False,
) -> None:
    """Run every cell of a grid into a results store. Safe to interrupt: finished runs are kept,
    and running the same command again does only what is missing. Several workers (one per GPU,
    say) may run the same command on one store on one machine: they split the cell groups.
    On a cluster, --slurm submits the grid as a job array, --status follows it and --resubmit
    sends again what a time limit or a failure left unfinished."""
    from ..experiments.slurm import SlurmOptions, default_folder

    given = (("--tasks", tasks), ("--time", time_limit), ("--partition", partition), ("--gres", gres), ("--cpus-per-task", cpus_per_task))
    given += (("--requeue", requeue), ("--sbatch-arg", sbatch_args), ("--run-folder", run_folder))
    slurm_given = [name for name, value in given if value]
    if status or resubmit:
        if ignored := [*(["--slurm"] if slurm else []), *(name for name in slurm_given if name != "--run-folder"), *(["--shard"] if shard else [])]:
            raise KvinjectError(f"--status and --resubmit take the run folder's own settings: leave out {', '.join(ignored)}")
        folder = run_folder or (grid if grid.is_dir() else default_folder(grid))
        if resubmit:  # it records the submission in the folder
            check_writable(folders={"--run-folder": folder})
        _follow(folder, resubmit)
        return
    if slurm:
        if shard or store:
            raise KvinjectError("--slurm gives each array task its shard and its store in the run folder: leave out --shard and --store")
        sbatch = tuple(unique("--sbatch-arg", sbatch_args or []))
        options = SlurmOptions(tasks or 4, time_limit, partition, gres, cpus_per_task, requeue, sbatch, parallel, max_cells)
        folder = run_folder or default_folder(grid)
        check_writable(folders={"--run-folder": folder}, inputs=[grid])
        _submit(grid, folder, options, dry_run)
        return
    if slurm_given:
        raise KvinjectError(f"{', '.join(slurm_given)} go{'es' if len(slurm_given) == 1 else ''} with --slurm (or --status, --resubmit)")
    _run(grid, store, shard, dry_run, max_cells, parallel, verbose)


def _run(grid: Path, store: Path | None, shard: str | None, dry_run: bool, max_cells: int, parallel: int | None, verbose: bool) -> None:
    """The grid's cells run here into the store (or, with --dry-run, listed)."""
    from ..engine.llama_log import set_verbose
    from ..experiments.grid import load_grid
    from ..experiments.store import Store
    from ..experiments.sweep import Sweep, default_store, parse_shard

    set_verbose(verbose)
    parsed_shard = parse_shard(shard) if shard is not None else None
    g = load_grid(grid, max_cells)
    if parallel is not None:
        g.parallel = parallel
    store_path = store or default_store(grid, parsed_shard)
    check_writable(stores={"--store": store_path}, inputs=[grid])
    if dry_run:  # read what is done and claimed; create and change nothing
        opened = Store(store_path, readonly=True) if store_path.exists() else Store(Path(":memory:"))
    else:
        opened = Store(store_path)
    with opened as s:
        sw = Sweep(g, s, parsed_shard)
        planned = sw.plan()  # a cell the model cannot run fails here, before anything runs
        if dry_run:
            _dry_run(grid, sw, planned, shard, store_path)
            return
        resume = shell_words("kvinject", "sweep", grid, *(["--shard", shard] if shard else []), *(["--store", store] if store else []))
        try:
            written = run_sweep(sw)
        except KeyboardInterrupt as stop:
            raise interrupted(stop, store_path, resume) from None
    console.print(
        f"{written} runs written to {store_path}, nothing left to run; report with: {shell_words('kvinject', 'report', store_path)}",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )


def _dry_run(grid: Path, sw, planned: list, shard: str | None, store_path: Path) -> None:
    """--dry-run: every cell with its runs left and the worker computing it, and a time estimate."""
    from ..experiments.campaign import campaign_margin
    from ..experiments.grid import bench_labels

    left = [p for p in planned if p.runs]
    claims = sw.claimed()
    table = Table()
    for col in ("model", "bench", "configuration", "seed", "runs left", "claimed by"):
        table.add_column(col)
    controls = {p.cell.group: p.cell.config for p in planned if p.cell.control}
    for p, bench in zip(planned, bench_labels([p.cell for p in planned])):
        claim = claims.get(p.cell.group) if p.runs else None
        worker = f"{claim.worker.host}:{claim.worker.pid}{'' if claim.alive(sw.claim_timeout) else ' (expired)'}" if claim else ""
        shown = p.cell.config.label_beside(controls.get(p.cell.group, p.cell.config))
        label = Text(shown + (" (control)" if p.cell.control else ""))  # not markup: [v:all] is text
        table.add_row(p.cell.model, bench, label, str(p.cell.seed), str(len(p.runs)), worker)
    console.print(table)
    minutes = sw.estimate_seconds(left) / 60
    being = sum(len(p.runs) for p in left if (c := claims.get(p.cell.group)) and c.alive(sw.claim_timeout))
    runs_left = sum(len(p.runs) for p in left)
    print(
        f"{grid}: {count(len(planned), 'cell')}{f' (shard {shard})' if shard else ''}, {count(runs_left, 'run')} left"
        + (f", {being} of them being computed by workers now" if being else "")
    )
    campaigns = sorted({(n, p.cell.campaign[1] if p.cell.campaign else 0.95) for p in planned if (n := sw.injections(p.cell))})
    for n, confidence in campaigns:
        print(
            f"fault campaign: {n} injections (items x runs) in each configuration placing faults, a rate within "
            f"±{campaign_margin(n, confidence):.1%} at {confidence:.0%} (sweep.margin sets them)"
        )
    if runs_left:
        print(f"estimate: about {max(minutes, 1):.0f} min on 2 CPU cores, timed on the default model (docs/performance.md)")
    print(f"store: {store_path}")


def _submit(grid: Path, folder: Path, options, dry_run: bool) -> None:
    """Check the grid here, then write the run folder and submit its array (or show both)."""
    from ..experiments.slurm import SlurmRun, plan_tasks

    planned = plan_tasks(grid, options)  # a bad grid fails here, not in every task
    empty = [task for task, (cells, _) in enumerate(planned) if not cells]
    table = Table()
    for col in ("task", "cells", "runs", "estimate"):
        table.add_column(col, justify="right")
    for task, (cells, seconds) in enumerate(planned):
        table.add_row(str(task), str(len(cells)), str(sum(len(p.runs) for p in cells)), f"{max(seconds / 60, 1):.0f} min")
    if dry_run:
        print(SlurmRun.draft(grid, folder, options).script(options), end="")
        console.print(table)
        longest = max(seconds for _, seconds in planned) / 60
        print(f"longest task: about {max(longest, 1):.0f} min on 2 CPU cores, timed on the default model (docs/performance.md); nothing submitted")
        return
    run = SlurmRun.create(grid, folder, options)
    job = run.submit([task for task in range(options.tasks) if task not in empty])
    console.print(table)
    if empty:  # groups go to tasks by a hash of each, so that adding a cell moves no other
        groups = len({p.cell.group for cells, _ in planned for p in cells})
        console.print(
            f"{count(len(empty), 'task')} of {options.tasks} ({', '.join(map(str, empty))}) would have nothing to run and are not submitted: "
            f"a task runs whole groups of cells (a model, bench and seed with its control), and this grid has {groups}",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
    console.print(
        f"submitted job {job}: {count(options.tasks - len(empty), 'task')}, stores and logs in {run.folder}\n"
        f"follow with: {shell_words('kvinject', 'sweep', folder, '--status')}; report with: {shell_words('kvinject', 'report', folder)}",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )


def _follow(folder: Path, resubmit: bool) -> None:
    """--status, and with --resubmit the unfinished tasks submitted again first."""
    from ..experiments.slurm import SlurmRun

    run = SlurmRun.open(folder)
    if resubmit:
        again, live = run.unfinished()
        if again:
            job = run.submit(again)
            console.print(f"resubmitted {count(len(again), 'task')} ({', '.join(map(str, again))}) as job {job}", highlight=False)
        else:
            console.print(
                "nothing to resubmit: "
                + (
                    f"{'task' if len(live) == 1 else 'tasks'} {', '.join(map(str, live))} {'is' if len(live) == 1 else 'are'} queued or running"
                    if live
                    else "every task is finished"
                ),
                highlight=False,
            )
    table = Table()
    for col, justify in (("task", "right"), ("job", "right"), ("state", "left"), ("cells done", "right"), ("runs left", "right")):
        table.add_column(col, justify=justify)
    tasks = run.status()
    for t in tasks:
        table.add_row(str(t.task), t.job or "", t.state, f"{t.cells_done}/{t.cells}", str(t.runs_left))
    console.print(table)
    left = [t.task for t in tasks if not t.finished]
    if left:
        console.print(f"{count(len(left), 'task')} unfinished; logs in {run.folder / 'logs'}", markup=False, highlight=False, soft_wrap=True)
    else:
        console.print(f"every task is finished; report with: {shell_words('kvinject', 'report', folder)}", markup=False, highlight=False, soft_wrap=True)
