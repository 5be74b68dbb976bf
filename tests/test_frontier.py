"""The quality-versus-memory frontier: the Pareto front, compressor families, and
`kvinject report --frontier` on a sweep of the tiny model."""

import io
import json
import math
import sqlite3

import numpy as np
import pandas as pd
import pytest

from kvinject.analysis.plots import family, interval
from kvinject.experiments.allocation import pareto

from .cli_runs import PNG, kvinject, swept


def dominated(i: int, bits: np.ndarray, score: np.ndarray) -> bool:
    """Point i is beaten by another with no more bits and a better score, or equal score and fewer bits."""
    return any(bits[j] <= bits[i] and score[j] >= score[i] and (bits[j] < bits[i] or score[j] > score[i]) for j in range(len(bits)) if j != i)


@pytest.mark.parametrize("seed", range(5))
def test_pareto_keeps_exactly_the_undominated_points(seed: int) -> None:
    rng = np.random.default_rng(seed)
    bits = rng.choice([4.25, 4.5, 5.0, 8.0, 8.5, 16.0], 12)
    score = rng.integers(0, 6, 12).astype(float)
    front = pareto(bits, score, higher_is_better=True)
    expected = {i for i in range(12) if not dominated(i, bits, score)}
    # Identical points: the front keeps one of them.
    assert {(bits[i], score[i]) for i in front} == {(bits[i], score[i]) for i in expected}
    assert list(bits[front]) == sorted(bits[front])
    flipped = pareto(bits, -score, higher_is_better=False)
    assert {(bits[i], score[i]) for i in flipped} == {(bits[i], score[i]) for i in expected}


@pytest.mark.parametrize(
    "label,expected",
    [
        ("none", "none"),
        ("none @q4_0", "native q4_0"),
        ("none @f16/q8_0", "native f16/q8_0"),
        ("quant:4,group=32", "quant"),
        ("float:e4m3,block=0 [v:all]", "float"),
        ("evict:h2o,0.5,recent=0.5", "evict h2o"),
        ("evict:window,256 @q8_0", "evict window"),
    ],
)
def test_family_of_a_label(label: str, expected: str) -> None:
    assert family(label) == expected


GRID = """
[sweep]
models = ["{model}"]
runs = 1

[bench.perplexity]
ctx = 64
chunks = 2

[[errors]]
spec = ["quant:4", "float:e4m3", "none@q8_0"]
"""


def test_report_draws_the_frontier_of_a_sweep(tmp_path, tiny_path):
    store = swept(tmp_path, GRID.format(model=tiny_path))
    png = tmp_path / "frontier.png"
    out = kvinject("report", store, "--frontier", png, "--all-metrics", "--format", "csv")
    assert out.returncode == 0, out.stderr
    assert png.read_bytes()[:8] == PNG
    table = pd.read_csv(io.StringIO(out.stdout))
    bits = table[table["metric"] == "bits"].set_index("label")["mean"].to_dict()
    assert bits == {"none": 16, "quant:4,group=32": 4.5, "float:e4m3,block=0": 8, "none @q8_0": 8.5}


def test_frontier_names_a_store_without_bits(tmp_path):
    from kvinject.analysis.plots import frontier
    from kvinject.exceptions import KvinjectError

    df = pd.DataFrame([{"model": "m", "bench": "perplexity", "label": "none", "metric": "ppl", "mean": 10.0, "ci_low": 9.0, "ci_high": 11.0}])
    with pytest.raises(KvinjectError, match="--frontier needs the bits per element"):
        frontier(df, tmp_path / "f.png")


METRIC_GRID = """
[sweep]
models = ["{model}"]
runs = 1

[bench.nexttoken]
limit = 12

[[errors]]
spec = ["normal:0,0.5", "none@q4_0"]
"""


def test_report_metric_tabulates_and_draws_another_metric(tmp_path, tiny_path):
    store = swept(tmp_path, METRIC_GRID.format(model=tiny_path))
    png = tmp_path / "frontier.png"
    out = kvinject("report", store, "--metric", "token_match", "--frontier", png, "--format", "csv")
    assert out.returncode == 0, out.stderr
    assert png.read_bytes()[:8] == PNG
    table = pd.read_csv(io.StringIO(out.stdout)).set_index("configuration")
    with sqlite3.connect(store) as db:
        stored = {
            json.loads(s)["label"]: json.loads(r)["metrics"]["token_match"] for s, r in db.execute("select settings, record from runs") if "token_match" in r
        }
    assert set(table["metric"]) == {"token_match"} and len(stored) == 2  # the control has nothing to match
    assert table["score"].to_dict() == pytest.approx(stored)
    out = kvinject("report", store, "--metric", "tokens_matched")
    assert out.returncode == 2 and "--metric tokens_matched: these benches report" in out.stderr and "token_match" in out.stderr
    assert "Traceback" not in out.stderr


def test_a_single_run_s_interval_is_the_bootstrap_over_items():
    """Deterministic compressors run once: their points carry the interval over items, a noisy
    configuration's the interval across runs; a row with neither has none."""
    runs = pd.Series({"ci_low": 0.2, "ci_high": 0.4, "items_ci": [0.1, 0.5]})
    once = pd.Series({"ci_low": np.nan, "ci_high": np.nan, "items_ci": [0.1, 0.5]})
    neither = pd.Series({"ci_low": np.nan, "ci_high": np.nan, "items_ci": None})
    assert interval(runs) == (0.2, 0.4) and interval(once) == (0.1, 0.5)
    assert all(np.isnan(interval(neither)))


def test_a_frontier_draws_percent_of_control_with_its_paired_interval_where_there_is_one():
    from kvinject.analysis.plots import frontier_points

    # The compressors study's control and kvquant:4 (docs/results-compressors.md): their intervals
    # over chunks overlap wholly, the paired one of percent of control does not reach 100.
    rows = pd.DataFrame(
        [
            {"mean": 9.910, "ci_low": None, "ci_high": None, "items_ci": [8.59, 11.29], "percent_of_control": None, "percent_ci": None},
            {"mean": 10.069, "ci_low": None, "ci_high": None, "items_ci": [8.72, 11.47], "percent_of_control": 101.6, "percent_ci": [101.0, 102.2]},
        ]
    )
    relative, y, bounds = frontier_points(rows)
    assert relative and y.tolist() == [100.0, 101.6]
    assert math.isnan(bounds[0][0]) and bounds[1] == (101.0, 102.2)
    # KLD and the like have no percent of control: the score with its interval.
    absolute = rows.assign(percent_of_control=None, percent_ci=None)
    relative, y, bounds = frontier_points(absolute)
    assert not relative and y.tolist() == [9.910, 10.069] and bounds[1] == (8.72, 11.47)
