"""The benchmarks' results stay bit-identical to those recorded (tests/fixtures/recorded_results*.json,
written by tests/recorded_results.py): every metric, per-item value, realized-error statistic,
token count and response. Recorded from commit b20b749, before the benchmark plug-in refactor;
recorded again when the noise generator became kvinject/engine/variates.py, which changed the noisy
configurations' results and left the others' (none, quant, q8_0) bit-identical; the AVX2 one again
when chat prompts became the model's own Jinja template (ifeval's prompts gained the template's
system turn; nexttoken's and perplexity's results bit-identical to the recording before). A CPU's kernels
round in their own way, so each recording holds for the CPU it was made on: the AVX2 one above
(recorded_results.json), and an AVX-512/AMX one made at commit eebacc5 (recorded_results.avx512.json),
which guards from there on without a check against the AVX2 one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvinject.engine.model import versions

from .recorded_results import record

RECORDINGS = sorted((Path(__file__).resolve().parent / "fixtures").glob("recorded_results*.json"))


def test_results_match_those_recorded_before_the_refactor(tiny):
    # Another CPU's kernels (AVX-512 against AVX2) round differently: bit-identity holds only on
    # the build and CPU a recording was made on; elsewhere the minute of recording is not spent.
    system = versions()["llama_cpp_system"]
    recorded = next((r for r in map(json.loads, (p.read_text() for p in RECORDINGS)) if r["system"] == system), None)
    if recorded is None:
        pytest.skip(f"recorded on other llama.cpp builds or CPUs, not on this one ({system})")
    now = record(tiny)
    assert now["settings"] == recorded["settings"]
    assert len(now["results"]) == len(recorded["results"])
    for got, want in zip(now["results"], recorded["results"]):
        assert recorded_part(got, want) == want, f"{want['bench']} {want['label']} run {want['run']} differs"


def recorded_part(got: object, want: object) -> object:
    """``got`` with only the dictionary keys that ``want`` has, at every level."""
    if isinstance(got, dict) and isinstance(want, dict):
        return {k: recorded_part(got[k], want[k]) for k in want}
    return got
