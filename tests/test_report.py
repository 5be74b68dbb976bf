"""The study table and its terminal parts: which settings become columns or titles, and how."""

import math

import pandas as pd

from kvinject.report import study_table, terminal_tables


def _row(model, sha, label, lengths, n=1, family=None):
    return {
        "model": model,
        "model_sha256": sha,
        "bench": "niah",
        "seed": 0,
        "option.lengths": lengths,
        "option.family": family,
        "metric": "accuracy",
        "label": label,
        "n": n,
        "mean": 0.5,
        "std": 0.0 if n == 1 else 0.1,
        "ci_low": math.nan if n == 1 else 0.4,
        "ci_high": math.nan if n == 1 else 0.6,
        "items_ci": [0.123456, 0.876543],
        "percent_of_control": 100.0,
        "percent_ci": None,
        "test": None,
        "nonfinite_items": 0,
    }


def test_two_models_are_told_apart_by_name_not_by_file_hash():
    rows = [_row("a.gguf", "1" * 12, "none", [1024, 2048]), _row("b.gguf", "2" * 12, "none", [1024, 2048])]
    assert "model_sha256" not in study_table(pd.DataFrame(rows)).columns
    rows.append(_row("a.gguf", "3" * 12, "none", [1024, 2048]))  # the same name, another file
    assert "model_sha256" in study_table(pd.DataFrame(rows)).columns


def test_terminal_parts_name_options_as_the_command_line_writes_them():
    rows = [_row("m.gguf", "1" * 12, "none", [1024, 2048], family="single"), _row("m.gguf", "1" * 12, "x", [1024, 2048, 4096], n=3, family="single")]
    [(title, part)] = terminal_tables(study_table(pd.DataFrame(rows), digits=3))
    assert title == "niah: accuracy, model m.gguf"  # what every row shares; the table keeps what differs
    assert list(part["lengths"]) == ["1024,2048", "1024,2048,4096"] and "option.lengths" not in part.columns
    assert list(part["score"]) == ["0.5", "0.5 ± 0.1"], "one run shows no spread"
    assert list(part["ci_items"]) == ["0.123–0.877"] * 2


def test_a_title_with_nothing_shared_ends_with_the_metric():
    rows = [_row("a.gguf", "1" * 12, "none", [1024]), _row("b.gguf", "2" * 12, "none", [2048])]
    rows[1]["seed"] = 1
    [(title, _)] = terminal_tables(study_table(pd.DataFrame(rows)))
    assert title == "niah: accuracy"
