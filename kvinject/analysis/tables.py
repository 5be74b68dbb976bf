"""Result tables for the terminal."""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING

from rich.cells import cell_len
from rich.console import Console
from rich.table import Table
from rich.text import Text

if TYPE_CHECKING:
    import pandas as pd

# What a number cell of these tables holds: a value, "mean ± sd", an interval, "-" for nothing
# measured, "control" in the p column.
_NUMBER = re.compile(r"-|control|[-+\d.e]+( ± [-+\d.e]+)?|[-+\d.e]+–[-+\d.e]+")
FOLDED = 12  # the narrowest a name column folds to before the table is printed wider instead
# Marks a configuration that changed no value of the cache in any run (aggregate.changed_nothing).
NOTHING_MARK = " †"
NOTHING_NOTE = (
    "† changed no value that reached the cache in any run: it measured nothing here (a compressor that acts between "
    "decodes, on prompts decoded at once: give the bench --step; a --positions or --heads selection past every prompt)"
)


def fmt(value: object, spec: str = ".3g") -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return format(value, spec)


def span(low: object, high: object, spec: str = ".3g") -> str:
    """An interval, or "-" where it is undefined (a single run has no interval across runs)."""
    if fmt(low) == "-" or fmt(high) == "-":
        return "-"
    return f"{fmt(low, spec)}–{fmt(high, spec)}"


def bench_table(
    bench: str, primary: str, secondary: tuple[str, ...], aggregates: list[dict[str, object]], wide: bool = False, width: int | None = None
) -> Table:
    """One row per configuration: the primary metric with its spread, CIs, percent of control with
    its paired interval and the paired test; with ``wide``, the secondary metrics' means too.
    Numbers to 3 significant digits, as report's terminal tables. Where the narrow table is wider
    than ``width`` (the terminal's), the interval across runs goes (the std gives the runs'
    spread) and then the configurations fold: a number split in two misreads. Its caption
    names what --wide adds."""
    rows = [a for a in aggregates if a["bench"] == bench]
    by_label: dict[str, dict[str, dict[str, object]]] = {}
    for a in rows:
        by_label.setdefault(a["label"], {})[a["metric"]] = a
    present = [m for m in (*secondary, "bits") if any(m in metrics for metrics in by_label.values())]
    nonfinite = any(metrics[primary]["nonfinite_items"] for metrics in by_label.values() if primary in metrics)
    if wide:
        return _table(bench, primary, by_label, present, True, [], None)
    table = _table(bench, primary, by_label, [], nonfinite, [], present)
    if width and Console(width=10_000).measure(table).maximum > width:  # its natural width
        table = _table(bench, primary, by_label, [], nonfinite, ["CI runs"], ["CI runs", *present])
    return table


def _table(
    bench: str, primary: str, by_label: dict[str, dict[str, dict[str, object]]], shown: list[str], nan: bool, left: list[str], added: list[str] | None
) -> Table:
    """The table with the secondary metrics `shown`, the NaN column if `nan`, without the columns
    `left`, and a caption naming what --wide `added`."""
    caption = f"--wide adds {', '.join(added)}" if added else None
    title = f"{bench}: {primary} (95% CIs; p: paired test on items, docs/statistics.md)"
    table = Table(title=title, title_justify="left", caption=caption, caption_justify="left", pad_edge=False)
    table.add_column("configuration", overflow="fold")
    columns = [c for c in ("runs", "mean ± sd", "CI runs", "CI items", "% ctl", "% ctl CI", "p") if c not in left] + shown + (["NaN"] if nan else [])
    for col in columns:
        table.add_column(col, justify="right", overflow="fold")
    for metrics in by_label.values():
        a = metrics.get(primary)
        if a is None:
            continue
        test = a["test"]
        boot = a["items_ci"] or (None, None)
        percent = a["percent_ci"] or (None, None)
        cells = {
            "runs": str(a["n"]),
            # A single run's std is 0 by construction, not a measured spread.
            "mean ± sd": f"{fmt(a['mean'])} ± {fmt(a['std'], '.2g')}" if a["n"] > 1 else fmt(a["mean"]),
            "CI runs": span(a["ci_low"], a["ci_high"]),
            "CI items": span(*boot),
            "% ctl": fmt(a["percent_of_control"], ".1f"),
            "% ctl CI": span(*percent, ".1f"),
            "p": "control" if a["control"] else fmt(test["p_value"], ".3g") if test else "-",
            "NaN": str(a["nonfinite_items"]),
            **{m: fmt(metrics[m]["mean"]) if m in metrics else "-" for m in shown},
        }
        name = f"{a['configuration']}{NOTHING_MARK if a.get('changed_nothing') else ''}"
        table.add_row(Text(name), *(cells[c] for c in columns))  # text, not markup: [k:0-3]
    return _numbers_whole(table)


def _numbers_whole(table: Table) -> Table:
    """Columns of numbers never fold (a number split in two misreads): where the table is too
    wide, the names fold."""
    for column in table.columns:
        column.no_wrap = all(_NUMBER.fullmatch(_plain(cell)) for cell in column.cells)
    return table


def _plain(cell: object) -> str:
    return cell.plain if isinstance(cell, Text) else str(cell)


def print_width(table: Table, terminal: int) -> int:
    """The width to print ``table`` at: the terminal's, unless even with its names folded to
    :data:`FOLDED` characters its numbers would not fit whole; then the narrowest width that
    keeps them whole (a terminal soft-wraps the lines; a file or ``less -S`` shows them as they are)."""
    needed = len(table.columns) + 1 - 2  # the box's vertical lines, no padding at the edges (pad_edge)
    for column in table.columns:
        widths = [cell_len(_plain(cell)) for cell in (column.header, *column.cells)]
        needed += 2 + (max(widths) if column.no_wrap else min(max(widths), FOLDED))
    return max(terminal, needed)


def report_table(part: pd.DataFrame) -> Table:
    """A part of report's table (terminal_tables) for the terminal: p and q to 2 significant
    digits (0.0317 says no more than 0.032), other numbers to 3. Names, configurations and
    option values fold where the table is too wide, numbers never (:func:`print_width`)."""
    shown = part.drop(columns=[c for c in ("test", "items_ci", "items_ci_method", "diff_ci", "percent_ci", "label", "control") if c in part.columns])
    table = Table(pad_edge=False)
    for col in shown.columns:
        names = col in ("model", "bench", "metric", "configuration")
        table.add_column(str(col), justify="left" if names else "right", overflow="fold")
    specs = [".2g" if col in ("p", "q") else ".3g" for col in shown.columns]
    for row in shown.itertuples(index=False):
        table.add_row(*(Text(fmt(v, spec) if v is None or isinstance(v, float) else str(v)) for v, spec in zip(row, specs)))
    return _numbers_whole(table)
