"""docs/performance.md's tables and README.md's performance figures are generated from
perf/measurements.json by perf/measurements.py: regenerating them changes nothing, the README
shows the file's figures, and the perf/ scripts' ``--record`` upserts an entry by its key."""

import argparse
import copy
import datetime
import importlib.util
import json
import re
import shlex
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("measurements", ROOT / "perf" / "measurements.py")
measurements = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(measurements)


def _readme_keys() -> list[str]:
    text = (ROOT / "README.md").read_text()
    return [key for _, selection, _, _ in measurements.GENERATED.findall(text) if selection.startswith("brief") for key in shlex.split(selection)[1:]]


@pytest.mark.parametrize("page", ["docs/performance.md", "README.md"])
def test_generated_figures_are_what_the_file_gives(page):
    text = (ROOT / page).read_text()
    assert measurements.GENERATED.search(text), f"{page} has no generated figures"
    assert measurements.regenerate(text, measurements.load()) == text, f"{page} is not what perf/measurements.json gives: run python perf/measurements.py"


def test_the_page_shows_every_measurement_in_its_table():
    text = (ROOT / "docs" / "performance.md").read_text()
    tables = {selection: table for _, selection, table, _ in measurements.GENERATED.findall(text)}
    assert set(tables) == {"cpu", "gpu"}
    entries = measurements.load()
    for e in entries:
        assert f"| {e['comparison']} | {measurements.ratio(e)} | {e['n']} |" in tables[e["table"]], e["key"]
    assert sum(len(t.strip().splitlines()) - 2 for t in tables.values()) == len(entries)  # a header and a rule each, a row per entry


def test_the_readme_figures_follow_the_file():
    """Change any figure the README shows in the file and the regenerated README changes with it."""
    readme, entries = (ROOT / "README.md").read_text(), measurements.load()
    keys = _readme_keys()
    assert {k.split()[0] for k in keys} == {"cpu", "gpu"}
    for key in keys:
        changed = copy.deepcopy(entries)
        next(e for e in changed if e["key"] == key)["value"] = "9.876"
        assert "9.876" not in readme and "9.876" in measurements.regenerate(readme, changed), key


def test_entries_are_complete():
    entries = measurements.load()
    assert len({e["key"] for e in entries}) == len(entries)
    for e in entries:
        assert e["key"].startswith(e["table"] + " ") and e["table"] in ("cpu", "gpu")
        float(e["value"])
        assert e["spread"] is None or (len(e["spread"]) == 2 and float(e["spread"][0]) <= float(e["value"]) <= float(e["spread"][1])), e["key"]
        assert isinstance(e["n"], int) and e["n"] >= 1
        assert e["target"] is None or re.fullmatch(r"(>=|<=)\d+(\.\d+)?", e["target"]), e["key"]
        datetime.date.fromisoformat(e["date"])
        assert e["commit"] and e["machine"] and re.match(r"(python|bash) perf/", e["command"]), e["key"]


def test_met_compares_the_ratio_with_its_target():
    assert measurements.met({"value": "0.948", "target": ">=0.95"}) == "**missed**"
    assert measurements.met({"value": "0.95", "target": ">=0.95"}) == "met"
    assert measurements.met({"value": "0.70", "target": "<=1.1"}) == "met"
    assert measurements.met({"value": "1.2", "target": "<=1.1"}) == "**missed**"
    assert measurements.met({"value": "1.2", "target": None}) == ""


def test_record_upserts_an_entry_by_key(tmp_path, monkeypatch):
    file = tmp_path / "measurements.json"
    kept = {"comparison": "worded by hand", "target": ">=0.9"}
    file.write_text(json.dumps([{"key": "cpu decode x", "table": "cpu", **kept, "value": "0.5", "spread": None, "n": 1, "date": "2000-01-01"}]))
    monkeypatch.setattr(measurements, "FILE", file)
    monkeypatch.setattr(sys, "argv", ["perf/hook_overhead.py", "--steps", "10", "--record", "--machine", "box"])
    args = argparse.Namespace(record=True, machine="box")
    measurements.record(args, "cpu", "decode x", "from the script", [0.97, 0.95, 0.99])
    measurements.record(args, "gpu", "decode x", "a new one", [1.1])
    measurements.record(argparse.Namespace(record=False, machine=None), "cpu", "decode y", "not asked for", [1.0])
    old, new = json.loads(file.read_text())
    today = datetime.datetime.now(datetime.timezone.utc).date().isoformat()
    assert old == {"key": "cpu decode x", "table": "cpu", **kept, "value": "0.970", "spread": ["0.950", "0.990"], "n": 3, "date": today} | {
        "commit": old["commit"],
        "machine": "box",
        "command": "python perf/hook_overhead.py --steps 10",
    }
    assert (new["key"], new["comparison"], new["target"], new["value"], new["spread"], new["n"]) == ("gpu decode x", "a new one", None, "1.100", None, 1)
