"""`kvinject sweep`: every cell of a grid into a results store, resumable."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table
from rich.text import Text

from .flags import ParallelOpt, VerboseOpt
from .render import console, count, interrupted, run_sweep


def sweep(
    grid: Annotated[Path, typer.Argument(help="Grid file (TOML, see docs/grid-format.md).")],
    store: Annotated[
        Optional[Path], typer.Option("--store", help="Results store (SQLite). Default: GRID.results.sqlite, or GRID.shardIofN.results.sqlite.")
    ] = None,
    shard: Annotated[
        Optional[str], typer.Option("--shard", help="Run a deterministic 1/n of the cells: i/n, e.g. $SLURM_ARRAY_TASK_ID/$SLURM_ARRAY_TASK_COUNT.")
    ] = None,
    dry_run: Annotated[
        bool,
        typer.Option("--dry-run", help="List the expanded cells, what is left to run, which other workers compute what, and a time estimate; run nothing."),
    ] = False,
    max_cells: Annotated[int, typer.Option("--max-cells", min=1, help="Refuse a grid that expands to more cells (a guard against a mistyped range).")] = 5000,
    parallel: ParallelOpt = None,
    verbose: VerboseOpt = False,
) -> None:
    """Run every cell of a grid into a results store. Safe to interrupt: finished runs are kept,
    and running the same command again does only what is missing. Several workers (one per GPU,
    say) may run the same command on one store on one machine: they split the cell groups."""
    from ..engine.llama_log import set_verbose
    from ..experiments.grid import bench_labels, load_grid
    from ..experiments.store import Store
    from ..experiments.sweep import Sweep, default_store, parse_shard

    set_verbose(verbose)
    parsed_shard = parse_shard(shard) if shard is not None else None
    g = load_grid(grid, max_cells)
    if parallel is not None:
        g.parallel = parallel
    store_path = store or default_store(grid, parsed_shard)
    if dry_run:  # read what is done and claimed; create and change nothing
        opened = Store(store_path, readonly=True) if store_path.exists() else Store(Path(":memory:"))
    else:
        opened = Store(store_path)
    with opened as s:
        sw = Sweep(g, s, parsed_shard)
        planned = sw.plan()
        left = [p for p in planned if p.runs]
        if dry_run:
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
            if runs_left:
                print(f"estimate: about {max(minutes, 1):.0f} min on 2 CPU cores, timed on the default model (docs/performance.md)")
            print(f"store: {store or default_store(grid, parsed_shard)}")
            return
        resume = f"kvinject sweep {grid}" + (f" --shard {shard}" if shard else "") + (f" --store {store}" if store else "")
        try:
            written = run_sweep(sw)
        except KeyboardInterrupt as stop:
            raise interrupted(stop, store_path, resume) from None
    console.print(f"{written} runs written to {store_path}, nothing left to run; report with: kvinject report {store_path}", soft_wrap=True)
