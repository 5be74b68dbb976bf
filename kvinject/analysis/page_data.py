"""What a study's web page shows, as plain data: the manifest, the rows of the study table as
``report --format json`` gives them (each with the numbers its figures place), the cells of the
heatmaps, the board, the fault map and the items of generation benches. The page (html_page.py)
and its figures (page_figures.py) read only this: one source for the tables and the figures."""

from __future__ import annotations

import json
import math
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..benchmarks import BENCHMARKS
from ..exceptions import KvinjectError
from ..experiments.allocation import pareto
from ..experiments.store import Store
from .plots import bits_column, cell_scores, family, frontier_points
from .report import _setting, experiments, render, store_paths, study_table, varying
from .tables import NOTHING_MARK, fmt, span

ITEMS_SHOWN = 40  # items of one configuration in its drill-down at most: those where it differs from the control first
ITEMS_IN_ALL = 600  # items of every drill-down together: a study of many configurations shows fewer of each
RESPONSE_CHARS = 500  # a response's length in the drill-down; the store keeps it whole


def page_data(records: list[dict[str, Any]], df: pd.DataFrame, stores: list[Path], metric: str | None = None) -> dict[str, Any]:
    """Everything the page shows of ``records`` (``df``: their summary, report.summarize)."""
    table = study_table(df, metric, digits=4)
    return {
        "manifest": manifest(records, stores),
        "rows": rows(df, table, records),
        "columns": columns(table),
        "heatmap": heatmap_cells(records),
        "board": board_cells(records),
        "faults": fault_cells(records),
        "items": drill_downs(records, df, table),
    }


def report_json(table: pd.DataFrame) -> list[dict[str, Any]]:
    """The rows of ``report --format json``, through the code that prints them."""
    return json.loads(render(table, "json"))


def manifest(records: list[dict[str, Any]], stores: list[Path]) -> dict[str, Any]:
    """Models with their sha256, the versions that made the page, the settings the records take
    and the dates the stores' runs were written."""
    settings = [r["settings"] for r in records]
    models = sorted({(str(s.get("model")), s["model_sha256"]) for s in settings})
    taken: dict[str, set[str]] = {}
    for s in settings:
        for key, value in (("bench", s["bench"]), ("target", s["target"]), ("layers", s["layers"]), ("seed", s["seed"])):
            taken.setdefault(key, set()).add(str(value))
        taken.setdefault("cache", set()).add(f"{s['cache']['type_k']}/{s['cache']['type_v']}")
        for name, value in s["options"].items():
            taken.setdefault(f"{s['bench']}.{name}", set()).add(json.dumps(value))
    return {
        "models": [{"model": m, "sha256": h} for m, h in models],
        "versions": {p: _version(p) for p in ("kvinject", "llama-cpp-python")},
        "settings": {k: sorted(v) for k, v in sorted(taken.items())},
        "stores": [{"path": str(p), **_dates(p)} for p in store_paths(stores)],
        "records": len(records),
        "configurations": len({r["label"] for r in records}),
    }


def _version(package: str) -> str:
    try:
        return version(package)
    except PackageNotFoundError:
        return "not installed"


def _dates(path: Path) -> dict[str, str]:
    """The first and last run a store holds, as it dated them (a run --output file keeps none)."""
    if path.suffix == ".json":
        return {}
    with Store(path, readonly=True) as store:
        first, last = store.dates()
    return {"first": first, "last": last}


def _number(value: object) -> float | None:
    """A finite float for JSON, else None (JSON has no NaN)."""
    if value is None:
        return None
    x = float(value)
    return x if math.isfinite(x) else None


def rows(df: pd.DataFrame, table: pd.DataFrame, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each row of ``report --format json`` (its keys as they are), with under ``_`` what the
    page adds: the cells as the terminal writes them, the filters' values (error family, cache
    types), the experiment (a figure's panel) and the numbers the figures place."""
    caches = {r["label"]: f"{r['settings']['cache']['type_k']}/{r['settings']['cache']['type_v']}" for r in records}
    titles = {i: title for title, part in experiments(df.loc[table.index]) for i in part.index}
    bits = bits_column(df)
    placed = frontier_placement(df.loc[table.index], bits)
    shown = [c["key"] for c in columns(table)]
    out = []
    for position, ((i, source), row) in enumerate(zip(df.loc[table.index].iterrows(), report_json(table))):
        low, high = _bounds(source["items_ci"])
        extra = {
            "id": position,  # its place among the rows of report --format json
            "label": source["label"],
            "control": bool(source["control"]),
            "family": family(source["label"]),
            "cache": caches.get(source["label"], ""),
            "experiment": titles[i],
            "model_file": Path(str(row["model"])).name,
            "realized_k": _number(source["realized_k_rel_std"]),
            "ci_low": _number(source["ci_low"]),
            "ci_high": _number(source["ci_high"]),
            "items_low": low,
            "items_high": high,
            "bits": _number(bits.get(i)),
            **placed.get(i, {}),
        }
        extra["cells"] = cells(row, extra, source["percent_ci"], shown)
        out.append({**row, "_": extra})
    return out


def _bounds(ci: object) -> tuple[float | None, float | None]:
    if isinstance(ci, (list, tuple)) and len(ci) == 2:
        return _number(ci[0]), _number(ci[1])
    return None, None


def frontier_placement(table: pd.DataFrame, bits: pd.Series) -> dict[int, dict[str, Any]]:
    """Where the frontier places each row, as plots.frontier does: percent of control with its
    paired interval where its panel has one, else the score with its interval; and whether it
    lies on its panel's Pareto front."""
    out: dict[int, dict[str, Any]] = {}
    for _, part in experiments(table):
        relative, y, bounds = frontier_points(part)
        x = bits[part.index].to_numpy(float)
        ok = np.isfinite(x) & np.isfinite(y)
        bench = BENCHMARKS[part.iloc[0]["bench"]]
        front = set(np.flatnonzero(ok)[pareto(x[ok], y[ok], bench.higher_is_better[part.iloc[0]["metric"]])])
        for j, i in enumerate(part.index):
            out[int(i)] = {
                "frontier_y": _number(y[j]),
                "frontier_low": _number(bounds[j][0]),
                "frontier_high": _number(bounds[j][1]),
                "relative": relative,
                "front": j in front,
            }
    return out


def columns(table: pd.DataFrame) -> list[dict[str, str]]:
    """The table's columns: a name, the ``report --format json`` key it sorts by."""
    names = [("model", "model"), ("bench", "bench")]
    names += [(c.removeprefix("option."), c) for c in varying(table)]
    names += [("metric", "metric"), ("configuration", "configuration"), ("runs", "runs"), ("score ± sd", "score"), ("CI runs", "ci_runs")]
    names += [("CI items", "ci_items"), ("% ctl", "% control"), ("% ctl CI", "% control CI"), ("p", "p"), ("q", "q"), ("NaN", "nonfinite_items")]
    return [{"name": n, "key": k} for n, k in names]


def cells(row: dict[str, Any], extra: dict[str, Any], percent_ci: object, keys: list[str]) -> dict[str, str]:
    """A row's cells as the terminal's tables write them (terminal_tables, report_table)."""
    score = row["score"]
    std = row["std"]
    shown = {
        "ci_runs": span(extra["ci_low"], extra["ci_high"]),
        "ci_items": span(extra["items_low"], extra["items_high"]),
        "% control CI": span(*_bounds(percent_ci), ".1f"),
        "model": Path(str(row["model"])).name,
        "configuration": row["configuration"] + (NOTHING_MARK if row.get("changed_nothing") else ""),
        "score": f"{fmt(score)} ± {fmt(std, '.2g')}" if std is not None and row["runs"] > 1 else fmt(score),
        "% control": fmt(row["% control"], ".1f"),
        "p": fmt(row["p"], ".2g"),
        "q": fmt(row["q"], ".2g"),
        "runs": str(row["runs"]),
        "nonfinite_items": str(row["nonfinite_items"]),
    }
    return {k: shown.get(k, "-" if row.get(k) in (None, "") else _setting(row[k])) for k in keys}


def heatmap_cells(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The heatmaps' cells (plots.cell_scores): panel, configuration, length, depth, the mean
    over runs and their number."""
    return [
        {"panel": experiment, "configuration": label, "length": n, "depth": d, "score": float(np.mean(v)), "n": len(v)}
        for (experiment, label), cells in cell_scores(records).items()
        for (n, d), v in sorted(cells.items())
    ]


def board_cells(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The board's cells (board.board) where the records make one (evictions at ratios, every
    bench with its items' scores): none otherwise."""
    from .board import board

    evicts = any(r["settings"]["error"].startswith("evict:") for r in records)
    if not evicts or not all(BENCHMARKS[r["settings"]["bench"]].primary in r["items"] for r in records):
        return []
    try:
        return report_json(board(records))  # report --board --format json's rows
    except KvinjectError:
        return []


def fault_cells(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The fault map by field and bit (faults.fault_map) of a fault campaign's records: its SDC
    and DUE rates with their Wilson intervals; none where no record holds single faults."""
    from .faults import fault_map, machine

    if not any(r.get("faults") for r in records):
        return []
    try:
        return report_json(machine(fault_map(records, ["field", "bit"])))  # report --faults field,bit --format json's rows
    except KvinjectError:
        return []


def drill_downs(records: list[dict[str, Any]], df: pd.DataFrame, table: pd.DataFrame) -> dict[str, dict[str, Any]]:
    """Per row of a generation bench (its place among the rows, ``_.id``): the first run's items beside the control's,
    the response and the verdict (the bench's primary metric) of each: those where the two differ
    first, :data:`ITEMS_SHOWN` of them (fewer where :data:`ITEMS_IN_ALL` would be passed), each
    response cut to :data:`RESPONSE_CHARS` characters."""
    first: dict[tuple, dict[str, Any]] = {}
    for r in sorted(records, key=lambda r: r["run"]):
        if r.get("responses"):
            first.setdefault((_experiment(r["settings"]), r["label"]), r)
    controls = {key: r for (key, _), r in first.items() if r["settings"].get("control")}
    options = [c for c in df.columns if c.startswith("option.")]
    keyed = {}
    for position, i in enumerate(table.index):
        row = df.loc[i]
        given = {c.removeprefix("option."): row[c] for c in options}
        keyed[(_experiment({**row, "options": given, "cache": row}, short=True), row["label"])] = position
    shown = [
        (keyed[key, label], record, controls[key])
        for (key, label), record in first.items()
        if key in controls and (key, label) in keyed and not record["settings"].get("control")
    ]
    each = max(3, min(ITEMS_SHOWN, ITEMS_IN_ALL // max(1, len(shown))))
    return {str(row): _items(record, control, each) for row, record, control in shown}


def _experiment(s: dict[str, Any], short: bool = False) -> tuple:
    """What a record's settings and a summary's row (``short``: its hash cut to 12 characters)
    share of their experiment (report.experiment_key): model file, bench, options, seed,
    backend and the control's cache types."""
    options = tuple(sorted((k, json.dumps(_plain(v))) for k, v in s["options"].items() if _plain(v) is not None))
    backend = tuple(_plain(s["cache"].get(k)) for k in ("flash_attn", "kv_rotation"))
    sha = s["model_sha256"] if short else s["model_sha256"][:12]
    return (sha, s["bench"], options, int(s["seed"]), backend, json.dumps(_plain(s.get("control_cache"))))


def _plain(value: object) -> object:
    """A setting as a record holds it: a summary's table writes 3 as 3.0 beside NaN, None as NaN."""
    if isinstance(value, (np.generic,)):
        value = value.item()
    if isinstance(value, float):
        return None if math.isnan(value) else int(value) if value.is_integer() else value
    return value


def _items(record: dict[str, Any], control: dict[str, Any], each: int) -> dict[str, Any]:
    primary = BENCHMARKS[record["settings"]["bench"]].primary
    verdicts, control_verdicts = record["items"].get(primary, []), control["items"].get(primary, [])
    responses, control_responses = record["responses"], control["responses"]
    n = min(len(responses), len(control_responses))
    differs = [i for i in range(n) if responses[i] != control_responses[i] or _at(verdicts, i) != _at(control_verdicts, i)]
    same = sorted(set(range(n)) - set(differs))
    shown = (differs + same)[:each]
    return {
        "metric": primary,
        "total": n,
        "differ": len(differs),
        "items": [
            {
                "item": i,
                "control": control_responses[i][:RESPONSE_CHARS],
                "response": responses[i][:RESPONSE_CHARS],
                "control_verdict": _at(control_verdicts, i),
                "verdict": _at(verdicts, i),
            }
            for i in shown
        ],
    }


def _at(values: list, i: int) -> float | None:
    return _number(values[i]) if i < len(values) else None
