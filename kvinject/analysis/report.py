"""Tables from one or more results stores: the study's score and percent of control for each
bench and configuration, with confidence intervals and the paired test (figures: plots.py)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd
from scipy.stats import false_discovery_control

from ..benchmarks import BENCHMARKS
from ..benchmarks.base import Benchmark
from ..benchmarks.options import Options
from ..engine.positions import Positions
from ..error_models import parse_error
from ..exceptions import KvinjectError
from ..experiments.schemas import row_name, same_items
from ..experiments.store import Store
from .aggregate import aggregate
from .run_output import output_records, record_result
from .tables import NOTHING_MARK, NOTHING_NOTE

FORMATS = ("table", "markdown", "csv", "json", "latex")


def store_paths(paths: list[Path]) -> list[Path]:
    """Stores as given, a folder (a run folder of sweep --slurm) standing for the stores in it."""
    out = []
    for path in paths:
        if path.is_dir():
            found = sorted(path.glob("*.results.sqlite"))
            if not found:
                raise KvinjectError(f"{path} holds no results stores (*.results.sqlite): give a store, or the run folder of a sweep --slurm")
            out += found
        else:
            out.append(path)
    return out


def load_records(paths: list[Path]) -> list[dict[str, Any]]:
    """Every record of every store (a folder: the stores in it) and of every ``kvinject run
    --output`` file (``.json``), each (cell, run) once. Stores are opened read-only."""
    seen: dict[tuple[str, int], tuple[str, dict[str, Any]]] = {}
    for path in store_paths(paths):
        if path.suffix == ".json":
            records = [(f"{path}: {r['label']} run {r['run']}", r) for r in output_records(path)]
        else:
            with Store(path, readonly=True) as store:
                records = [(row_name(path, r["cell"], r["run"]), r) for r in store.records()]
        for where, record in records:
            seen.setdefault((record["cell"], record["run"]), (where, record))
    same_items(seen.values())
    return [record for _, record in seen.values()]


def _flat(record: dict[str, Any]) -> dict[str, Any]:
    s = record["settings"]
    return {
        "model": s.get("model"),
        "bench": s["bench"],
        "error": s["error"],
        "target": s["target"],
        "layers": s["layers"],
        "positions": s.get("positions", "all"),
        "heads": s.get("heads", "all"),
        "cache_k": s["cache"]["type_k"],
        "cache_v": s["cache"]["type_v"],
        "seed": s["seed"],
        **{f"option.{k}": v for k, v in s["options"].items()},
    }


def select(records: list[dict[str, Any]], filters: list[str]) -> list[dict[str, Any]]:
    """The records that match every filter, with the controls of their experiments: a filter on
    a configuration (error=normal:0,0.25, cache_k=q8_0) keeps what it is compared with. None
    matching is an error that lists the values each filtered setting takes."""
    if not records:
        raise KvinjectError("these stores hold no runs yet")
    flats = [_flat(r) for r in records]
    keys = list(dict.fromkeys(k for flat in flats for k in flat))  # a bench's options are keys of its records only
    pairs = []
    for f in filters:
        key, eq, value = f.partition("=")
        if not eq or key not in keys:
            raise KvinjectError(f"--filter takes KEY=VALUE with KEY one of {', '.join(keys)}; got '{f}'")
        pairs.append((key, _canonical(key, value)))
    chosen = {id(r) for r, flat in zip(records, flats) if all(key in flat and str(flat[key]) == value for key, value in pairs)}
    if not chosen:
        taken = {}
        for key, _ in pairs:
            taken[key] = sorted({str(flat[key]) for flat in flats if key in flat})
        hint = "; ".join(f"{k} takes {', '.join(v[:12])}{', ...' if len(v) > 12 else ''}" for k, v in taken.items())
        raise KvinjectError(f"no records match {' '.join(filters)}: {hint}")
    compared = {experiment_key(r) for r in records if id(r) in chosen}
    return [r for r in records if id(r) in chosen or (r["settings"].get("control") and experiment_key(r) in compared)]


def _canonical(key: str, value: str) -> str:
    """A filter's value as records store it: positions and error specs in their canonical spelling
    (positions=first:4 is stored 0-3, error=normal:0,.25 as normal:0,0.25); others as given."""
    try:
        if key == "positions":
            positions = Positions.parse(value)
            return positions.spec if positions is not None else value
        if key == "error" and "@" not in value:  # records keep the cache types apart (cache_k, cache_v)
            return parse_error(value).spec
    except KvinjectError:
        pass  # no match, and the message lists what the records hold
    return value


def experiment_key(record: dict[str, Any]) -> str:
    """What a record is compared within: model file, bench, options, seed, the backend settings
    labels leave out (flash attention, rotation, as requested: one per run or grid) and, where a
    grid gave each cache its own control, the cache types of that control."""
    s = record["settings"]
    backend = [s["cache"].get(k) for k in ("flash_attn", "kv_rotation")]
    return repr((s["model_sha256"], s["bench"], sorted(s["options"].items()), s["seed"], backend, s.get("control_cache")))


def control_of(records: list[dict[str, Any]], record: dict[str, Any]) -> dict[str, Any]:
    """The control ``record`` is compared with among ``records`` (its experiment's)."""
    experiment = experiment_key(record)
    control = next((r for r in records if r["settings"].get("control") and experiment_key(r) == experiment), None)
    if control is None:
        raise KvinjectError(f"no control of {record['label']} in these stores: give the store that holds it too")
    return control


def summarize(records: list[dict[str, Any]]) -> pd.DataFrame:
    """One row per (experiment, configuration, metric), each experiment (:func:`experiment_key`)
    compared with its own control."""
    experiments: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        experiments.setdefault(experiment_key(r), []).append(r)
    rows = []
    for group in experiments.values():
        controls = [r for r in group if r["settings"].get("control")]
        if not controls:
            continue  # a shard without its control cannot be compared; merge the stores
        ordered = controls + [r for r in group if not r["settings"].get("control")]
        bench = BENCHMARKS[ordered[0]["settings"]["bench"]]
        flat = _flat(ordered[0])
        experiment = {k: v for k, v in flat.items() if k in ("model", "bench", "seed") or k.startswith("option.")}
        experiment["model_sha256"] = ordered[0]["settings"]["model_sha256"][:12]
        if "control_cache" in ordered[0]["settings"]:
            experiment["control_cache"] = ordered[0]["settings"]["control_cache"]
        realized, cache = {}, {}
        for r in ordered:
            realized.setdefault(r["label"], []).append(r["realized"]["k"].get("rel_err_std"))
            # The label names the cache types, not these: rows that differ only here must show them.
            cache[r["label"]] = {k: r["settings"]["cache"][k] for k in ("flash_attn", "kv_rotation")}
        for row in aggregate(bench, [record_result(r) for r in ordered], _options(bench, ordered[0]["settings"]["options"])):
            k_std = [x for x in realized.get(row["label"], []) if x is not None]
            rows.append({**experiment, **row, **cache[row["label"]], "realized_k_rel_std": sum(k_std) / len(k_std) if k_std else None})
    return pd.DataFrame(rows)


def _options(bench: type[Benchmark], given: dict[str, Any]) -> Options | None:
    """The bench's options as a record gives them, or None where an older version's no longer
    parse (the class's ``binary`` then says what is pass/fail: no option-dependent metric is
    taken for pass/fail, the cautious reading)."""
    try:
        return bench.Options.parse(given)
    except KvinjectError:
        return None


def primary_rows(df: pd.DataFrame, metric: str | None = None) -> list[bool]:
    """The rows of `metric`, or of each bench's primary metric."""
    return [m == (metric or BENCHMARKS[b].primary) for m, b in zip(df["metric"], df["bench"])]


def check_metric(df: pd.DataFrame, metric: str) -> None:
    """`metric` must be one the records' benches declare, and measured in some record."""
    known = sorted({m for b in df["bench"].unique() for m in BENCHMARKS[b].higher_is_better})
    if metric not in known:
        raise KvinjectError(f"--metric {metric}: these benches report {', '.join(known)}")
    if not (df["metric"] == metric).any():
        raise KvinjectError(f"--metric {metric}: no record measured it (token_match and the drift metrics need a control to compare with)")


def study_table(df: pd.DataFrame, metric: str | None = None, digits: int = 4) -> pd.DataFrame:
    """The study's layout: score and percent of control per bench and configuration, on each
    bench's primary metric (or `metric`), with both confidence intervals, the paired interval of
    percent of control, the paired test's p, and its Benjamini-Hochberg q over the rows of that
    metric compared with the same control (an experiment: a sweep compares many configurations
    with one control); the intervals to ``digits`` significant digits (a terminal shows 3)."""
    if df.empty:
        return df
    out = df[primary_rows(df, metric)].copy()
    g = f".{digits}g"
    out["ci_items"] = out["items_ci"].map(lambda ci: f"{ci[0]:{g}}–{ci[1]:{g}}" if ci and None not in ci else "")
    out["ci_runs"] = [f"{lo:{g}}–{hi:{g}}" if pd.notna(lo) else "" for lo, hi in zip(out["ci_low"], out["ci_high"])]
    out["percent_ci"] = out["percent_ci"].map(lambda ci: f"{ci[0]:.1f}–{ci[1]:.1f}" if isinstance(ci, list) and all(map(_given, ci)) else "")
    out["p"] = out["test"].map(lambda t: t["p_value"] if isinstance(t, dict) else None)
    q = out.groupby([experiment_ids(out), out["metric"]], sort=False)["p"].transform(_q_values)
    out["q"] = q.astype(object).where(q.notna(), None)  # none for the control, as its p
    cols = [
        "model",
        "bench",
        *varying(out),
        "metric",
        "configuration",
        "n",
        "mean",
        "std",
        "ci_runs",
        "ci_items",
        "percent_of_control",
        "percent_ci",
        "p",
        "q",
        "nonfinite_items",
        *(["changed_nothing"] if "changed_nothing" in out.columns else []),  # summarize's rows have it
    ]
    names = {"n": "runs", "mean": "score", "percent_of_control": "% control", "percent_ci": "% control CI"}
    return out[cols].rename(columns=names)


def _q_values(p: pd.Series) -> pd.Series:
    """Benjamini-Hochberg adjusted p-values (scipy's false_discovery_control) of the given ones;
    NaN where no test was made."""
    x = pd.to_numeric(p)
    given = x.notna()
    q = pd.Series(float("nan"), index=p.index)
    if given.any():
        q[given] = false_discovery_control(x[given].to_numpy())
    return q


def varying(df: pd.DataFrame) -> list[str]:
    """The settings beside model, bench and configuration in which rows differ (seed, a bench
    option, flash attention, rotation, the model file where one model name has several): shown
    so that no two rows look alike."""
    settings = ["model_sha256", "seed", *sorted(c for c in df.columns if c.startswith("option.")), "flash_attn", "kv_rotation"]
    shown = [c for c in settings if c in df.columns and df[c].astype(str).nunique(dropna=False) > 1]
    if "model_sha256" in shown and "model" in df.columns and df.groupby(df["model"].map(_file_name))["model_sha256"].nunique().max() < 2:
        shown.remove("model_sha256")  # the models' file names, which tables and titles show, tell the files apart
    return shown


def _file_name(model: object) -> str:
    return Path(str(model)).name


def terminal_tables(table: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """The study table cut per bench, metric and model to fit a 100-column terminal: what every
    row of a part shares (the model by its file name, a seed, an option) goes to its title, the
    score with its std, the NaN column only where an item had NaN/Inf; the interval across runs
    is left to --wide (the std gives the runs' spread)."""
    parts = []
    table = mark_changed_nothing(table.assign(model=table["model"].map(_file_name)))
    files = ["model", "model_sha256"] if "model_sha256" in table.columns else ["model"]  # the hash where file names collide (varying)
    for (bench, metric, *_), part in table.groupby(["bench", "metric", *files], sort=False):
        settings = ["model", "model_sha256", "seed", "flash_attn", "kv_rotation", *(c for c in part.columns if c.startswith("option."))]
        shared = [c for c in settings if c in part.columns and part[c].astype(str).nunique(dropna=False) == 1]
        values = {c.removeprefix("option."): part[c].iloc[0] for c in shared if _given(part[c].iloc[0])}
        title = ", ".join([f"{bench}: {metric}", *(f"{k} {_setting(v)}" for k, v in values.items())])
        # A single run has no spread to show: its std is 0 by construction, not a measurement.
        part = part.assign(score=[f"{m:.3g} ± {s:.2g}" if pd.notna(s) and n > 1 else f"{m:.3g}" for m, s, n in zip(part["score"], part["std"], part["runs"])])
        # Columns nothing fills (every row a control), and q where it can only repeat p (one test).
        empty = [c for c in ("ci_items", "% control CI", "p", "q") if c in part.columns and not part[c].map(_filled).any()]
        single = ["q"] if "q" in part.columns and part["p"].map(_filled).sum() < 2 else []
        drop = ["bench", "metric", "std", "ci_runs", *shared, *empty, *single] + (["nonfinite_items"] if not part["nonfinite_items"].any() else [])
        part = part.drop(columns=[c for c in drop if c in part.columns])
        options = [c for c in part.columns if c.startswith("option.")]
        part[options] = part[options].map(lambda v: _setting(v) if _given(v) else "-")
        names = {c: c.removeprefix("option.") for c in options} | {"% control": "% ctl", "% control CI": "% ctl CI", "nonfinite_items": "NaN"}
        parts.append((title, part.rename(columns=names)))
    return parts


def experiment_ids(df: pd.DataFrame) -> pd.Series:
    """Each row's experiment (model file, bench, options, seed, backend: what shares a control),
    as a hashable key."""
    keys = [c for c in ("model_sha256", "bench", "seed", "flash_attn", "kv_rotation", "control_cache") if c in df.columns]
    keys += sorted(c for c in df.columns if c.startswith("option."))
    return df[keys].apply(lambda row: repr(list(row)), axis=1)


def experiments(df: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """The rows of each experiment (model file, bench, options, seed, backend) in summarize's
    order (the ``control`` column marks its control), titled by the model's name, the bench and the settings that tell it
    apart from the other experiments on that bench: a figure's panels, each against its own control."""
    groups = [rows for _, rows in df.groupby(experiment_ids(df), sort=False)]
    firsts = pd.DataFrame([rows.iloc[0] for rows in groups])
    titled = []
    for rows in groups:
        first = rows.iloc[0]
        shown = varying(firsts[firsts["bench"] == first["bench"]])
        settings = [f"{c.removeprefix('option.')} {_setting(first[c]) if _given(first[c]) else '-'}" for c in shown]
        titled.append((", ".join([f"{_file_name(first['model'])}: {first['bench']}", *settings]), rows))
    return titled


def _setting(value: object) -> str:
    """An option as the command line writes it: 1024,2048 for a list; 3 for the limit 3, which an
    option column holds as 3.0 where another bench lacks it (NaN)."""
    if isinstance(value, (list, tuple)):
        return ",".join(map(_setting, value))
    return str(int(value) if isinstance(value, float) and value.is_integer() else value)


def _filled(value: object) -> bool:
    """Whether a table cell shows something: a value, not an empty interval."""
    return _given(value) and value != ""


def _given(value: object) -> bool:
    """Whether a setting has a value: not None or NaN (a list option such as depths is one)."""
    return not (value is None or isinstance(value, float) and math.isnan(value))


def mark_changed_nothing(table: pd.DataFrame) -> pd.DataFrame:
    """The table for reading: configurations that changed nothing marked, the flag's column gone."""
    if "changed_nothing" not in table.columns:
        return table
    flagged = table["changed_nothing"].fillna(False).astype(bool)
    return table.assign(configuration=table["configuration"].where(~flagged, table["configuration"] + NOTHING_MARK)).drop(columns="changed_nothing")


def flags_nothing(table: pd.DataFrame) -> bool:
    return "changed_nothing" in table.columns and bool(table["changed_nothing"].fillna(False).any())


def render(table: pd.DataFrame, fmt: str) -> str:
    """The table in a file format: csv and json keep the flags as columns, markdown and latex
    mark the configurations and add the note."""
    note = ""
    if fmt in ("markdown", "latex"):
        note = f"\n{NOTHING_NOTE}\n" if flags_nothing(table) else ""
        table = mark_changed_nothing(table)
    if fmt == "markdown":  # an empty cell where nothing was measured (the control's p), not "nan"
        return table.astype(object).where(table.notna(), None).to_markdown(index=False, floatfmt=".4g", missingval="") + note
    if fmt == "csv":  # 15 significant digits: every decimal as typed, without float noise (99.99999999999999 for 100)
        return table.to_csv(index=False, float_format="%.15g")
    if fmt == "json":
        return table.to_json(orient="records", indent=2)
    if fmt == "latex":
        return table.to_latex(index=False, float_format="%.4g", na_rep="", escape=True) + note  # pandas escapes nothing by default: % starts a comment
    raise KvinjectError(f"--format must be one of {', '.join(FORMATS)}")
