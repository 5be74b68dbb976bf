"""What kvinject reads back is checked as it is read (kvinject/experiments/schemas.py): a results
store's rows, `kvinject run --output` files and SLURM run folders. Every field of a real row,
file and run.json is damaged in turn (removed, null, text, a list), and the commands that read
them must either accept it or refuse it in one line that names the file: never a traceback. A
field the analysis reads that no schema checks is found here the day it is added."""

from __future__ import annotations

import contextlib
import json
import shutil
import sqlite3
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.cli_tree import invoke
from tests.fuzz_files import changed

GRID = '[sweep]\nruns = 1\n[bench.nexttoken]\nlimit = 2\n[[errors]]\nspec = "normal:0,0.5"\n'
BROKEN = [None, "x", [], {}]


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory, tiny_path: Path) -> Path:
    """A store of a control and one configuration, and the same runs as a run --output file."""
    folder = tmp_path_factory.mktemp("made")
    grid = folder / "g.toml"
    grid.write_text(GRID.replace("[sweep]", f'[sweep]\nmodels = ["{tiny_path}"]'))
    assert invoke(["sweep", grid, "--store", folder / "s.results.sqlite"])[0] == 0
    code, said = invoke(["run", "-b", "nexttoken", "--limit", "2", "--runs", "1", "-e", "normal:0,0.5", "--model", tiny_path, "-o", folder / "r.json"])
    assert code == 0, said
    return folder


def paths(value: Any, at: tuple = ()) -> Iterator[tuple]:
    """Every key path in a JSON value; of a list, the list and its first element."""
    yield at
    if isinstance(value, dict):
        for k, v in value.items():
            yield from paths(v, (*at, k))
    elif isinstance(value, list) and value:
        yield from paths(value[0], (*at, 0))


def one_line_or_accepted(args: list[object], where: Path) -> None:
    """Exit 0, or 2 with one line (a field the schema refuses: naming ``where``; one the
    analysis finds wanting, such as a control no longer marked one, as it says so)."""
    code, said = invoke(args)  # a traceback is raised here, out of the test
    assert code == 0 or (code == 2 and "\n" not in said.strip()), said
    if code == 2 and ("damaged" in said or "written by kvinject run" in said):
        assert said.startswith(str(where)), said


def test_the_rows_of_the_issue_are_refused_by_report_and_sweep(made, tmp_path):
    """`UPDATE runs SET record='{'` (or 'null', or settings='{}') ended report in a traceback
    while sweep --store took the store as it was."""
    for update in ("record = '{'", "record = 'null'", "settings = '{}'", "record = json_set(record, '$.metrics.accuracy', 'high')"):
        store = tmp_path / "s.results.sqlite"
        shutil.copy(made / "s.results.sqlite", store)
        with sqlite3.connect(store) as db:
            db.execute(f"UPDATE runs SET {update} WHERE rowid = 1")
        for args in (["report", store], ["sweep", made / "g.toml", "--store", store], ["sweep", made / "g.toml", "--store", store, "--dry-run"]):
            code, said = invoke(args)
            assert code == 2 and said.startswith(f"{store}: the run stored as cell ") and "is damaged" in said and "DELETE FROM runs" in said, (update, said)


def test_every_field_of_a_stored_row_damaged_is_accepted_or_refused_in_one_line(made, tmp_path):
    store = tmp_path / "s.results.sqlite"
    with sqlite3.connect(made / "s.results.sqlite") as db:
        rows = db.execute("SELECT rowid, settings, record FROM runs").fetchall()
    for rowid, *columns in rows:
        for column, text in zip(("settings", "record"), columns):
            value = json.loads(text)
            for at in [p for p in paths(value) if p]:
                for broken in [..., *BROKEN]:
                    shutil.copy(made / "s.results.sqlite", store)
                    with sqlite3.connect(store) as db:
                        db.execute(f"UPDATE runs SET {column} = ? WHERE rowid = ?", (json.dumps(changed(value, at, broken)), rowid))
                    one_line_or_accepted(["report", store], store)


def test_every_field_of_a_run_file_damaged_is_accepted_or_refused_in_one_line(made, tmp_path):
    """A `run --output` file edited by hand ("accuracy": "high", a label of no configuration)
    ended report in ValueError or KeyError."""
    document = json.loads((made / "r.json").read_text())
    document["records"] = document["records"][-1:]  # the configuration's: its control is aggregated with it
    edited = tmp_path / "r.json"
    for at in [p for p in paths({"meta": document["meta"], "records": document["records"]}) if p and p[0] != "aggregates"]:
        for broken in [..., *BROKEN, "high"]:
            edited.write_text(json.dumps(changed(document, at, broken)))
            one_line_or_accepted(["report", edited], edited)
    for record, label in ((0, "bogus"), (-1, "none ")):
        edited.write_text(json.dumps(changed(document, ("records", record, "label"), label)))
        code, said = invoke(["report", edited])
        assert code == 2 and "is none of the run's configurations" in said


def test_every_field_of_a_run_folder_damaged_is_refused_in_one_line(made, tmp_path):
    """A damaged run.json ended `sweep DIR --status` in a traceback."""
    folder = tmp_path / "g.slurm"
    folder.mkdir()
    saved = {"grid": str(made / "g.toml"), "tasks": 2, "workdir": str(tmp_path), "max_cells": 5000, "submissions": [{"job": "7", "tasks": [0, 1], "time": 1}]}
    for at in [p for p in paths(saved) if p and p != ("submissions", 0, "time")]:
        for broken in [..., *BROKEN, -1, 9]:
            if broken in (-1, 9) and at not in (("tasks",), ("submissions", 0, "tasks", 0)):
                continue
            (folder / "run.json").write_text(json.dumps(changed(saved, at, broken)))
            code, said = invoke(["sweep", folder, "--status"])  # a sound one ends where the scheduler is asked (none answers here)
            assert code in (0, 2), said  # no submission, or one without its time, is a sound run folder
            out_of_range = {(("tasks",), -1), (("submissions", 0, "tasks", 0), -1), (("submissions", 0, "tasks", 0), 9)}
            # no key may be missing nor any field null; tasks count from 0 to tasks - 1
            missing = broken is ... and not isinstance(at[-1], int)  # a key, not a list's element
            if missing or broken is None or (isinstance(broken, int) and (at, broken) in out_of_range):
                assert said.startswith(f"{folder / 'run.json'}: damaged ("), (at, broken, said)
    for text in ("{", "null", ""):
        (folder / "run.json").write_text(text)
        code, said = invoke(["sweep", folder, "--status"])
        assert code == 2 and said.startswith(f"{folder / 'run.json'}: damaged ("), said


def test_what_the_file_fuzzer_found_is_refused_in_one_line(made, tmp_path):
    """A run file's configuration with its cache a list, a pass/fail item scored 10^20 or 2 (in a run
    file or a store), a record's realized statistics without K's or with a list for a count, its
    faults not a list per item, its run not its row's, a model that is no text, an item with no
    outcome, ended report or replay in a TypeError, KeyError, StopIteration or scipy's
    ValueError; run.json with 10^20 tasks had `sweep DIR --status` count stores for ever."""
    document = json.loads((made / "r.json").read_text())
    edited = tmp_path / "r.json"
    for at, broken, why in (
        (("meta", "configurations", 1, "cache"), [], "meta.configurations[1].cache: [] is not an object"),
        (("meta", "configurations", 1, "error"), "bogus:1", "meta.configurations[1]: no configuration"),
        (("records", 1, "items", "accuracy", 0), 2, "records[1].items.accuracy[0]: 2 is no pass/fail score (0 or 1)"),
        (("records", 1, "items", "accuracy", 0), 0.5, "records[1].items.accuracy[0]: 0.5 is no pass/fail score (0 or 1)"),
        (("records", 1, "items", "accuracy", 0), -1, "records[1].items.accuracy[0]: -1 is no pass/fail score"),
        (("records", 1, "metrics", "bits"), 10**20, "records[1].metrics.bits: 100000000000000000000 is not a number"),
    ):
        edited.write_text(json.dumps(changed(document, at, broken)))
        code, said = invoke(["report", edited])
        assert code == 2 and said.startswith(f"{edited}: not a file written by kvinject run --output") and why in said, said
    store = tmp_path / "s.results.sqlite"
    for update, why in (
        ("record = json_set(record, '$.items.accuracy[0]', 2)", "record.items.accuracy[0]: 2 is no pass/fail score (0 or 1)"),
        ("record = json_set(record, '$.items.accuracy[0]', 0.5)", "record.items.accuracy[0]: 0.5 is no pass/fail score (0 or 1)"),
        ("record = json_set(record, '$.realized', json('{}'))", "record.realized.k is missing"),
        ("record = json_set(record, '$.realized.k.changed', json('[]'))", "record.realized.k.changed: [] is not an integer"),
        ("record = json_set(record, '$.faults', json('[1]'))", "record.faults[0]: 1 is not a list"),
        ("record = json_set(record, '$.outputs', json('[]'))", "record: its lists hold different numbers of items (items.accuracy 2, "),
        ("record = json_set(record, '$.outputs', json('null'))", "record.outputs: null is not a list"),
        ("record = json_remove(json_set(record, '$.faults', json('[[], []]')), '$.outputs')", "record.outputs is missing beside its faults"),
        ("record = json_set(record, '$.run', 7)", "record.run: 7 is not the row's run 0"),
        ("settings = json_set(settings, '$.model', 5)", "settings.model: 5 is not text"),
        ("run = 'x'", "cell '"),
        ("record = json_set(record, '$.items.masked', json('[1, 1]'))", "record.items: benign, sdc, due missing beside masked"),
        (
            "record = json_set(record, " + ", ".join(f"'$.items.{o}', json('[0, 0]')" for o in ("masked", "benign", "sdc", "due")) + ")",
            "record.items: item 0 is not one outcome of masked, benign, sdc, due (masked 0, benign 0, sdc 0, due 0)",
        ),
    ):
        shutil.copy(made / "s.results.sqlite", store)
        with contextlib.closing(sqlite3.connect(store)) as db, db:  # closed: its WAL left with the next copy
            db.execute(f"UPDATE runs SET {update} WHERE rowid = 1")
        code, said = invoke(["report", store])
        assert code == 2 and f"is damaged ({why}" in said, said
    folder = tmp_path / "g.slurm"
    folder.mkdir()
    saved = {"grid": str(made / "g.toml"), "tasks": 10**20, "workdir": str(tmp_path), "max_cells": 5000, "submissions": []}
    (folder / "run.json").write_text(json.dumps(saved))
    code, said = invoke(["sweep", folder, "--status"])
    assert code == 2 and said.startswith(f"{folder / 'run.json'}: damaged (tasks: 100000000000000000000 is not a number of array tasks (1 to 10000))"), said


def test_a_record_is_refused_whose_label_or_items_its_configuration_contradicts(made, tmp_path):
    """A stored record's label edited ('x', '') ended report in a KeyError on the control's label
    or the configuration's; a record without its items (or, not the control, without its
    outcomes) ended replay in a KeyError on 'masked'."""
    store = tmp_path / "s.results.sqlite"
    control, other = "json_extract(settings, '$.control')", "NOT json_extract(settings, '$.control')"
    outcomes = "record.items: masked, benign, sdc, due are missing from a run classified against its control"
    for update, row, why in (
        ("record = json_set(record, '$.label', 'x')", control, 'record.label: "x" is not its configuration\'s label "none"'),
        ("record = json_set(record, '$.label', '')", other, 'record.label: "" is not its configuration\'s label "normal:0,0.5"'),
        ("settings = json_set(settings, '$.label', 'none')", other, 'settings.label: "none" is not its configuration\'s label "normal:0,0.5"'),
        ("record = json_set(record, '$.items', json('{}'))", other, "record.items.accuracy is missing"),
        ("record = json_set(record, '$.items', json_object('accuracy', json_extract(record, '$.items.accuracy')))", other, outcomes),
    ):
        shutil.copy(made / "s.results.sqlite", store)
        with contextlib.closing(sqlite3.connect(store)) as db, db:
            assert db.execute(f"UPDATE runs SET {update} WHERE {row}").rowcount == 1
        for args in (["report", store, "--format", "json"], ["replay", store, "--item", "0"]):
            code, said = invoke(args)
            assert code == 2 and f"is damaged ({why})" in said, (args, said)
    # the same without outcomes, in the control's row, is a control's record as sweep writes it
    shutil.copy(made / "s.results.sqlite", store)
    with contextlib.closing(sqlite3.connect(store)) as db, db:
        assert db.execute(f"SELECT count(*) FROM runs WHERE {control} AND json_extract(record, '$.items.masked') IS NULL").fetchone() == (1,)
    assert invoke(["report", store])[0] == 0
    document = json.loads((made / "r.json").read_text())
    edited = tmp_path / "r.json"
    for at, broken, why in (
        (("meta", "configurations", 1, "label"), "x", 'meta.configurations[1].label: "x" is not its configuration\'s label "normal:0,0.5"'),
        (("records", 1, "items"), {}, "records[1].items.accuracy is missing"),
        (("records", 1, "items"), {"accuracy": document["records"][1]["items"]["accuracy"]}, outcomes.replace("record.", "records[1].")),
    ):
        edited.write_text(json.dumps(changed(document, at, broken)))
        code, said = invoke(["report", edited])
        assert code == 2 and f"{edited}: not a file written by kvinject run --output, or edited since ({why})" in said, said


def first_items(record: dict[str, Any]) -> dict[str, Any]:
    """The record cut to its first item, each of its lists alike (a well-formed record of one item)."""
    cut = {**record, "items": {k: v[:1] for k, v in record["items"].items()}}
    return cut | {k: record[k][:1] for k in ("outputs", "faults") if record.get(k) is not None}


def test_runs_of_one_experiment_that_score_different_items_are_refused(made, tmp_path):
    """A stored run cut to fewer items than its control's ended report in the paired test's
    ValueError ("control and treated must score the same items") and a resumed sweep in
    classify's zip() ValueError."""
    store = tmp_path / "s.results.sqlite"
    shutil.copy(made / "s.results.sqlite", store)
    with contextlib.closing(sqlite3.connect(store)) as db, db:
        rowid, text = db.execute("SELECT rowid, record FROM runs WHERE NOT json_extract(settings, '$.control')").fetchone()
        db.execute("UPDATE runs SET record = ? WHERE rowid = ?", (json.dumps(first_items(json.loads(text))), rowid))
    why = "runs of one model, bench (nexttoken), options and seed hold different numbers of items, which no test can pair: 2 in "
    for args in (["report", store], ["sweep", made / "g.toml", "--store", store, "--dry-run"]):
        code, said = invoke(args)
        assert code == 2 and said.startswith(why) and "1 in " in said and "\n" not in said.strip(), (args, said)
    document = json.loads((made / "r.json").read_text())
    document["records"][1] = first_items(document["records"][1])
    edited = tmp_path / "r.json"
    edited.write_text(json.dumps(document))
    for args in (["report", edited], ["report", edited, made / "s.results.sqlite"]):
        code, said = invoke(args)
        assert code == 2 and said.startswith(why) and f"1 in {edited}: normal:0,0.5 run 0." in said, said


def test_a_sweep_refuses_a_stored_control_whose_data_has_changed_since(tiny_path, tmp_path):
    """A bench's data file grown after its control was stored (same options) ended the resumed
    sweep in classify's zip() ValueError; it is refused before the first decode."""
    data = tmp_path / "d.txt"
    data.write_text("The cat sat on the mat. " * 8)
    grid = tmp_path / "g.toml"
    grid.write_text(f'[sweep]\nruns = 1\nmodels = ["{tiny_path}"]\n[bench.nexttoken]\ndata = "{data}"\n[[errors]]\nspec = "normal:0,0.5"\n')
    store = tmp_path / "s.results.sqlite"
    assert invoke(["sweep", grid, "--store", store])[0] == 0
    data.write_text("The cat sat on the mat. " * 20)
    grid.write_text(grid.read_text() + '[[errors]]\nspec = "normal:0,0.25"\n')
    code, said = invoke(["sweep", grid, "--store", store])
    assert code == 2 and said.startswith("nexttoken: the control's stored run scored ") and "the data changed since the store was written" in said, said
