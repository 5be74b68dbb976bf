"""Result tables for the terminal."""

from __future__ import annotations

import math

from rich.table import Table


def fmt(value: object, spec: str = ".4g") -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return format(value, spec)


def bench_table(bench: str, primary: str, secondary: tuple[str, ...], aggregates: list[dict[str, object]]) -> Table:
    """One row per configuration: the primary metric with its spread, CIs, percent of control and
    the paired test; then the secondary metrics' means."""
    rows = [a for a in aggregates if a["bench"] == bench]
    by_label: dict[str, dict[str, dict[str, object]]] = {}
    for a in rows:
        by_label.setdefault(a["label"], {})[a["metric"]] = a
    table = Table(title=f"{bench}: {primary} (p: paired test on items, see docs/statistics.md)", title_justify="left")
    table.add_column("configuration", no_wrap=True)
    for col in ("runs", "mean ± sd", "95% CI runs", "95% CI items", "% ctl", "p vs ctl"):
        table.add_column(col, justify="right")
    shown = [m for m in secondary if any(m in metrics for metrics in by_label.values())]
    for m in shown:
        table.add_column(m, justify="right")
    table.add_column("NaN items", justify="right")
    for label, metrics in by_label.items():
        a = metrics.get(primary)
        if a is None:
            continue
        test = a["test"]
        boot = a["bootstrap_ci"] or (None, None)
        table.add_row(
            label,
            str(a["n"]),
            f"{fmt(a['mean'])} ± {fmt(a['std'])}",
            f"{fmt(a['ci_low'])}–{fmt(a['ci_high'])}",
            f"{fmt(boot[0])}–{fmt(boot[1])}",
            fmt(a["percent_of_control"], ".1f"),
            "control" if label == next(iter(by_label)) else fmt(test["p_value"], ".3g") if test else "-",
            *(fmt(metrics[m]["mean"]) if m in metrics else "-" for m in shown),
            str(a["nonfinite_items"]),
        )
    return table
