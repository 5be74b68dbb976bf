"""`kvinject tune`: the cheapest cache a model tolerates, as a composite spec, found and proven."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table
from rich.text import Text

from ..exceptions import KvinjectError
from ..files import write_text
from .flags import SeedOpt, Setup, bench_flags, check_format, setup_flags
from .outputs import check_writable
from .render import console, fmt, interrupted, run_sweep

DEFAULT_CHOICES = ["quant:2", "quant:3", "quant:4", "quant:8"]


@bench_flags
@setup_flags(parallel=True)
def tune(
    choice: Annotated[
        Optional[list[str]],
        typer.Option("--choice", "-c", help="What each layer's K and each layer's V may take, one spec a flag (default quant:2, 3, 4 and 8; none: exact)."),
    ] = None,
    bits: Annotated[
        Optional[float], typer.Option("--bits", help="The budget: at most this many bits per K/V element on average, scales included (quant:3 stores 3.5).")
    ] = None,
    max_metric: Annotated[
        Optional[float], typer.Option("--max-metric", help="The budget: the fewest bits that keep the metric within this (--max-metric 0.01 with kld).")
    ] = None,
    bench: Annotated[str, typer.Option("--bench", "-b", help="The benchmark measured (see `kvinject benchmarks`).")] = "perplexity",
    metric: Annotated[
        Optional[str], typer.Option("--metric", help="The metric: default kld (KL divergence from the control) for perplexity, else the bench's headline.")
    ] = None,
    runs: Annotated[int, typer.Option("--runs", "-r", help="Runs per configuration (an error without randomness runs once).")] = 1,
    seed: SeedOpt = 0,
    data: Annotated[Optional[str], typer.Option("--data", help="The text tuned on: PATH or hf:NAME[:CONFIG][@SPLIT] (default: the bench's).")] = None,
    holdout_data: Annotated[
        Optional[str], typer.Option("--holdout-data", help="The text the result is proven on (default for perplexity: the --chunks after those tuned on).")
    ] = None,
    holdout_chunks: Annotated[
        Optional[int],
        typer.Option("--holdout-chunks", help="perplexity's chunks the result is proven on (default: as many as tuned on); more items, sharper test.", min=2),
    ] = None,
    candidates: Annotated[
        int, typer.Option("--candidates", help="Allocations of the search run whole, spread over the bits, besides those at the budget.", min=1)
    ] = 8,
    store: Annotated[Optional[Path], typer.Option("--store", help="Results store (default: tune-MODEL-BENCH.results.sqlite here).")] = None,
    csv: Annotated[Optional[Path], typer.Option("--csv", help="Write the front (bits, metric, spec) as CSV.")] = None,
    plot: Annotated[
        Optional[Path], typer.Option("--plot", help="Draw the metric against bits per element, the front and the uniform choices, to this PNG.")
    ] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Say what the search runs first and about how long; run nothing.")] = False,
    output_format: Annotated[str, typer.Option("--format", help="table or markdown (the front and the held-out comparison).")] = "table",
    *,
    setup: Setup,
    bench_values: dict | None = None,
) -> None:
    """Find the cheapest KV cache the model tolerates: a choice per layer's K and V (bits of a
    quantizer) allocated by a knapsack over a sensitivity profile, the candidates run whole, the
    one for the budget proven against the uniform choice at equal bits on held-out text (a paired
    test), printed as a composite spec. Resumable: Ctrl-C any time, the same command goes on.

    Example: kvinject tune --bits 3.5 --ctx 128 --chunks 4 --holdout-chunks 12 --plot front.png
    """
    from ..engine.llama_log import set_verbose
    from ..experiments.tune import plan_tuning

    set_verbose(setup.verbose)
    check_format(output_format, ("table", "markdown"))
    if (bits is None) == (max_metric is None):
        raise KvinjectError("give one budget: --bits B (the best metric within B bits per element) or --max-metric X (the fewest bits within X)")
    check_writable({"--csv": csv}, figures={"--plot": plot}, stores={"--store": store}, inputs=[data, holdout_data], stdout=["--csv"])
    tuning = plan_tuning(
        setup.model,
        setup.cache,
        setup.backend,
        choice or DEFAULT_CHOICES,
        bench,
        bench_values or {},
        bits=bits,
        max_metric=max_metric,
        data=data,
        holdout_data=holdout_data,
        holdout_chunks=holdout_chunks,
        metric=metric,
        runs=runs,
        seed=seed,
        store=store,
        candidates=candidates,
    )
    if dry_run:
        _dry_run(tuning)
        return
    try:
        result = tuning.run(_runner(tuning.store), _reader(tuning.store))
    except KeyboardInterrupt as stop:
        raise interrupted(stop, tuning.store, "the same command") from None
    _show(tuning, result, output_format, csv, plot)


def _show(tuning, result, output_format: str, csv: Path | None, plot: Path | None) -> None:
    from ..analysis.tuning import front_plot, front_table, markdown, proof

    verdict = proof(tuning, result)
    if output_format == "markdown":
        print(f"{markdown(front_table(tuning, result))}\n\n{markdown(verdict.table())}\n\nchosen: `{result.chosen.spec}`")
    else:
        _render(tuning, result, verdict)
    if csv:
        write_text(csv, result.front_csv())
    if plot:
        front_plot(tuning, result, plot)
        console.print(f"[dim]figure written to {plot}")
    if output_format == "table":
        console.print(f"[dim]results in {tuning.store}")


def _runner(path: Path):
    def execute(grid) -> None:
        from ..experiments.store import Store
        from ..experiments.sweep import Sweep

        with Store(path) as s:
            run_sweep(Sweep(grid, s))

    return execute


def _reader(path: Path):
    def read() -> list[dict]:
        from ..analysis.report import load_records

        return load_records([path])

    return read


def _dry_run(tuning) -> None:
    from ..experiments.store import Store
    from ..experiments.sweep import Sweep

    grid = tuning.profile()
    opened = Store(tuning.store, readonly=True) if tuning.store.exists() else Store(Path(":memory:"))
    with opened as s:
        sw = Sweep(grid, s)
        left = [p for p in sw.plan() if p.runs]
        runs_left = sum(len(p.runs) for p in left)
        minutes = sw.estimate_seconds(left) / 60
    print(f"profile: {len(grid.cells)} cells (each choice in one layer's K or V at a time, and the control), {runs_left} runs left")
    if runs_left:
        print(f"estimate: about {max(minutes, 1):.0f} min on 2 CPU cores, timed on the default model (docs/performance.md)")
    print(f"then up to {len(tuning.uniform()) + tuning.candidates + 4} configurations whole on the tuning text, and 3 on the held-out text")
    print(f"store: {tuning.store}")


def _render(tuning, result, verdict) -> None:
    from ..analysis.tuning import front_table

    table = front_table(tuning, result)
    t = Table(title=f"{tuning.bench.name}: {tuning.metric} against bits per element, the front on the tuning text", title_justify="left")
    for col in table.columns:
        t.add_column(col, justify="right" if col in ("bits", tuning.metric) else "left", overflow="fold")
    for row in table.itertuples(index=False):
        t.add_row(fmt(row[0], ".3g"), fmt(row[1], ".4g"), row[2], Text(row[3]))
    console.print(t)
    console.print(verdict.text(), soft_wrap=True, highlight=False)
    console.print(Text.assemble("chosen: ", (result.chosen.spec, "bold")), soft_wrap=True)
