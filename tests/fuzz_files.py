"""The files kvinject reads, generated as tests/fuzz_cli.py generates command lines: each kind's
valid file from the workspace (a grid, the template store of one fault-campaign run, a
`run --output` file, a SLURM run folder, an lm-eval task of `--include-path`, lm-eval's
`--config`) changed one key, row, field or file at a time, then read by the commands that read
that kind. A :class:`Case` writes its changed file into a fresh copy of the workspace
(``prepare``) and names the command; tests/fuzz_verdict.py judges it.

Grids come from GRID and the repository's examples, each cut to the smallest sizes on the tiny
model (:func:`smallest`); the smallest grid also runs for real."""

from __future__ import annotations

import json
import random
import shutil
import sqlite3
import time
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import yaml

from tests.fuzz_cli import GRID, MODEL, NUMBERS, STORE

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
RUN_FILE = "run.json"  # the template's `run --output` file, of the run that wrote STORE
FOLDER = "grid.slurm"  # the run folder of grid.toml that each SLURM case makes
SMALL = GRID + "[[errors]]\nspec = 'normal:0,0.5'\n"  # the workspace's grid.toml
# Each bench option's smallest value (tests/fuzz_cli.py's BENCHES), put in place of an example's.
SIZES = {"limit": 1, "ctx": 64, "chunks": 1, "samples": 1, "max_tokens": 2, "shots": 0, "lengths": [1024], "depths": [50]}
# Values that replace a JSON field: removed (...), null, each other type, and numbers out of range.
JSON_VALUES: list[Any] = [..., None, "x", "", [], {}, True, -1, 0, 0.5, 10**20, 1e308, float("nan"), float("inf")]
DAMAGED_TEXT = ["", "{", "null", "[]", '"x"', "\x00"]
GRID_COMMANDS = [["sweep", "grid.toml", "--dry-run"]]
SMALL_COMMANDS = [*GRID_COMMANDS, ["sweep", "grid.toml"], ["sweep", "grid.toml", "--slurm", "--dry-run"]]
STORE_COMMANDS = [
    ["report", STORE],
    ["report", STORE, "--faults", "field,bit"],
    ["report", STORE, "--format", "csv"],
    ["report", STORE, "--format", "json"],
    ["replay", STORE, "--item", "0"],
    ["sweep", "grid.toml", "--store", STORE, "--dry-run"],
]
RUN_FILE_COMMANDS = [["report", RUN_FILE], ["report", RUN_FILE, "--format", "json"], ["report", RUN_FILE, "--faults", "field,bit"]]
FOLDER_COMMANDS = [["sweep", FOLDER, "--status"], ["report", FOLDER]]
# An lm-eval task of the user's (--include-path), read by both ways kvinject runs lm-eval.
TASK_DOCS = '{"x": "The cat", "y": " sat"}\n'
TASK = {
    "task": "mine",
    "dataset_path": "json",
    "dataset_kwargs": {"data_files": {"test": "DOCS"}},
    "output_type": "loglikelihood",
    "test_split": "test",
    "doc_to_text": "{{x}}",
    "doc_to_target": "{{y}}",
    "metric_list": [{"metric": "acc"}],
}
TASK_MEANINGS = [
    ("doc_to_text", "!function no_module.fn"),
    ("doc_to_text", "'{{missing.field}}'"),
    ("doc_to_target", "'{{x | no_filter}}'"),
    ("output_type", "generate_until"),
    ("output_type", "loglikelihood_rolling"),
    ("dataset_path", "no_such_builder"),
    ("test_split", "train"),
]
# lm-eval's own --config file, whose values count as the command line's.
LM_EVAL_CONFIG = {"tasks": ["kvinject_nextword"], "limit": 1, "model_args": {"model": MODEL}}
TASK_COMMANDS = [
    ["run", "--bench", "lmeval", "--task", "mine", "--include-path", "tasks", "--limit", "1", "--runs", "1", "--model", MODEL],
    ["lm-eval", "--model_args", f"model={MODEL}", "--tasks", "mine", "--include_path", "tasks", "--limit", "1"],
]
# Whole-store changes: columns and tables gone, another application's or version's header.
STORE_STATEMENTS = [
    "ALTER TABLE runs DROP COLUMN record",
    "ALTER TABLE runs DROP COLUMN settings",
    "ALTER TABLE runs DROP COLUMN created",
    "ALTER TABLE runs DROP COLUMN worker",
    "DROP TABLE claims",
    "DROP TABLE runs",
    "CREATE TABLE other (x)",
    "PRAGMA application_id = 1",
    "PRAGMA user_version = 99",
    "DELETE FROM runs",
    "INSERT INTO runs (cell, run, settings, record) SELECT cell, run + 1, settings, record FROM runs",
    "INSERT INTO claims VALUES ('g', 'host', -1, 't', 'x')",
]
# Values a row's own columns may be given (SQLite keeps what an INTEGER or TEXT column is given).
COLUMN_VALUES: list[Any] = [-1, 10**18, 0.5, "x", "", None, b"\xff"]


@dataclass(frozen=True)
class Case:
    kind: str  # grid, store, run file, run folder, task, lm-eval config
    change: str  # what was changed, as a finding names it
    args: list[str]
    prepare: Callable[[Path], None]  # writes the changed file into the workspace


def toml(document: dict[str, Any], raw: dict[tuple, str] | None = None) -> str:
    """``document`` as TOML: top-level tables and [bench.X] as headers, the rest inline; ``raw``
    puts a value's text at a key path as it is (an adversarial number, which may not be TOML)."""
    raw = raw or {}
    lines: list[str] = []

    def table(header: tuple[str, ...], at: tuple, body: dict[str, Any]) -> None:
        headed = {k: v for k, v in body.items() if header in ((), ("bench",)) and _is_table(v)}
        lines.extend(_pairs({k: v for k, v in body.items() if k not in headed}, at, raw))
        for key, value in headed.items():
            name = ".".join((*header, key))
            if isinstance(value, list):
                for i, one in enumerate(value):
                    lines.append(f"[[{name}]]")
                    table((*header, key), (*at, key, i), one)
            else:
                lines.append(f"[{name}]")
                table((*header, key), (*at, key), value)

    table((), (), document)
    return "\n".join(lines) + "\n"


def _pairs(body: dict[str, Any], at: tuple, raw: dict[tuple, str]) -> list[str]:
    """``key = value`` of each key, and of each key ``raw`` gives text for at ``at``."""
    out = [f"{k} = {raw.get((*at, k)) or _inline(v, (*at, k), raw)}" for k, v in body.items()]
    return out + [f"{key[-1]} = {text}" for key, text in raw.items() if key[:-1] == at and key[-1] not in body]


def _is_table(value: Any) -> bool:
    return isinstance(value, dict) or (isinstance(value, list) and bool(value) and all(isinstance(v, dict) for v in value))


def _inline(value: Any, at: tuple, raw: dict[tuple, str]) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)  # inf and nan are TOML's words too
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_inline(v, (*at, i), raw) for i, v in enumerate(value)) + "]"
    return "{" + ", ".join(_pairs(value, at, raw)) + "}"


def smallest(document: dict[str, Any]) -> dict[str, Any]:
    """A grid on the tiny model at each bench's smallest sizes, one run (a copy)."""
    document = json.loads(json.dumps(document))
    document.setdefault("sweep", {}).update(models=[MODEL], runs=1)
    document["sweep"].pop("margin", None)  # a campaign's margin sets the items, past `limit`
    for name, tables in document.get("bench", {}).items():
        for i, options in enumerate(tables if isinstance(tables, list) else [tables]):
            sizes = {k: v + i if isinstance(v, int) else v for k, v in SIZES.items()}  # tables that differed still differ
            options.update({k: v for k, v in sizes.items() if k in options or (k == "limit" and name in ("nexttoken", "gsm8k", "ifeval"))})
    return document


def grids() -> dict[str, dict[str, Any]]:
    """The valid grids the grid cases start from: the workspace's, then each example's."""
    out = {"grid.toml": tomllib.loads(SMALL)}
    out |= {f"examples/{p.name}": smallest(tomllib.loads(p.read_text())) for p in sorted(EXAMPLES.glob("*.toml"))}
    return out


def key_paths(value: Any, at: tuple = ()) -> Iterator[tuple]:
    """Every key path in a JSON value; of a list, each of its first two elements."""
    if at:
        yield at
    if isinstance(value, dict):
        for k, v in value.items():
            yield from key_paths(v, (*at, k))
    elif isinstance(value, list):
        for i, v in enumerate(value[:2]):
            yield from key_paths(v, (*at, i))


def changed(value: Any, at: tuple, new: Any) -> Any:
    """``value`` with the field at ``at`` set to ``new`` (``...``: removed), a copy."""
    value = json.loads(json.dumps(value))
    parent = value
    for k in at[:-1]:
        parent = parent[k]
    if new is ...:
        del parent[at[-1]]
    else:
        parent[at[-1]] = new
    return value


def swapped(value: Any, other: Any) -> Iterator[tuple[tuple, Any]]:
    """Each field of ``value`` with ``other``'s value of it where that differs: a record whose
    fields contradict one another (another run's label, control flag or items), as no change of
    one field to a value of another type makes."""
    for at in key_paths(value):
        try:
            theirs = _get(other, at)
        except (KeyError, IndexError, TypeError):
            continue
        if theirs != _get(value, at):
            yield at, theirs


def _write(name: str, text: str | bytes, folder: Path) -> None:
    path = folder / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())


def _cases(kind: str, commands: list[list[str]], changes: Iterator[tuple[str, Callable[[Path], None]]]) -> Iterator[Case]:
    """Each change read by one of the commands, in turn: every command meets every field, and a
    field's values are spread over the commands."""
    for i, (change, prepare) in enumerate(changes):
        yield Case(kind, change, commands[i % len(commands)], prepare)


def grid_changes(name: str, document: dict[str, Any]) -> Iterator[tuple[str, Callable[[Path], None]]]:
    """One key at a time: removed, another type, each adversarial number (as TOML text), a list
    with a repeat, an empty item or nothing; an unknown key in each table; the file damaged."""
    yield f"{name} as it is", partial(_write, "grid.toml", toml(document))
    for at in [p for p in key_paths(document) if not isinstance(p[-1], int)]:
        shown = ".".join(map(str, at))
        for new in [..., "x", True, [], {}]:
            yield f"{name} {shown} = {new!r}", partial(_write, "grid.toml", toml(changed(document, at, new)))
        value = _get(document, at)
        if isinstance(value, (list, dict)) and _is_table(value):
            continue  # a table: its keys are changed one by one
        for number in NUMBERS:
            yield f"{name} {shown} = {number}", partial(_write, "grid.toml", toml(changed(document, at, ...), {at: number}))
        items = value if isinstance(value, list) else [value]
        for listed in ([*items, items[0]] if items else [1, 1], [*items, ""], []):
            yield f"{name} {shown} = {listed!r}", partial(_write, "grid.toml", toml(changed(document, at, listed)))
    tables = [()] + [p for p in key_paths(document) if isinstance(_get(document, p), dict)]
    for at in tables:
        bogus = changed(document, (*at, "bogus"), 1) if at else {**document, "bogus": 1}
        yield f"{name} {'.'.join(map(str, at)) or '(top)'}.bogus = 1", partial(_write, "grid.toml", toml(bogus))
    text = toml(document)
    damaged = {
        "cut to half": text[: len(text) // 2],
        "an unclosed string": text + 'x = "\n',
        "a key twice": text.replace("[sweep]", "[sweep]\nruns = 1\nruns = 1", 1),
        "empty": "",
        "not UTF-8": text.encode() + b"\xff\xfe",
    }
    for change, damage in damaged.items():
        yield f"{name} {change}", partial(_write, "grid.toml", damage)


def _get(value: Any, at: tuple) -> Any:
    for k in at:
        value = value[k]
    return value


def grid_cases() -> Iterator[Case]:
    for name, document in grids().items():
        yield from _cases("grid", SMALL_COMMANDS if name == "grid.toml" else GRID_COMMANDS, grid_changes(name, document))


def _store_sql(statement: str, params: tuple, folder: Path) -> None:
    with sqlite3.connect(folder / STORE) as db:
        db.execute(statement, params)
    db.close()  # its WAL checkpointed: the store is one file again


def _store_bytes(cut: Callable[[bytes], bytes], folder: Path) -> None:
    path = folder / STORE
    for sidecar in ("-wal", "-shm"):  # the file alone, as a copy without its sidecars
        Path(f"{path}{sidecar}").unlink(missing_ok=True)
    path.write_bytes(cut(path.read_bytes()))


def store_changes(template: Path) -> Iterator[tuple[str, Callable[[Path], None]]]:
    """One row's settings or record at a time: its text damaged, then each field removed or
    given each JSON value or the other row's value of it; each row's own columns; a column or
    table gone; the file cut short or not SQLite."""
    yield "the store as it is", partial(_store_sql, "SELECT 1", ())
    with sqlite3.connect(f"file:{template / STORE}?mode=ro", uri=True) as db:
        rows = db.execute("SELECT rowid, settings, record FROM runs").fetchall()
    db.close()
    for rowid, *texts in rows:
        for column, text in zip(("settings", "record"), texts):
            for damage in [*DAMAGED_TEXT, text[: len(text) // 2]]:
                yield f"row {rowid} {column} = {damage[:20]!r}", partial(_store_sql, f"UPDATE runs SET {column} = ? WHERE rowid = ?", (damage, rowid))
            document = json.loads(text)
            for at in key_paths(document):
                for new in JSON_VALUES:
                    update = partial(_store_sql, f"UPDATE runs SET {column} = ? WHERE rowid = ?", (json.dumps(changed(document, at, new)), rowid))
                    yield f"row {rowid} {column}.{'.'.join(map(str, at))} = {new!r}", update
            for other, *theirs in rows:
                for at, new in swapped(document, json.loads(dict(zip(("settings", "record"), theirs))[column])) if other != rowid else ():
                    update = partial(_store_sql, f"UPDATE runs SET {column} = ? WHERE rowid = ?", (json.dumps(changed(document, at, new)), rowid))
                    yield f"row {rowid} {column}.{'.'.join(map(str, at))} = row {other}'s", update
        for column in ("cell", "run", "created", "worker"):
            for new in COLUMN_VALUES:
                yield f"row {rowid} {column} = {new!r}", partial(_store_sql, f"UPDATE OR IGNORE runs SET {column} = ? WHERE rowid = ?", (new, rowid))
    for statement in STORE_STATEMENTS:
        yield statement, partial(_store_sql, statement, ())
    cuts = {"cut to half": lambda b: b[: len(b) // 2], "cut to 100 bytes": lambda b: b[:100], "empty": lambda b: b""}
    cuts |= {"not SQLite": lambda b: b"not a store\n", "a page overwritten": lambda b: b[:4096] + b"\xff" * 4096 + b[8192:]}
    for change, cut in cuts.items():
        yield f"store {change}", partial(_store_bytes, cut)


def store_cases(template: Path) -> Iterator[Case]:
    yield from _cases("store", STORE_COMMANDS, store_changes(template))


def _json_field(name: str, make: Callable[[Path], Any], at: tuple, new: Any, folder: Path) -> None:
    (folder / name).write_text(json.dumps(changed(make(folder), at, new), indent=1))


def _json_text(name: str, make: Callable[[Path], Any], damage: Callable[[str], str], folder: Path) -> None:
    path = folder / name
    make(folder)
    path.write_text(damage(path.read_text()))


def json_changes(name: str, shape: Any, make: Callable[[Path], Any]) -> Iterator[tuple[str, Callable[[Path], None]]]:
    """A JSON file that ``make`` writes in the workspace (and returns), one field at a time
    removed or given each JSON value (``shape`` has its fields); then its text damaged."""
    yield f"{name} as it is", partial(_json_text, name, make, lambda text: text)
    for at in key_paths(shape):
        for new in JSON_VALUES:
            yield f"{name} {'.'.join(map(str, at))} = {new!r}", partial(_json_field, name, make, at, new)
    for damage in DAMAGED_TEXT:
        yield f"{name} = {damage!r}", partial(_json_text, name, make, lambda text, damage=damage: damage)
    yield f"{name} cut to half", partial(_json_text, name, make, lambda text: text[: len(text) // 2])


def _read_json(name: str, folder: Path) -> Any:
    return json.loads((folder / name).read_text())


def run_file_cases(template: Path) -> Iterator[Case]:
    shape = _read_json(RUN_FILE, template)
    yield from _cases("run file", RUN_FILE_COMMANDS, [*json_changes(RUN_FILE, shape, partial(_read_json, RUN_FILE)), *_swaps(shape)])


def _swaps(shape: dict[str, Any]) -> Iterator[tuple[str, Callable[[Path], None]]]:
    """Each record's and each configuration's fields given another's, one at a time."""
    read = partial(_read_json, RUN_FILE)
    for key in (("records",), ("meta", "configurations")):
        entries = _get(shape, key)
        for i, mine in enumerate(entries):
            for j, theirs in enumerate(entries):
                for at, new in swapped(mine, theirs) if i != j else ():
                    where = (*key, i, *at)
                    yield f"{RUN_FILE} {'.'.join(map(str, where))} = {'.'.join(key)}[{j}]'s", partial(_json_field, RUN_FILE, read, where, new)


def make_folder(submitted: bool, folder: Path) -> dict[str, Any]:
    """grid.toml's run folder as `sweep --slurm` leaves it after a submission of both tasks (or
    before any), each task's store a copy of STORE; made as kvinject makes it, with no sbatch."""
    from kvinject import __version__
    from kvinject.experiments.slurm import SlurmOptions, SlurmRun

    run = SlurmRun.create(folder / "grid.toml", folder / FOLDER, SlurmOptions(tasks=2))
    if submitted:
        run.submissions.append({"job": "1", "tasks": [0, 1], "time": round(time.time()), "kvinject": __version__})
    run.save()
    for task in range(2):
        shutil.copy(folder / STORE, run.store(task))
    return _read_json(f"{FOLDER}/run.json", folder)


def _folder_then(submitted: bool, change: Callable[[Path], None], folder: Path) -> None:
    make_folder(submitted, folder)
    change(folder)


def _remove(name: str, folder: Path) -> None:
    path = folder / name
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink()


def _replace_with_folder(name: str, folder: Path) -> None:
    _remove(name, folder)
    (folder / name).mkdir()


def folder_changes() -> Iterator[tuple[str, Callable[[Path], None]]]:
    """run.json's fields one at a time, of a run submitted and of one not (which reads its stores,
    the scheduler unasked); each file of the folder removed, made a folder or damaged; its grid too."""
    for submitted in (True, False):
        base = "submitted" if submitted else "not submitted"
        shape = {"grid": "", "tasks": 2, "workdir": "", "max_cells": 1, "submissions": [{"job": "", "tasks": [0, 1], "time": 0, "kvinject": ""}] * submitted}
        for change, prepare in json_changes(f"{FOLDER}/run.json", shape, partial(make_folder, submitted)):
            yield f"{base}: {change}", prepare
        for name in (f"{FOLDER}/job.sh", f"{FOLDER}/logs", f"{FOLDER}/run.json", f"{FOLDER}/shard0of2.results.sqlite", "grid.toml"):
            yield f"{base}: {name} removed", partial(_folder_then, submitted, partial(_remove, name))
            yield f"{base}: {name} a folder", partial(_folder_then, submitted, partial(_replace_with_folder, name))
        for name, text in ((f"{FOLDER}/shard1of2.results.sqlite", "not a store"), (f"{FOLDER}/shard1of2.results.sqlite", ""), ("grid.toml", "[sweep\n")):
            yield f"{base}: {name} = {text!r}", partial(_folder_then, submitted, partial(_write, name, text))


def folder_cases() -> Iterator[Case]:
    yield from _cases("run folder", FOLDER_COMMANDS, folder_changes())


def _task(text: str, folder: Path) -> None:
    """An lm-eval task of ``text`` in the workspace's tasks/, over TASK_DOCS beside it."""
    (folder / "docs.jsonl").write_text(TASK_DOCS)
    (folder / "tasks").mkdir(exist_ok=True)
    (folder / "tasks" / "mine.yaml").write_text(text.replace("DOCS", str(folder / "docs.jsonl")))


def task_changes() -> Iterator[tuple[str, Callable[[Path], None]]]:
    """The task YAML's keys one at a time: removed or given each YAML value; the values whose
    meaning lm-eval checks (a `!function` it cannot import, a template of a missing field, a
    metric or output type it lacks, data it cannot find); then its text damaged."""
    yield "tasks/mine.yaml as it is", partial(_task, yaml.safe_dump(TASK, sort_keys=False))
    for at in key_paths(TASK):
        for new in JSON_VALUES:
            text = yaml.safe_dump(changed(TASK, at, new), sort_keys=False)
            yield f"tasks/mine.yaml {'.'.join(map(str, at))} = {new!r}", partial(_task, text)
    for key, text in TASK_MEANINGS:  # as YAML text: a tag is no value safe_dump writes
        yield f"tasks/mine.yaml {key}: {text}", partial(_task, yaml.safe_dump(changed(TASK, (key,), "@@"), sort_keys=False).replace("'@@'", text))
    for damage in [*DAMAGED_TEXT, "task: [mine\n"]:
        yield f"tasks/mine.yaml = {damage!r}", partial(_task, damage)


def task_cases() -> Iterator[Case]:
    yield from _cases("task", TASK_COMMANDS, task_changes())


def lm_eval_config_changes() -> Iterator[tuple[str, Callable[[Path], None]]]:
    """lm-eval's --config YAML, one key at a time removed or given each YAML value; an option
    of lm-eval's own added; its text damaged."""
    yield "lm-eval.yaml as it is", partial(_write, "lm-eval.yaml", yaml.safe_dump(LM_EVAL_CONFIG))
    for at in key_paths(LM_EVAL_CONFIG):
        # a limit removed, null or past the task's size is the whole task: minutes, and valid
        for new in [v for v in JSON_VALUES if at != ("limit",) or v not in (..., None, 0.5, 10**20, 1e308)]:
            yield f"lm-eval.yaml {'.'.join(map(str, at))} = {new!r}", partial(_write, "lm-eval.yaml", yaml.safe_dump(changed(LM_EVAL_CONFIG, at, new)))
    for key, value in (("model", "hf"), ("model", "bogus"), ("num_fewshot", "1e10"), ("verbosity", "bogus"), ("include_path", "missing")):
        yield f"lm-eval.yaml {key} = {value!r}", partial(_write, "lm-eval.yaml", yaml.safe_dump({**LM_EVAL_CONFIG, key: value}))
    for damage in [*DAMAGED_TEXT, "tasks: [x\n"]:
        yield f"lm-eval.yaml = {damage!r}", partial(_write, "lm-eval.yaml", damage)


def lm_eval_config_cases() -> Iterator[Case]:
    yield from _cases("lm-eval config", [["lm-eval", "--config", "lm-eval.yaml"]], lm_eval_config_changes())


def all_cases(template: Path) -> list[Case]:
    return [*grid_cases(), *store_cases(template), *run_file_cases(template), *folder_cases(), *task_cases(), *lm_eval_config_cases()]


def sample(template: Path, per_kind: int | None = None, seed: int = 0) -> list[Case]:
    """Every case in a fixed shuffled order, or the first ``per_kind`` of each kind in it."""
    cases = all_cases(template)
    random.Random(seed).shuffle(cases)
    if per_kind is None:
        return cases
    kinds: dict[str, list[Case]] = {}
    for case in cases:
        kinds.setdefault(case.kind, []).append(case)
    return [case for group in kinds.values() for case in group[:per_kind]]
