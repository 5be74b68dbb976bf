"""The committed fault campaign's grid, sliced, on the bundled SmolLM2 it ran on: at --parallel 8
every item gets the fault, the tokens and the outcome it gets at --parallel 1, so campaigns run
in parallel (docs/faults.md)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from kvinject.experiments.grid import build_grid
from kvinject.experiments.store import Store
from kvinject.experiments.sweep import Sweep

pytestmark = pytest.mark.slow
GRID = Path(__file__).resolve().parent.parent / "examples" / "fault-campaign.toml"


def sliced(parallel: int) -> dict:
    """The grid with 24 items a configuration, one run, and two bits of each field it maps."""
    raw = tomllib.loads(GRID.read_text())
    raw["sweep"] = {k: v for k, v in raw["sweep"].items() if k != "margin"} | {"parallel": parallel}
    raw["bench"]["nexttoken"]["limit"] = 24
    for entry in raw["errors"]:
        entry["bit"] = [14, 9] if entry.get("field") != "code" else [6, 1]
    return raw


def test_a_slice_of_the_committed_campaign_gives_the_same_outcomes_at_parallel_1_and_8(tmp_path):
    records = {}
    for parallel in (1, 8):
        grid = build_grid(tmp_path / f"p{parallel}.toml", sliced(parallel))
        assert grid.parallel == parallel
        with Store(tmp_path / f"p{parallel}.sqlite") as store:
            Sweep(grid, store).run()
            records[parallel] = {(r["cell"], r["run"]): r for r in store.records()}
    assert records[1].keys() == records[8].keys() and len(records[1]) == 3 + 8  # three golden runs, two bits of four fields
    for key, one in records[1].items():
        eight = records[8][key]
        assert repr((one["items"], one.get("faults"), one.get("outputs"))) == repr((eight["items"], eight.get("faults"), eight.get("outputs"))), one["label"]
    outcomes = {o for r in records[1].values() if r["settings"]["error"] != "none" for o in ("masked", "benign", "sdc", "due") if any(r["items"][o])}
    assert len(outcomes) > 1, "the slice needs faults of different outcomes"
