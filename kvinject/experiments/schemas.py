"""What kvinject reads back, checked as it is read, one schema per kind: a results store's row
(settings and record), a ``kvinject run --output`` file, and a SLURM run folder's ``run.json``.
A file edited by hand or damaged on disk is refused in one line that names the file, the row or
record and the field, with the fix; never a traceback from deep in the analysis."""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..benchmarks import BENCHMARKS
from ..benchmarks.base import GenerationBenchmark
from ..benchmarks.outcomes import METRICS as OUTCOMES
from ..error_models.configuration import Configuration
from ..exceptions import KvinjectError

NUMBER = "a number"  # a float, or an int (not a bool) a float holds exactly
# The most array tasks a run folder has: ten times SLURM's default MaxArraySize; a run.json
# edited to 10^20 tasks had `sweep DIR --status` count stores for ever.
MAX_TASKS = 10000


class DamagedError(KvinjectError):
    """A record or file kvinject wrote, no longer as it wrote it."""


@dataclass(frozen=True)
class Maybe:
    """The schema, or null (a metric NaN has no JSON form and is stored as null)."""

    schema: Any


@dataclass(frozen=True)
class Each:
    """A list whose every element has the schema."""

    schema: Any


@dataclass(frozen=True)
class Values:
    """An object whose every value has the schema."""

    schema: Any


# Keys ending in ? may be left out: records written before they were kept lack them.
CACHE = {"type_k": str, "type_v": str, "flash_attn": str, "kv_rotation": bool}
CONFIGURATION = {"error": str, "target": str, "layers": str, "positions?": str, "heads?": str, "cache": CACHE}  # Configuration.to_dict
SETTINGS = {"bench": str, **CONFIGURATION, "seed": int, "options": dict, "model_sha256": str, "model?": str, "control?": bool, "control_cache?": str}
# What the error did to K and to V (RealizedStats.to_dict); report reads k's, the runs' changes both.
STATS = {"values?": int, "sites?": int, "changed?": int, "nonfinite?": int}
STATS |= {f"{k}?": Maybe(NUMBER) for k in ("rel_err_mean", "rel_err_std", "sign_flip_frac", "snr_db")}
REALIZED = {"k": STATS, "v": STATS}
# Where a fault campaign's fault landed (report --faults groups by these; replay places it again).
SITE = {"layer": int, "kv": str, "position": int, "head": int, "element": int, "bit": int, "field": str, "format": str, "stage?": str}
RECORD = {
    "label": str,
    "run?": int,  # a store's is its row's
    "metrics": Values(Maybe(NUMBER)),
    "items": Values(Each(Maybe(NUMBER))),
    "realized": REALIZED,
    "nonfinite_items": int,
    "outputs?": Each(Each(int)),  # each item's generated tokens (none before record format 2)
    "faults?": Maybe(Each(Maybe(Each(SITE)))),  # each item's faults
}
RUN_FILE = {
    "meta": {"model": str, "model_sha256": str, "seed": int, "configurations": Each({"label": str, **CONFIGURATION}), "options": Values(dict)},
    "records": Each({"bench": str, "run": int, **RECORD}),
}
RUN_FOLDER = {"grid": str, "tasks": int, "workdir": str, "max_cells": int, "submissions": Each({"job": str, "tasks": Each(int)})}


def problem(value: Any, schema: Any, where: str = "") -> str | None:
    """What in ``value`` does not have ``schema`` (the field and why), or None."""
    at = f"{where}: " if where else ""
    if isinstance(schema, Maybe):
        return None if value is None else problem(value, schema.schema, where)
    if schema == NUMBER:  # an integer past 2^53 is no float: numpy took a list with 10^20 as objects
        ok = isinstance(value, float) or (isinstance(value, int) and not isinstance(value, bool) and abs(value) <= 2**53)
        return None if ok else f"{at}{json.dumps(value)[:40]} is not a number"
    if isinstance(schema, type):
        ok = isinstance(value, schema) and not (schema is int and isinstance(value, bool))
        return None if ok else f"{at}{json.dumps(value)[:40]} is not {_noun(schema)}"
    if isinstance(schema, Each):
        if not isinstance(value, list):
            return f"{at}{json.dumps(value)[:40]} is not a list"
        return next((p for i, v in enumerate(value) if (p := problem(v, schema.schema, f"{where}[{i}]"))), None)
    if isinstance(schema, Values):
        if not isinstance(value, dict):
            return f"{at}{json.dumps(value)[:40]} is not an object"
        return next((p for k, v in value.items() if (p := problem(v, schema.schema, f"{where}.{k}" if where else k))), None)
    if not isinstance(value, dict):
        return f"{at}{json.dumps(value)[:40]} is not an object"
    for key, inner in schema.items():
        name = key.rstrip("?")
        field = f"{where}.{name}" if where else name
        if name not in value:
            if not key.endswith("?"):
                return f"{field} is missing"
        elif p := problem(value[name], inner, field):
            return p
    return None


def _noun(typ: type) -> str:
    return {str: "text", int: "an integer", bool: "true or false", dict: "an object", list: "a list"}.get(typ, typ.__name__)


def _parse(text: Any, where: str) -> tuple[Any, str | None]:
    try:
        return json.loads(text), None
    except (TypeError, ValueError) as e:
        return None, f"{where} is not JSON ({e})"


def store_row(path: Path, cell: str, run: int, settings: Any, record: Any) -> dict[str, Any]:
    """A results store's row as :meth:`Store.records` gives it, refused if damaged."""
    parsed_settings, why = _parse(settings, "settings")
    parsed_record, why_record = _parse(record, "record")
    why = why or why_record or problem(parsed_settings, SETTINGS, "settings") or problem(parsed_record, RECORD, "record")
    why = why or _meaning(parsed_settings, "settings") or _row(cell, run, parsed_record)
    if why is None:
        labels = {"record.label": parsed_record["label"]} | ({"settings.label": parsed_settings["label"]} if "label" in parsed_settings else {})
        why = next((p for where, label in labels.items() if (p := _label(parsed_settings, label, where))), None)
        why = why or _items(parsed_settings["bench"], parsed_record, "record", parsed_settings.get("control"))
    if why:
        delete = f"DELETE FROM runs WHERE cell = {_literal(cell)} AND run = {_literal(run)}"
        raise DamagedError(
            f"{row_name(path, cell, run)} is damaged ({why}): delete it "
            f'(sqlite3 {shlex.quote(str(path))} "{delete}") and the sweep that wrote it computes it again'
        )
    return {"cell": cell, "run": run, "settings": parsed_settings, **parsed_record}


def row_name(path: Path, cell: Any, run: Any) -> str:
    """How a message names a store's row."""
    return f"{path}: the run stored as cell {str(cell)[:12]}, run {run}"


def _literal(value: Any) -> str:
    """``value`` as SQL writes it, whatever SQLite kept in the column."""
    if isinstance(value, bytes):
        return f"X'{value.hex()}'"
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    return "NULL" if value is None else str(value)


def _row(cell: Any, run: Any, record: dict[str, Any]) -> str | None:
    """The row's own columns (SQLite keeps any value in any column): its key, and its record's run."""
    if not isinstance(cell, str) or not isinstance(run, int) or run < 0:
        return f"cell {cell!r}, run {run!r} is no key of a run"
    if record.get("run", run) != run:
        return f"record.run: {record['run']} is not the row's run {run}"
    return None


def _meaning(settings: dict[str, Any], where: str) -> str | None:
    """What in well-formed settings (or a run file's configuration) names no bench, or no
    configuration, kvinject has."""
    if "bench" in settings and settings["bench"] not in BENCHMARKS:
        return f"{where}.bench: '{settings['bench']}' is no benchmark"
    try:
        Configuration.from_dict(settings)
    except (KvinjectError, TypeError) as e:  # TypeError: cache settings CacheOptions does not take
        return f"{where}: no configuration ({e})"
    return None


def _label(settings: dict[str, Any], label: Any, where: str) -> str | None:
    """A label that is not its configuration's (``Configuration.label``), by which report groups
    the runs and finds the control, in well-formed settings (:func:`_meaning`)."""
    own = Configuration.from_dict(settings).label
    return None if label == own else f"{where}: {json.dumps(label)[:60]} is not its configuration's label {json.dumps(own)}"


def _items(bench: str, record: dict[str, Any], where: str, control: bool | None) -> str | None:
    """One value (tokens, faults) per item in each of the record's lists, and a pass/fail item's
    score 0 or 1 (its interval counts the passes among the items, its paired test the items
    that changed). A generation bench's record holds its headline score per item (a later run
    is classified against it), and one that is not the control's (``control`` False; None:
    unknown) and holds its tokens was classified against the control: it holds the outcomes."""
    items = record["items"]
    if issubclass(BENCHMARKS[bench], GenerationBenchmark):
        if (primary := BENCHMARKS[bench].primary) not in items:
            return f"{where}.items.{primary} is missing"
        if control is False and "outputs" in record and not OUTCOMES.keys() & items.keys():
            return f"{where}.items: {', '.join(OUTCOMES)} are missing from a run classified against its control"
    lengths = {f"items.{k}": len(v) for k, v in items.items()} | {k: len(record[k]) for k in ("outputs", "faults") if record.get(k) is not None}
    if len(set(lengths.values())) > 1:
        return f"{where}: its lists hold different numbers of items ({', '.join(f'{k} {n}' for k, n in lengths.items())})"
    if "faults" in lengths and "outputs" not in lengths:  # recorded faults came after the tokens (record format 2)
        return f"{where}.outputs is missing beside its faults"
    for metric in sorted(BENCHMARKS[bench].binary & set(items)):
        for i, value in enumerate(items[metric]):
            if value is not None and value not in (0, 1):
                return f"{where}.items.{metric}[{i}]: {value} is no pass/fail score (0 or 1)"
    return _outcomes(items, where)


def _outcomes(items: dict[str, list[Any]], where: str) -> str | None:
    """A record classified against its golden run has every outcome, one of them per item
    (replay and the fault map read the one that is 1)."""
    present = [o for o in OUTCOMES if o in items]
    if present and len(present) < len(OUTCOMES):
        return f"{where}.items: {', '.join(o for o in OUTCOMES if o not in items)} missing beside {', '.join(present)}"
    for i, values in enumerate(zip(*(items[o] for o in present))):
        if values.count(1) != 1 or not all(v in (0, 1) for v in values):  # None, a NaN stored: no outcome
            return f"{where}.items: item {i} is not one outcome of {', '.join(OUTCOMES)} ({', '.join(f'{o} {v}' for o, v in zip(present, values))})"
    return None


def same_items(records: Iterable[tuple[str, dict[str, Any]]]) -> None:
    """Records of one model, bench, options and seed score the same items: the paired test, the
    fault outcomes and replay pair them item by item. ``records``: each where it was read (file,
    row) with the record as read (its ``settings`` beside it). One that holds another number of
    items than the first of its kind is refused, with both named."""
    first: dict[str, tuple[str, int]] = {}
    for where, record in records:
        lists = [*record["items"].values(), *([record["outputs"]] if record.get("outputs") is not None else [])]
        if not lists:
            continue
        s = record["settings"]
        seen = first.setdefault(json.dumps([s["model_sha256"], s["bench"], s["options"], s["seed"]], sort_keys=True), (where, len(lists[0])))
        if seen[1] != len(lists[0]):
            raise DamagedError(
                f"runs of one model, bench ({s['bench']}), options and seed hold different numbers of items, which no test can pair: {seen[1]} in "
                f"{seen[0]}, {len(lists[0])} in {where}. One was edited or made from other data: delete it (a sweep computes it again), or report them apart"
            )


def run_file(path: Path, data: Any) -> None:
    """A ``kvinject run --output`` document, refused if it is not as kvinject wrote it: each
    record's fields, and its bench and configuration among those its meta names."""
    if isinstance(data, dict) and isinstance(data.get("meta"), dict) and "options" not in data["meta"]:
        raise KvinjectError(
            f"{path}: written by kvinject 0.1.0 before `run --output` recorded the benches' options, which say what is pass/fail: run it again to report it"
        )
    why = problem(data, RUN_FILE)
    if why is None:
        meta = data["meta"]
        configurations = {f"meta.configurations[{i}]": c for i, c in enumerate(meta["configurations"])}
        why = next((p for where, c in configurations.items() if (p := _meaning(c, where) or _label(c, c["label"], f"{where}.label"))), None)
        labels = {c["label"] for c in meta["configurations"]}
        control_label = meta["configurations"][0]["label"] if meta["configurations"] else None  # run_output.py reads the first as the control
        benches = set(meta["options"])
        for i, record in enumerate(data["records"]):
            if why:
                break
            if record["run"] < 0:
                why = f"records[{i}].run: {record['run']} is no run number"
            elif record["label"] not in labels:
                why = f"records[{i}].label: '{record['label']}' is none of the run's configurations ({', '.join(sorted(labels))})"
            elif record["bench"] not in benches:
                why = f"records[{i}].bench: '{record['bench']}' is none of the run's benches ({', '.join(sorted(benches))})"
            elif record["bench"] not in BENCHMARKS:
                why = f"records[{i}].bench: '{record['bench']}' is no benchmark"
            else:
                why = _items(record["bench"], record, f"records[{i}]", record["label"] == control_label)
    if why:
        raise DamagedError(f"{path}: not a file written by kvinject run --output, or edited since ({why}); write it again with the same kvinject run")


def run_folder(path: Path, saved: Any) -> None:
    """A SLURM run folder's ``run.json``, refused if damaged: its submissions name tasks it has."""
    why = problem(saved, RUN_FOLDER)
    if why is None and not 1 <= saved["tasks"] <= MAX_TASKS:
        why = f"tasks: {saved['tasks']} is not a number of array tasks (1 to {MAX_TASKS})"
    if why is None:
        why = next(
            (
                f"submissions[{i}].tasks: {t} is no task of 0-{saved['tasks'] - 1}"
                for i, s in enumerate(saved["submissions"])
                for t in s["tasks"]
                if not 0 <= t < saved["tasks"]
            ),
            None,
        )
    if why:
        raise DamagedError(f"{path}: damaged ({why}); restore it, or submit the grid again into a new run folder (--run-folder)")
