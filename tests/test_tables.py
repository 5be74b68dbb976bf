"""`kvinject run`'s terminal tables: what a single run shows, and rows that fit 100 columns."""

import io

from rich.console import Console

from kvinject.tables import bench_table


def _aggregate(label, n, mean, std, ci, percent_ci, p):
    return {
        "bench": "ifeval",
        "label": label,
        "metric": "prompt_level_strict_acc",
        "n": n,
        "mean": mean,
        "std": std,
        "ci_low": ci[0],
        "ci_high": ci[1],
        "items_ci": [0.0455925, 0.699403],
        "percent_of_control": 100 * mean / 0.25,
        "percent_ci": percent_ci,
        "test": None if p is None else {"p_value": p},
        "nonfinite_items": 0,
    }


def test_single_runs_show_no_spread_and_rows_fit_a_terminal():
    aggregates = [
        _aggregate("none", 1, 0.25, 0.0, (float("nan"), float("nan")), None, None),
        _aggregate("normal:0,0.25", 2, 0.125, 0.1767767, (-1.46312, 1.71312), [None, None], 1.0),
        _aggregate("none @q8_0", 1, 0.3125, 0.0, (float("nan"), float("nan")), [81.25, 143.75], 0.5),
    ]
    console = Console(width=100, record=True, file=io.StringIO())
    console.print(bench_table("ifeval", "prompt_level_strict_acc", (), aggregates))
    rows = [line for line in console.export_text().splitlines() if line.startswith("│")]
    assert len(rows) == 3, "a row folded onto a second line"
    cells = [[c.strip() for c in row.strip("│").split("│")] for row in rows]
    assert [c[2] for c in cells] == ["0.25", "0.125 ± 0.18", "0.312"], "one run has no spread to show"
    assert [c[3] for c in cells] == ["-", "-1.46–1.71", "-"]
    assert {c[4] for c in cells} == {"0.0456–0.699"}
    assert [c[6] for c in cells] == ["-", "-", "81.2–143.8"]
    assert [c[7] for c in cells] == ["control", "1", "0.5"]
