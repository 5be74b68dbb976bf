"""`kvinject replay`: one recorded fault decoded again, alone, to check its outcome."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, List, Optional

import typer
from rich.table import Table

from ..exceptions import KvinjectError
from ..jsonutil import dumps
from ..values import unique
from .flags import FormatOpt
from .render import console


def replay(
    stores: Annotated[List[Path], typer.Argument(help="Results stores (or folders of them) that hold the run and its control.")],
    item: Annotated[int, typer.Option("--item", help="The item (from 0) whose faults to decode again.", min=0)],
    run: Annotated[Optional[int], typer.Option("--run", help="Its run (default: the only one the filters leave).", min=0)] = None,
    fault: Annotated[
        Optional[int], typer.Option("--fault", help="Only this one (from 0) of the item's faults, as faults:K,only=J; default: all it recorded.", min=0)
    ] = None,
    filters: Annotated[Optional[List[str]], typer.Option("--filter", help="KEY=VALUE picking the configuration, as report's (error=faults:1,bit=14).")] = None,
    model: Annotated[Optional[str], typer.Option("--model", help="The model file, if not where the record says.")] = None,
    output_format: FormatOpt = "table",
) -> None:
    """Decode one item of a fault campaign's run again, by itself, with the faults it recorded
    (or one of them), and compare where they land, the tokens and the outcome (masked, benign,
    SDC, DUE) with the record. The same build and CPU give the same; exits 1 where they differ."""
    from ..analysis.report import control_of, load_records, select
    from ..experiments.replay import replay as replay_item

    stores, filters = unique("replay's stores", stores, key=lambda p: p.resolve()), unique("--filter", filters or [])
    records = [r for r in select(load_records(stores), filters) if not r["settings"].get("control") and r.get("faults")]
    if run is not None:
        records = [r for r in records if r["run"] == run]
    labels = sorted({f"{r['label']} run {r['run']}" for r in records})
    if len(labels) != 1:
        shown = ", ".join(labels[:6]) + (", ..." if len(labels) > 6 else "")
        raise KvinjectError(
            f"{len(labels)} runs that recorded faults match{': ' + shown if labels else ''}; pick one with --filter error=... and --run"
            if labels
            else "no run that recorded faults matches: faults are recorded by faults:K runs (kvinject report --faults lists them)"
        )
    record = records[0]
    result = replay_item(record, control_of(load_records(stores), record), item, fault, model)
    if output_format == "json":
        print(dumps(result.__dict__ | {"same": result.same}))
    else:
        table = Table(title=f"{result.label}, run {result.run}, item {result.item}: replayed {'as recorded' if result.same else 'DIFFERENTLY'}")
        for column in ("", "recorded", "replayed"):
            table.add_column(column)
        faults = ["\n".join(", ".join(f"{k}={v}" for k, v in site.items()) for site in sites) for sites in (result.recorded_faults, result.faults)]
        table.add_row("faults", *faults)
        table.add_row("tokens", str(len(result.recorded_tokens)), "the same" if result.tokens == result.recorded_tokens else f"{len(result.tokens)}, other")
        table.add_row("outcome", result.recorded_outcome or "(of all its faults)", result.outcome)
        console.print(table)
    if not result.same:
        raise typer.Exit(1)
