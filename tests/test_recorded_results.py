"""The benchmarks' results stay bit-identical to those recorded (tests/fixtures/recorded_results.json,
written by tests/recorded_results.py): every metric, per-item value, realized-error statistic,
token count and response. Recorded from commit b20b749, before the benchmark plug-in refactor;
recorded again when the noise generator became kvinject/variates.py, which changed the noisy
configurations' results and left the others' (none, quant, q8_0) bit-identical."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .recorded_results import record

RECORDED = Path(__file__).resolve().parent / "fixtures/recorded_results.json"


def test_results_match_those_recorded_before_the_refactor(tiny):
    recorded = json.loads(RECORDED.read_text())
    now = record(tiny)
    if now["system"] != recorded["system"]:
        pytest.skip(f"recorded on another llama.cpp build or CPU ({recorded['system']})")
    assert now["settings"] == recorded["settings"]
    assert len(now["results"]) == len(recorded["results"])
    for got, want in zip(now["results"], recorded["results"]):
        assert recorded_part(got, want) == want, f"{want['bench']} {want['label']} run {want['run']} differs"


def recorded_part(got: object, want: object) -> object:
    """``got`` with only the dictionary keys that ``want`` has, at every level."""
    if isinstance(got, dict) and isinstance(want, dict):
        return {k: recorded_part(got[k], want[k]) for k in want}
    return got
