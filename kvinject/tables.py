"""Result tables for the terminal."""

from __future__ import annotations

import math

from rich.table import Table
from rich.text import Text


def fmt(value: object, spec: str = ".3g") -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return format(value, spec)


def span(low: object, high: object, spec: str = ".3g") -> str:
    """An interval, or "-" where it is undefined (a single run has no interval across runs)."""
    if fmt(low) == "-" or fmt(high) == "-":
        return "-"
    return f"{fmt(low, spec)}–{fmt(high, spec)}"


def bench_table(bench: str, primary: str, secondary: tuple[str, ...], aggregates: list[dict[str, object]], wide: bool = False) -> Table:
    """One row per configuration: the primary metric with its spread, CIs, percent of control with
    its paired interval and the paired test; with ``wide``, the secondary metrics' means too.
    Numbers to 3 significant digits, as report's terminal tables, so the narrow table fits a
    100-column terminal unfolded; its caption names what --wide adds."""
    rows = [a for a in aggregates if a["bench"] == bench]
    by_label: dict[str, dict[str, dict[str, object]]] = {}
    for a in rows:
        by_label.setdefault(a["label"], {})[a["metric"]] = a
    present = [m for m in (*secondary, "bits") if any(m in metrics for metrics in by_label.values())]
    shown = present if wide else []
    nonfinite = any(metrics[primary]["nonfinite_items"] for metrics in by_label.values() if primary in metrics)
    caption = f"--wide adds {', '.join(present)}" if present and not wide else None
    title = f"{bench}: {primary} (95% CIs; p: paired test on items, docs/statistics.md)"
    table = Table(title=title, title_justify="left", caption=caption, caption_justify="left")
    table.add_column("configuration", overflow="fold")
    columns = ["runs", "mean ± sd", "CI runs", "CI items", "% ctl", "% ctl CI", "p", *shown] + (["NaN items"] if nonfinite or wide else [])
    for col in columns:
        table.add_column(col, justify="right", overflow="fold")  # wrap, never cut a number short
    for label, metrics in by_label.items():
        a = metrics.get(primary)
        if a is None:
            continue
        test = a["test"]
        boot = a["items_ci"] or (None, None)
        percent = a["percent_ci"] or (None, None)
        cells = [
            Text(label),  # not markup: a label's [k:0-3] is text
            str(a["n"]),
            # A single run's std is 0 by construction, not a measured spread.
            f"{fmt(a['mean'])} ± {fmt(a['std'], '.2g')}" if a["n"] > 1 else fmt(a["mean"]),
            span(a["ci_low"], a["ci_high"]),
            span(*boot),
            fmt(a["percent_of_control"], ".1f"),
            span(*percent, ".1f"),
            "control" if label == next(iter(by_label)) else fmt(test["p_value"], ".3g") if test else "-",
            *(fmt(metrics[m]["mean"]) if m in metrics else "-" for m in shown),
        ]
        table.add_row(*cells, *([str(a["nonfinite_items"])] if nonfinite or wide else []))
    return table
