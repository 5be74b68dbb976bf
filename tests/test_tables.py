"""`kvinject run`'s terminal tables: what a single run shows, and rows that fit 100 columns."""

import io

from rich.console import Console

from kvinject.analysis.tables import bench_table, print_width


def _aggregate(label, n, mean, std, ci, items_ci, percent_ci, p):
    return {
        "bench": "ifeval",
        "label": label,
        "configuration": label,
        "control": label == "none",
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


def test_long_configurations_fold_and_the_interval_across_runs_makes_room():
    labels = ["none", "kvquant:4,site=post-rope,outliers=0.01,sinks=4,calib=512", "evict:streaming,0.5,sinks=4", "bitflip:0.001,field=exponent"]
    aggregates = [_aggregate(label, 2, 0.2, 0.0707, (-0.43531, 0.83531), [0.0615, 0.79214], [50.0, 100.0], 0.157) | {"nonfinite_items": 1} for label in labels]
    console = Console(width=100, record=True, file=io.StringIO())
    console.print(bench_table("ifeval", "prompt_level_strict_acc", (), aggregates, width=100))
    text = console.export_text()
    assert max(map(len, text.splitlines())) <= 100
    numbers = [[c.strip() for c in row.strip("│").split("│")[1:]] for row in text.splitlines() if row.startswith("│")]
    assert [row for row in numbers if row[0]] == [["2", "0.2 ± 0.071", "0.0615–0.792", "57.1", "50.0–100.0", "control", "1"]] + [
        ["2", "0.2 ± 0.071", "0.0615–0.792", "57.1", "50.0–100.0", "0.157", "1"]
    ] * 3, "every number whole on its row, the NaN count kept"
    assert "--wide adds CI runs" in text


def test_numbers_never_fold_and_a_table_too_wide_for_them_prints_wider():
    labels = ["none", "kvquant:4,site=post-rope,outliers=0.01,sinks=4,calib=512"]
    aggregates = [_aggregate(label, 5, 0.0178, 0.0049, (0.0118, 0.0238), [0.0136, 0.0224], [4.9, 8.0], 4.7e-52) for label in labels]
    table = bench_table("ifeval", "prompt_level_strict_acc", (), aggregates, width=100)
    numbers = ["0.0178 ± 0.0049", "0.0136–0.0224", "4.9–8.0", "4.7e-52"]
    for width in (60, 100):
        shown = print_width(table, width)
        console = Console(width=shown, record=True, file=io.StringIO())
        console.print(table)
        text = console.export_text()
        assert all(number in text for number in numbers), f"a number split at {width} columns"
        assert max(map(len, text.splitlines())) <= shown
    assert print_width(table, 100) == 100 and print_width(table, 60) > 60, "wider than 60 columns only where it must be"
