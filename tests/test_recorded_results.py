"""The benchmarks' results stay bit-identical to those recorded (tests/fixtures/recorded_results*.json,
written by tests/recorded_results.py): every metric, per-item value, realized-error statistic,
token count and response. A CPU's kernels round in their own way, so each recording holds for the
llama.cpp build and CPU it was made on, which llama.cpp's system string names:

- recorded_results.json, AVX2 (a portable build: AVX2, FMA and F16C, no AVX-512), recorded at
  efcc7c1 on a 2-core Intel Xeon @ 2.50GHz, numba compiling for Haswell (NUMBA_CPU_NAME). Every
  token, response and metric equals the AVX2 recording made on an AVX2 machine at d79959d; the
  realized statistics do not since 86006a7, which decodes a generation step in one decode per run
  of consecutive sequences (more cache writes, ``sites``, summed in other groups);
- recorded_results.avx512.json, AVX-512 and VNNI (the native build on that Xeon), at efcc7c1. It
  holds, every value, for the native build on a 2-core Intel Xeon with AVX-512 BF16 and
  AVX-VNNI too (the system string in its ``also_on``), checked at a56a304 on 2026-11-29;
- recorded_results.amx.json, AVX-512 with AMX, made at eebacc5: every token, response and metric
  equals the AVX-512 recording's; its realized statistics, from before 86006a7, are left out."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from kvinject.engine.model import versions

from .recorded_results import record

RECORDINGS = sorted((Path(__file__).resolve().parent / "fixtures").glob("recorded_results*.json"))


def test_results_match_those_recorded(tiny):
    # Another CPU's kernels (AVX-512 against AVX2) round differently: bit-identity holds only on
    # the build and CPU a recording was made on; elsewhere the minute of recording is not spent.
    system = versions()["llama_cpp_system"]
    recorded = next((r for r in map(json.loads, (p.read_text() for p in RECORDINGS)) if system in (r["system"], *r.get("also_on", ()))), None)
    if recorded is None:
        pytest.skip(f"recorded on other llama.cpp builds or CPUs, not on this one ({system})")
    now = record(tiny)
    assert now["settings"] == recorded["settings"]
    assert len(now["results"]) == len(recorded["results"])
    for got, want in zip(now["results"], recorded["results"]):
        where = first_difference(got, want)
        assert where is None, f"{want['bench']} {want['label']} run {want['run']} differs at {where}"


# llama.cpp's outputs (tokens, responses, counts) must be identical on the build and CPU a
# recording was made on; the statistics derived from them in float64 may differ in their last
# bits: numpy sums in blocks whose width follows the CPU's SIMD (AVX2 or AVX-512), so
# mean_dp2 read 1.6073204058375155e-10 against ...158e-10 on an AVX-512 machine. 1e-12 relative
# is a thousand times those few ulps and far below any digit a table or test reads.
FLOAT_RTOL = 1e-12
# The realized statistics are float64 sums of float32 values (each K or V value, its change,
# their ratio). On an AVX-512 machine running a portable wheel whose system string matches the
# AVX2 recording, rel_err_mean read 0.004091052604777755 against 0.004091052580182162 (6e-9
# relative), the first value that differed: summed values that differ in their last float32 bit
# move a sum so. One float32 ulp of every value summed, 2**-23 relative, bounds it; tokens,
# responses and counts are still compared exactly.
REALIZED_RTOL = 2**-23


def first_difference(got: object, want: object, path: str = "") -> str | None:
    """Where ``got`` differs from ``want`` (only the keys ``want`` has, at every level), or None."""
    if isinstance(want, dict):
        if not isinstance(got, dict):
            return path or "/"
        for k in want:
            if k not in got:
                return f"{path}/{k} (missing)"
            where = first_difference(got[k], want[k], f"{path}/{k}")
            if where is not None:
                return where
        return None
    if isinstance(want, list):
        if not isinstance(got, list) or len(got) != len(want):
            return f"{path} (length)"
        return next((w for i, (g, x) in enumerate(zip(got, want)) if (w := first_difference(g, x, f"{path}[{i}]")) is not None), None)
    if isinstance(want, float) and isinstance(got, float) and not isinstance(want, bool):
        tolerance = REALIZED_RTOL if path.startswith("/realized/") else FLOAT_RTOL
        same = got == want or (math.isnan(got) and math.isnan(want)) or math.isclose(got, want, rel_tol=tolerance)
        return None if same else f"{path} ({got!r} != {want!r})"
    return None if got == want else f"{path} ({got!r} != {want!r})"


def test_first_difference_tolerates_only_the_last_bits_of_floats():
    recorded = {"metrics": {"mean_dp2": 1.6073204058375158e-10, "ppl": 7.97}, "tokens": [1, 2], "text": "a"}
    assert first_difference({**recorded, "metrics": {"mean_dp2": 1.6073204058375155e-10, "ppl": 7.97}, "extra": 1}, recorded) is None
    off = first_difference({**recorded, "metrics": {"mean_dp2": 1.6073e-10, "ppl": 7.97}}, recorded)
    assert off == "/metrics/mean_dp2 (1.6073e-10 != 1.6073204058375158e-10)"
    assert first_difference({**recorded, "tokens": [1, 3]}, recorded) == "/tokens[1] (3 != 2)"
    realized = {"realized": {"k": {"rel_err_mean": 0.004091052580182162}}}
    assert first_difference({"realized": {"k": {"rel_err_mean": 0.004091052604777755}}}, realized) is None
    assert first_difference({"realized": {"k": {"rel_err_mean": 0.0040911}}}, realized) is not None
    assert first_difference({**recorded, "text": "b"}, recorded) is not None
