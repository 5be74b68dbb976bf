"""What kvinject reads back, checked as it is read, one schema per kind: a results store's row
(settings and record), a ``kvinject run --output`` file, and a SLURM run folder's ``run.json``.
A file edited by hand or damaged on disk is refused in one line that names the file, the row or
record and the field, with the fix; never a traceback from deep in the analysis."""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..benchmarks import BENCHMARKS
from ..error_models.configuration import Configuration
from ..exceptions import KvinjectError

NUMBER = "a number"  # an int or float, not a bool


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
SETTINGS = {"bench": str, "error": str, "target": str, "layers": str, "cache": CACHE, "seed": int, "options": dict, "model_sha256": str, "control?": bool}
RECORD = {"label": str, "metrics": Values(Maybe(NUMBER)), "items": Values(Each(Maybe(NUMBER))), "realized": Values(dict), "nonfinite_items": int}
RUN_FILE = {
    "meta": {"model": str, "model_sha256": str, "seed": int, "configurations": Each({"label": str}), "options?": Values(dict)},
    "records": Each({"bench": str, "run": int, **RECORD}),
}
RUN_FOLDER = {"grid": str, "tasks": int, "workdir": str, "max_cells": int, "submissions": Each({"job": str, "tasks": Each(int)})}


def problem(value: Any, schema: Any, where: str = "") -> str | None:
    """What in ``value`` does not have ``schema`` (the field and why), or None."""
    at = f"{where}: " if where else ""
    if isinstance(schema, Maybe):
        return None if value is None else problem(value, schema.schema, where)
    if schema == NUMBER:
        return None if isinstance(value, (int, float)) and not isinstance(value, bool) else f"{at}{json.dumps(value)[:40]} is not a number"
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
    why = why or why_record or problem(parsed_settings, SETTINGS, "settings") or problem(parsed_record, RECORD, "record") or _meaning(parsed_settings)
    if why:
        delete = f"DELETE FROM runs WHERE cell = '{cell}' AND run = {run}"
        raise DamagedError(
            f"{path}: the run stored as cell {cell[:12]}, run {run} is damaged ({why}): delete it "
            f'(sqlite3 {shlex.quote(str(path))} "{delete}") and the sweep that wrote it computes it again'
        )
    return {"cell": cell, "run": run, "settings": parsed_settings, **parsed_record}


def _meaning(settings: dict[str, Any]) -> str | None:
    """What in well-formed settings names no bench, or no configuration, kvinject has."""
    if settings["bench"] not in BENCHMARKS:
        return f"settings.bench: '{settings['bench']}' is no benchmark"
    try:
        Configuration.from_dict(settings)
    except (KvinjectError, TypeError) as e:  # TypeError: cache settings CacheOptions does not take
        return f"settings: no configuration ({e})"
    return None


def run_file(path: Path, data: Any) -> None:
    """A ``kvinject run --output`` document, refused if it is not as kvinject wrote it: each
    record's fields, and its bench and configuration among those its meta names."""
    why = problem(data, RUN_FILE)
    if why is None:
        meta = data["meta"]
        labels = {c["label"] for c in meta["configurations"]}
        benches = set(meta.get("options", {}))
        for i, record in enumerate(data["records"]):
            if record["run"] < 0:
                why = f"records[{i}].run: {record['run']} is no run number"
            elif record["label"] not in labels:
                why = f"records[{i}].label: '{record['label']}' is none of the run's configurations ({', '.join(sorted(labels))})"
            elif "options" in meta and record["bench"] not in benches:
                why = f"records[{i}].bench: '{record['bench']}' is none of the run's benches ({', '.join(sorted(benches))})"
            if why:
                break
    if why:
        raise DamagedError(f"{path}: not a file written by kvinject run --output, or edited since ({why}); write it again with the same kvinject run")


def run_folder(path: Path, saved: Any) -> None:
    """A SLURM run folder's ``run.json``, refused if damaged: its submissions name tasks it has."""
    why = problem(saved, RUN_FOLDER)
    if why is None and saved["tasks"] < 1:
        why = f"tasks: {saved['tasks']} is not a number of array tasks"
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
