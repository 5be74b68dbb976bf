"""`kvinject profile`: a sensitivity map, the error in one layer (or KV head) at a time."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from ..error_models.configuration import Configuration
from ..exceptions import KvinjectError
from ..files import write_text
from ..values import check_runs
from .flags import SeedOpt, Setup, bench_flags, setup_flags
from .outputs import check_writable
from .render import console, fmt, interrupted, run_sweep


@bench_flags
@setup_flags(parallel=True)
def profile(
    error: Annotated[str, typer.Option("--error", "-e", help="The error spec put into one layer's K or V at a time, e.g. normal:0,0.5.")],
    bench: Annotated[str, typer.Option("--bench", "-b", help="The benchmark measured (see `kvinject benchmarks`).")] = "perplexity",
    metric: Annotated[
        Optional[str],
        typer.Option("--metric", help="The metric mapped: default kld (KL divergence from the control) for perplexity, else the bench's headline."),
    ] = None,
    runs: Annotated[int, typer.Option("--runs", "-r", help="Runs per layer and component (an error without randomness runs once).")] = 1,
    seed: SeedOpt = 0,
    data: Annotated[Optional[str], typer.Option("--data", help="The bench's data: PATH or hf:NAME[:CONFIG][@SPLIT].")] = None,
    store: Annotated[Optional[Path], typer.Option("--store", help="Results store (default: profile-MODEL-BENCH-ERROR.results.sqlite here).")] = None,
    by_head: Annotated[bool, typer.Option("--by-head", help="Each KV head of each layer's K and V alone (layers x heads x 2 runs).")] = False,
    heatmap: Annotated[Optional[Path], typer.Option("--heatmap", help="Draw the map (layers x K, V, or their heads) to this PNG (needs matplotlib).")] = None,
    csv: Annotated[Optional[Path], typer.Option("--csv", help="Write the map as CSV (a row per layer).")] = None,
    *,
    setup: Setup,
    bench_values: dict | None = None,
) -> None:
    """Map where a model is sensitive: ERROR in one layer's K or V at a time, every layer (with
    --by-head, one KV head of it at a time), on one metric (a resumable sweep: Ctrl-C any time,
    the same command goes on).

    Example: kvinject profile --error normal:0,0.5 --ctx 512 --chunks 8 --heatmap layers.png
    """
    from ..analysis.plots import sensitivity_map
    from ..analysis.report import load_records
    from ..benchmarks import make_benches
    from ..engine.llama_log import set_verbose
    from ..experiments.profile import profile_grid, profile_metric, sensitivity
    from ..experiments.store import Store
    from ..experiments.sweep import Sweep

    set_verbose(setup.verbose)
    check_runs("--runs", runs)
    config = Configuration.parse(error, cache=setup.cache)
    err, cache = config.error, config.cache  # ERROR@K/V: the profile's cache types
    if not err.injects:
        raise KvinjectError(f"--error {error} puts no error anywhere: give an error model (see `kvinject errors`)")
    (b,) = make_benches([bench], bench_values or {}, [data] if data else [])
    metric = profile_metric(bench, metric)
    check_writable({"--csv": csv}, figures={"--heatmap": heatmap}, stores={"--store": store}, inputs=[data], stdout=["--csv"])
    given = {k for k, v in (bench_values or {}).items() if v not in (None, [], ())} | ({"data"} if data else set())
    grid = profile_grid(setup.model, b, given, [err], cache, setup.backend, runs, seed, store, by_head)
    with Store(grid.path) as s:
        try:
            run_sweep(Sweep(grid, s))
        except KeyboardInterrupt as stop:
            raise interrupted(stop, grid.path, "the same command") from None
    table = sensitivity(load_records([grid.path]), err, metric, by_head)
    name = Path(grid.cells[0].model).name
    where = "one KV head of one layer's K or V" if by_head else "one layer's K or V"
    t = Table(title=f"{bench}: {metric} with {err.spec} in {where} ({name})", title_justify="left")
    for col in ("layer", *(c.upper() for c in table.columns)):
        t.add_column(col, justify="right")
    for layer, row in table.iterrows():
        t.add_row(str(layer), *(fmt(row[c], ".4g") for c in table.columns))
    console.print(t)
    if csv:
        write_text(csv, table.to_csv())
    if heatmap:
        sensitivity_map(table, metric, f"{name} {bench}: {metric} with {err.spec} in {where}", heatmap)
        Console(stderr=True).print(f"heatmap written to {heatmap}")
    console.print(f"[dim]results in {grid.path}")
