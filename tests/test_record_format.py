"""Record formats (kvinject/record_format.py): what a store writes carries its format and
kvinject's version, a store of kvinject 0.1.0 (records without them) is read, reported and
resumed unchanged, and docs/grid-format.md lists the formats the code knows."""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path

import pytest

from kvinject import __version__
from kvinject.analysis.report import load_records, summarize
from kvinject.exceptions import KvinjectError
from kvinject.experiments.grid import load_grid
from kvinject.experiments.store import Store
from kvinject.experiments.sweep import Sweep
from kvinject.record_format import FORMATS, RECORD_FORMAT

from .stored import RECORD, SETTINGS

ROOT = Path(__file__).resolve().parent.parent

GRID = """
[sweep]
models = ["{model}"]
runs = {runs}

[bench.nexttoken]
limit = 3

[[errors]]
spec = ["normal:0,0.5"]
"""


def sweep(tmp_path: Path, model: Path, runs: int) -> Path:
    grid, path = tmp_path / "grid.toml", tmp_path / "grid.results.sqlite"
    grid.write_text(GRID.format(model=model, runs=runs))
    with Store(path) as store:
        Sweep(load_grid(grid), store).run()
    return path


def rows(path: Path) -> dict[tuple[str, int], str]:
    with sqlite3.connect(path) as db:
        out = {(cell, run): record for cell, run, record in db.execute("SELECT cell, run, record FROM runs")}
    db.close()
    return out


def test_a_stored_record_carries_its_format_and_kvinject_s_version(tmp_path):
    with Store(tmp_path / "s.sqlite") as store:
        store.add("cell", 0, dict(SETTINGS), dict(RECORD))
        (record,) = store.records()
    assert (record["format"], record["kvinject"]) == (RECORD_FORMAT, __version__)


def test_a_store_of_kvinject_0_1_0_is_read_reported_and_resumed_unchanged(tmp_path, tiny_path):
    path = sweep(tmp_path, tiny_path, runs=1)
    stamped = summarize(load_records([path]))
    # As kvinject 0.1.0 wrote it: the same records without their format and version.
    with sqlite3.connect(path) as db:
        db.execute("UPDATE runs SET record = json_remove(record, '$.format', '$.kvinject')")
    db.close()
    old = rows(path)
    assert old and not any('"format"' in r or '"kvinject"' in r for r in old.values())
    assert summarize(load_records([path])).equals(stamped)
    sweep(tmp_path, tiny_path, runs=1)  # resumed: nothing left, nothing written
    assert rows(path) == old
    sweep(tmp_path, tiny_path, runs=2)  # more runs: the old records stay as they were
    now = rows(path)
    assert {k: now[k] for k in old} == old
    added = [r for r in load_records([path]) if (r["cell"], r["run"]) not in old]
    assert added and all((r["format"], r["kvinject"]) == (RECORD_FORMAT, __version__) for r in added)


def test_the_docs_list_every_record_format():
    page = (ROOT / "docs" / "grid-format.md").read_text()
    table = {int(n): what for n, what in re.findall(r"^\| (\d+) \| [^|]+ \| (.+) \|$", page, re.MULTILINE)}
    assert table == FORMATS
    assert max(FORMATS) == RECORD_FORMAT


def test_a_run_output_of_kvinject_0_1_0_without_options_says_to_run_again(tmp_path):
    path = tmp_path / "results.json"
    meta = {"model": "m.gguf", "model_sha256": "0" * 64, "seed": 0, "configurations": [{"label": "none", "error": "none"}]}
    path.write_text(json.dumps({"meta": meta, "records": []}))
    with pytest.raises(KvinjectError, match="written by kvinject 0.1.0 before `run --output` recorded the benches' options.*run it again"):
        load_records([path])
