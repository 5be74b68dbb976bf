"""`kvinject report`: merged results stores as tables and plots."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from ..exceptions import KvinjectError
from ..values import split_list, unique
from .flags import WideOpt, check_format, check_wide
from .outputs import check_writable
from .render import console, print_table

StoresArg = Annotated[
    list[Path],
    typer.Argument(
        help="Results stores written by kvinject sweep (shards are merged), run folders of sweep --slurm, or the JSON files of kvinject run --output."
    ),
]
FormatArg = Annotated[str, typer.Option("--format", help="table, markdown, csv, json or latex.")]
FilterOpt = Annotated[
    Optional[list[str]], typer.Option("--filter", help="Keep records whose setting KEY equals VALUE, e.g. bench=ifeval, target=k, cache_v=q8_0.")
]
AllMetricsOpt = Annotated[bool, typer.Option("--all-metrics", help="Every metric, not only each bench's primary one.")]
MetricOpt = Annotated[
    Optional[str],
    typer.Option(
        "--metric",
        help="Tabulate and draw this metric instead of each bench's primary one, e.g. token_match (eviction's agreement "
        "with the full cache); see `kvinject benchmarks`. Benches without it are left out.",
    ),
]
PlotOpt = Annotated[Optional[Path], typer.Option("--plot", help="Draw degradation curves to this PNG (needs matplotlib).")]
HeatmapOpt = Annotated[
    Optional[Path],
    typer.Option("--heatmap", help="Draw score over length x depth (passkey, niah, vt) to this PNG, a panel per configuration (needs matplotlib)."),
]
FrontierOpt = Annotated[
    Optional[Path],
    typer.Option("--frontier", help="Draw each bench's score against bits per K/V element to this PNG, with the Pareto front (needs matplotlib)."),
]
FaultsOpt = Annotated[
    Optional[str],
    typer.Option(
        "--faults",
        help="Map a fault campaign (faults:1) instead: the shares of single-fault injections masked, benign, SDC and DUE (with its "
        "causes), with 95% Wilson intervals, by bit, field, format, layer, kv, head, element, position or stage (several comma-separated, e.g. bit or "
        "field,bit; docs/faults.md); --plot draws its SDC and DUE rates.",
    ),
]
FitOpt = Annotated[
    Optional[float],
    typer.Option(
        "--fit-per-mbit",
        help="With --faults and --ctx: a raw fault rate in FIT per Mbit (2^20 bits); each row gets the expected SDC and DUE FIT of its part "
        "of the model's KV cache at --ctx tokens, with intervals (docs/faults.md).",
    ),
]
FitCtxOpt = Annotated[Optional[int], typer.Option("--ctx", help="The context length whose KV cache --fit-per-mbit falls on, in tokens.")]
OutcomesOpt = Annotated[
    Optional[Path],
    typer.Option("--outcomes", help="Draw the shares of items masked, benign, SDC and DUE per configuration to this PNG (fault campaigns; needs matplotlib)."),
]
HtmlOpt = Annotated[
    Optional[Path],
    typer.Option(
        "--html",
        help="Write the study as one web page to this file: manifest, the tables (sortable, filterable), the figures (interactive) and "
        "generation benches' items; it holds its scripts and data and opens offline (needs altair and vl-convert-python).",
    ),
]
BoardOpt = Annotated[
    bool,
    typer.Option(
        "--board",
        help="A board per model, as kvpress's leaderboard: eviction methods down, compression ratios across, each cell the score over every "
        "bench's items with its interval, marked where it differs from the control; quantizers at the same bits per element "
        "(examples/ruler-board.toml, docs/results-board.md).",
    ),
]


def report(
    stores: StoresArg,
    output_format: FormatArg = "table",
    filters: FilterOpt = None,
    all_metrics: AllMetricsOpt = False,
    metric: MetricOpt = None,
    wide: WideOpt = False,
    plot: PlotOpt = None,
    heatmap: HeatmapOpt = None,
    frontier: FrontierOpt = None,
    faults: FaultsOpt = None,
    fit_per_mbit: FitOpt = None,
    ctx: FitCtxOpt = None,
    outcomes: OutcomesOpt = None,
    page: HtmlOpt = None,
    board: BoardOpt = False,
) -> None:
    """Merge results stores (and run --output files) and print the study-style table: score, CIs,
    percent of control and the paired test, per bench and configuration."""
    from ..analysis.fit import check_fit
    from ..analysis.report import FORMATS, load_records, select

    check_format(output_format, FORMATS)
    check_wide(wide, output_format)
    if metric and all_metrics:
        raise KvinjectError("--metric picks one metric and --all-metrics shows every one: give one of them")
    stores = unique("report's stores", stores, key=lambda p: p.resolve())
    filters, by = unique("--filter", filters or []), unique("--faults", split_list("--faults", faults)) if faults else []
    figures = {"--plot": plot, "--heatmap": heatmap, "--frontier": frontier, "--outcomes": outcomes, "--html": page}
    check_writable({"--html": page}, figures={k: v for k, v in figures.items() if k != "--html"}, inputs=stores)
    check_fit(fit_per_mbit, ctx, faults)
    if page:
        from ..analysis.html_page import check_html

        check_html()
    records = select(load_records(stores), filters)
    if board:
        others = [flag for flag, given in (("--faults", faults), ("--metric", metric), ("--all-metrics", all_metrics), ("--plot", plot)) if given]
        others += [flag for flag, given in (("--heatmap", heatmap), ("--frontier", frontier), ("--outcomes", outcomes), ("--wide", wide)) if given]
        others += ["--html"] if page else []
        if others:
            raise KvinjectError(f"--board prints a board of its own: give {', '.join(others)} in another report")
        _board(records, output_format)
        return
    if faults:
        given = (("--metric", metric), ("--all-metrics", all_metrics), ("--wide", wide), ("--heatmap", heatmap), ("--frontier", frontier))
        if others := [flag for flag, value in (*given, ("--outcomes", outcomes), ("--html", page)) if value]:
            raise KvinjectError(f"--faults prints a map of its own (--plot draws it): give {', '.join(others)} in another report")
        _fault_map(records, by, output_format, plot, (fit_per_mbit, ctx) if fit_per_mbit is not None else None)
        return
    _study(records, stores, output_format, metric, all_metrics, wide, figures)


def _study(records: list, stores: list[Path], output_format: str, metric: str | None, all_metrics: bool, wide: bool, figures: dict) -> None:
    """The study table, its figures drawn first: one these records cannot give fails before the tables print."""
    from ..analysis.report import check_metric, flags_nothing, render, store_paths, study_table, summarize, terminal_tables
    from ..analysis.tables import NOTHING_NOTE, report_table

    df = summarize(records)
    if df.empty:
        raise KvinjectError("no control to compare these records with: a shard's store may lack it; give report the store that holds it too")
    if metric:
        check_metric(df, metric)
    _draw(records, df, stores, metric, figures)
    table = df if all_metrics else study_table(df, metric, digits=3 if output_format == "table" else 4)
    if output_format != "table":
        print(render(table, output_format))
        return
    parts = [(f"{len(records)} runs from {len(store_paths(stores))} store(s)", table)] if all_metrics or wide else terminal_tables(table)
    for title, part in parts:
        console.print(title, style="italic", highlight=False)  # not a table title: that wraps at the table's width
        print_table(report_table(part))
    if flags_nothing(table):
        console.print(NOTHING_NOTE, style="yellow", highlight=False)
    if not (all_metrics or wide):
        console.print("--wide: every column in one table (ci_runs: the 95% interval across runs)", style="dim", highlight=False)


def _draw(records: list, df, stores: list[Path], metric: str | None, figures: dict) -> None:
    """--plot, --heatmap, --frontier, --outcomes and --html, each where given."""
    from ..analysis.plots import frontier as draw_frontier
    from ..analysis.plots import heatmap as draw_heatmap
    from ..analysis.plots import outcomes as draw_outcomes
    from ..analysis.plots import plot as draw

    plot, heatmap, frontier, outcomes, page = (figures[flag] for flag in ("--plot", "--heatmap", "--frontier", "--outcomes", "--html"))
    if plot:
        draw(df, plot, metric)
        Console(stderr=True).print(f"plot written to {plot}")
    if heatmap:
        draw_heatmap(records, heatmap)
        Console(stderr=True).print(f"heatmap written to {heatmap}")
    if frontier:
        draw_frontier(df, frontier, metric)
        Console(stderr=True).print(f"frontier written to {frontier}")
    if outcomes:
        draw_outcomes(df, outcomes)
        Console(stderr=True).print(f"outcomes written to {outcomes}")
    if page:
        from ..analysis.html_page import write_page

        size = write_page(page, records, df, stores, metric)
        Console(stderr=True).print(f"page written to {page} ({size / 1e6:.2f} MB)")


def _fault_map(records: list, by: list[str], output_format: str, plot: Path | None, fit: tuple[float, int] | None) -> None:
    """--faults: the map, a table per model and bench on a terminal; with --plot, its figure;
    with ``fit`` (--fit-per-mbit, --ctx), each row's expected SDC and DUE FIT."""
    from ..analysis.faults import fault_map, machine, readable
    from ..analysis.fit import model_shapes, with_fit
    from ..analysis.plots import fault_map as draw_fault_map
    from ..analysis.report import render
    from ..analysis.tables import report_table
    from ..experiments.campaign import campaign_size

    table = fault_map(records, by)
    if fit is not None:
        table = with_fit(table, *fit, model_shapes(sorted({str(m) for m in table["model"]})))
    if plot:
        draw_fault_map(table, [b for b in by if b != "format"], plot)
        Console(stderr=True).print(f"fault map written to {plot}")
    if output_format != "table":
        print(render(machine(table) if output_format in ("csv", "json") else readable(table, 4), output_format))
        return
    for (model, bench), part in readable(table, 3).groupby(["model", "bench"], sort=False):
        console.print(f"{bench}: single faults, model {Path(str(model)).name}", style="italic", highlight=False)
        print_table(report_table(part.drop(columns=["model", "bench"])))
    console.print(
        f"sdc_ci, due_ci: 95% Wilson intervals; a rate within ±3% at 95% takes {campaign_size(0.03)} faults a row, ±5% {campaign_size(0.05)} "
        "(Leveugle et al., DATE 2009)",
        style="dim",
        highlight=False,
        soft_wrap=True,
    )
    if fit is not None:
        console.print(
            f"mbit: each row's share of the KV cache at {fit[1]} tokens; sdc_fit, due_fit: expected FIT at {fit[0]:g} FIT per Mbit raw (docs/faults.md)",
            style="dim",
            highlight=False,
            soft_wrap=True,
        )


def _board(records: list, output_format: str) -> None:
    """--board: a table per model on a terminal or in markdown; every cell's numbers otherwise."""
    from ..analysis.board import board, layout
    from ..analysis.report import render
    from ..analysis.tables import report_table

    table = board(records)
    if output_format in ("csv", "json", "latex"):
        print(render(table, output_format))
        return
    for title, part in layout(table):
        if output_format == "markdown":
            print(f"{title}\n\n{render(part, output_format)}\n")
            continue
        console.print(title, style="italic", highlight=False)
        print_table(report_table(part))
    if output_format == "table":
        console.print("(low–high): 95% interval over items; ↓ ↑: below or above the control, paired test p < 0.05", style="dim", highlight=False)
