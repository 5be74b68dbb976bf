"""`kvinject run`: benchmarks under the control and each configuration, with statistics."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from ..engine.target import Target
from ..error_models.configuration import configurations
from ..files import is_stdout, write_text
from ..interrupts import caught, exit_code, stopped
from ..jsonutil import dumps
from ..values import check_runs
from .flags import ErrorOpt, FormatOpt, HeadsOpt, LayersOpt, PositionsOpt, SeedOpt, Setup, TargetOpt, WideOpt, bench_flags, check_wide, setup_flags
from .outputs import check_writable
from .render import console, print_table, progress_bars


@bench_flags
@setup_flags(parallel=True)
def run_command(
    bench: Annotated[list[str], typer.Option("--bench", "-b", help="Benchmark, repeatable (see `kvinject benchmarks`).")],
    error: ErrorOpt = None,
    control: Annotated[str, typer.Option("--control", help="The control configuration, ERROR[@K[/V]], e.g. none@f32 for an f32 cache.")] = "none",
    target: TargetOpt = "kv",
    layers: LayersOpt = None,
    positions: PositionsOpt = None,
    heads: HeadsOpt = None,
    runs: Annotated[int, typer.Option("--runs", "-r", help="Runs per configuration (a configuration without randomness runs once).")] = 5,
    seed: SeedOpt = 0,
    data: Annotated[
        Optional[list[str]], typer.Option("--data", help="Data for a bench: PATH or hf:NAME[:CONFIG][@SPLIT], or BENCH=... with several benches.")
    ] = None,
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Write every record, aggregate and setting as JSON.")] = None,
    store: Annotated[
        Optional[Path],
        typer.Option(
            "--store",
            help="Keep each finished run in this results store (as `kvinject sweep` does; `kvinject report` reads it); "
            "the same command again evaluates only the runs it lacks.",
        ),
    ] = None,
    csv: Annotated[Optional[Path], typer.Option("--csv", help="Also write the aggregates as CSV.")] = None,
    output_format: FormatOpt = "table",
    wide: WideOpt = False,
    *,
    setup: Setup,
    bench_values: dict | None = None,
) -> None:
    """Score benchmarks under the control and each --error, over repeated runs, with statistics.

    Example: kvinject run --bench ifeval --bench nexttoken --error normal:0,0.25 --error none@q8_0 --runs 5
    """
    from ..analysis.run_output import RunOutput
    from ..benchmarks import make_benches
    from ..experiments.runner import metadata, records
    from ..experiments.store import Store, temporary_store

    check_runs("--runs", runs)
    check_wide(wide, output_format)
    cache = setup.cache
    tgt = Target.parse(target, layers, positions, heads)
    configs = configurations(control, error or [], tgt, cache)
    benches = make_benches(bench, bench_values or {}, data or [])
    outputs = {"--output": output, "--csv": csv}
    check_writable(outputs, stores={"--store": store}, inputs=[b.options.data for b in benches], stdout=outputs)
    with Store(store) if store else temporary_store() as kept, setup.load() as m:  # a bad store fails before the model loads
        report = RunOutput(metadata(m, benches, configs, runs, seed, {"cache": cache.to_dict()}), benches={b.name: b for b in benches})
        stop = _run_all(m, benches, configs, runs, seed, kept)
        report.interrupted = stop is not None
        report.records = records(kept, m, benches, configs, runs, seed)
    _show(report.to_dict(), benches, output, csv, output_format, wide)
    if report.interrupted:
        where = " and ".join(str(p) for p in (output, store) if p)
        kept_in = f" in {where}" if where else ""
        Console(stderr=True).print(f"[yellow]{stopped(stop)}: {len(report.records)} finished runs kept{kept_in}", soft_wrap=True)  # paths whole
        raise typer.Exit(exit_code(stop))


def _run_all(m, benches: list, configs: list, runs: int, seed: int, kept) -> KeyboardInterrupt | None:
    """Every run not in the store yet, with a progress bar per bench; the interrupt that stopped them, if one did."""
    from ..experiments.runner import run as run_benches

    with progress_bars() as progress:
        bars = {}

        def bar(b, total):
            bars[b.name] = progress.add_task(b.name, total=total)
            return lambda n: progress.advance(bars[b.name], n)

        def say(line):
            progress.console.print(line, markup=False, highlight=False, soft_wrap=True)

        try:
            for result in run_benches(m, benches, configs, runs, seed, bar, kept, say):
                if not progress.console.is_terminal:  # a log (a cluster job's): no bar redraws, a timed line per run
                    primary = next(b.primary for b in benches if b.name == result.bench)
                    score = result.metrics.get(primary, math.nan)
                    say(f"{time.strftime('%H:%M:%S')} {result.bench} {result.config.label} run {result.run}: {primary} {score:.4g}")
        except KeyboardInterrupt as e:
            caught(e)  # the finished runs are written after this, outside the bars
            return e
    return None


def _show(data: dict, benches: list, output: Path | None, csv: Path | None, output_format: str, wide: bool) -> None:
    """The records and aggregates to --output and --csv, and a table per bench (or JSON) on stdout."""
    if output:  # the records are in the store (--store) too; if the file fails, its text is kept
        write_text(output, dumps(data))
    if csv:
        import pandas as pd

        write_text(csv, pd.json_normalize(data["aggregates"]).to_csv(index=False))
    if output_format == "json":
        print(dumps(data))
    else:
        from ..analysis.tables import bench_table

        for b in benches:
            print_table(bench_table(b.name, b.primary, b.secondary, data["aggregates"], wide, console.width))
        if output and not is_stdout(output):
            console.print(f"[dim]results written to {output}")
    if any(a["changed_nothing"] for a in data["aggregates"]):  # on stderr: --format json's stdout stays JSON
        from ..analysis.tables import NOTHING_NOTE

        Console(stderr=True).print(NOTHING_NOTE, style="yellow", highlight=False)
