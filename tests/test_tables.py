"""`kvinject run`'s terminal tables: what a single run shows, and rows that fit 100 columns."""

import io

from rich.console import Console

from kvinject.tables import bench_table


def _aggregate(label, n, mean, std, ci, items_ci, percent_ci, p):
    return {
        "bench": "ifeval",
        "label": label,
        "metric": "prompt_level_strict_acc",
        "n": n,
        "mean": mean,
        "std": std,
        "ci_low": ci[0],
        "ci_high": ci[1],
        "items_ci": items_ci,
        "percent_of_control": 100 * mean / 0.35,
        "percent_ci": percent_ci,
        "test": None if p is None else {"p_value": p},
        "nonfinite_items": 0,
    }


def test_single_runs_show_no_spread_and_rows_fit_a_terminal():
    aggregates = [
        # The README's first command's IFEval table, which had folded its labels at 100 columns.
        _aggregate("none", 1, 0.35, 0.0, (float("nan"), float("nan")), [0.18118, 0.56711], None, None),
        _aggregate("normal:0,0.25", 2, 0.15, 0.0707107, (-0.48531, 0.78531), [0.025, 0.275], [11.1111, 100.0], 0.1149),
        _aggregate("none @q8_0", 1, 0.4, 0.0, (float("nan"), float("nan")), [0.21881, 0.61335], [81.25, 143.75], 0.5),
    ]
    console = Console(width=100, record=True, file=io.StringIO())
    console.print(bench_table("ifeval", "prompt_level_strict_acc", (), aggregates))
    rows = [line for line in console.export_text().splitlines() if line.startswith("│")]
    assert len(rows) == 3, "a row folded onto a second line"
    cells = [[c.strip() for c in row.strip("│").split("│")] for row in rows]
    assert [c[2] for c in cells] == ["0.35", "0.15 ± 0.071", "0.4"], "one run has no spread to show"
    assert [c[3] for c in cells] == ["-", "-0.485–0.785", "-"]
    assert [c[4] for c in cells] == ["0.181–0.567", "0.025–0.275", "0.219–0.613"]
    assert [c[6] for c in cells] == ["-", "11.1–100.0", "81.2–143.8"]
    assert [c[7] for c in cells] == ["control", "0.115", "0.5"]
