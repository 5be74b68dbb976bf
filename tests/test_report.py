"""The study table and its terminal parts: which settings become columns or titles, and how."""

import io
import json
import math

import pandas as pd
import pytest

from kvinject.analysis.plots import bits_column, plot, score_range
from kvinject.analysis.report import experiments, render, select, study_table, terminal_tables
from kvinject.error_models.configuration import Configuration
from kvinject.exceptions import KvinjectError

from .cli_runs import kvinject, swept


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
        "configuration": label,
        "control": label == "none",
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


def test_files_of_one_name_from_two_folders_get_a_table_each_named_by_hash():
    rows = [_row(path, sha, label, [1024]) for path, sha in (("/a/m.gguf", "1" * 12), ("/b/m.gguf", "2" * 12)) for label in ("none", "x")]
    parts = terminal_tables(study_table(pd.DataFrame(rows)))
    assert [title for title, _ in parts] == [f"niah: accuracy, model m.gguf, model_sha256 {sha}" for sha in ("1" * 12, "2" * 12)]
    assert all(list(part["configuration"]) == ["none", "x"] for _, part in parts)
    titles = [title for title, _ in experiments(pd.DataFrame(rows))]
    assert titles == [f"m.gguf: niah, model_sha256 {sha}" for sha in ("1" * 12, "2" * 12)], "figure panels told apart too"


def test_terminal_parts_name_options_as_the_command_line_writes_them():
    rows = [_row("m.gguf", "1" * 12, "none", [1024, 2048], family="single"), _row("m.gguf", "1" * 12, "x", [1024, 2048, 4096], n=3, family="single")]
    [(title, part)] = terminal_tables(study_table(pd.DataFrame(rows), digits=3))
    assert title == "niah: accuracy, model m.gguf"  # what every row shares; the table keeps what differs
    assert list(part["lengths"]) == ["1024,2048", "1024,2048,4096"] and "option.lengths" not in part.columns
    assert list(part["score"]) == ["0.5", "0.5 ± 0.1"], "one run shows no spread"
    assert list(part["ci_items"]) == ["0.123–0.877"] * 2


def test_each_model_gets_its_own_terminal_table_titled_by_what_its_rows_share():
    rows = [_row("a.gguf", "1" * 12, "none", [1024]), _row("a.gguf", "1" * 12, "x", [2048], n=3), _row("b.gguf", "2" * 12, "none", [2048])]
    rows[1]["seed"] = 1
    parts = terminal_tables(study_table(pd.DataFrame(rows)))
    assert [title for title, _ in parts] == ["niah: accuracy, model a.gguf", "niah: accuracy, model b.gguf, seed 0, lengths 2048"]
    first = parts[0][1]
    assert list(first["seed"]) == [0, 1] and list(first["lengths"]) == ["1024", "2048"], "what differs stays a column"
    assert "ci_runs" not in first.columns and "% ctl" in first.columns, "the interval across runs is --wide's"


def _experiments(models, benches, lengths=(1024,)):
    return [
        {**_row(model, sha, label, list(lengths)), "bench": bench, "mean": mean, "realized_k_rel_std": std}
        for model, sha in models
        for bench in benches
        for label, mean, std in (("none", 0.5, None), ("normal:0,0.25", 0.4, 0.25), ("normal:0,0.5", 0.3, 0.5))
    ]


def test_each_experiment_is_a_panel_against_its_own_control(tmp_path):
    rows = _experiments([("a.gguf", "1" * 12), ("b.gguf", "2" * 12)], ["niah", "passkey"])
    panels = experiments(pd.DataFrame(rows))
    assert [title for title, _ in panels] == ["a.gguf: niah", "a.gguf: passkey", "b.gguf: niah", "b.gguf: passkey"]
    for title, part in panels:
        assert list(part["label"]) == ["none", "normal:0,0.25", "normal:0,0.5"], "the control first, once"
        assert part["model"].nunique() == part["bench"].nunique() == 1
    # The same model and bench with other options is another experiment, titled by what differs.
    rows += _experiments([("a.gguf", "1" * 12)], ["niah"], lengths=(2048,))
    titles = [title for title, _ in experiments(pd.DataFrame(rows))]
    assert titles == ["a.gguf: niah, lengths 1024", "a.gguf: passkey", "b.gguf: niah, lengths 1024", "b.gguf: passkey", "a.gguf: niah, lengths 2048"]
    png = tmp_path / "curves.png"
    plot(pd.DataFrame(rows).assign(metric="accuracy"), png)  # five panels on a grid of six
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_frontier_takes_each_experiments_own_bits():
    rows = _experiments([("a.gguf", "1" * 12)], ["niah"], lengths=(1024,)) + _experiments([("a.gguf", "1" * 12)], ["niah"], lengths=(4096,))
    bits = [{**row, "metric": "bits", "mean": 16.0 if row["label"] == "none" else 1024 / row["option.lengths"][0]} for row in rows]
    df = pd.DataFrame(rows + bits)
    for lengths, (_, panel) in zip((1024, 4096), experiments(df[df["metric"] == "accuracy"])):
        assert list(bits_column(df)[panel.index]) == [16.0, 1024 / lengths, 1024 / lengths], lengths


def _record(bench, error, cache="f16", control=False):
    settings = {"model": "m.gguf", "model_sha256": "1" * 64, "bench": bench, "error": error, "target": "kv", "layers": "all", "seed": 0}
    settings |= {"cache": {"type_k": cache, "type_v": cache, "flash_attn": "auto"}, "options": {"limit": 3}, "control": control}
    return {"settings": settings, "label": error if cache == "f16" else f"{error} @{cache}"}


def test_a_filter_on_configurations_keeps_their_controls():
    records = [
        _record("nexttoken", "none", control=True),
        _record("nexttoken", "normal:0,0.25"),
        _record("nexttoken", "none", cache="q8_0"),
        _record("ifeval", "none", control=True),
        _record("ifeval", "normal:0,0.25"),
    ]
    labels = lambda chosen: [(r["settings"]["bench"], r["label"]) for r in chosen]  # noqa: E731
    assert labels(select(records, ["error=normal:0,0.25", "bench=ifeval"])) == [("ifeval", "none"), ("ifeval", "normal:0,0.25")]
    assert labels(select(records, ["cache_k=q8_0"])) == [("nexttoken", "none"), ("nexttoken", "none @q8_0")]
    assert labels(select(records, ["bench=nexttoken"])) == labels(records[:3])
    with pytest.raises(KvinjectError, match=r"no records match error=none@q8_0: error takes none, normal:0,0.25$"):
        select(records, ["error=none@q8_0"])
    # An option only one bench has filters the records of that bench; a key no record has is refused.
    records += [_record("perplexity", "none", control=True), _record("perplexity", "normal:0,0.5")]
    for r in records[-2:]:
        r["settings"]["options"] = {"ctx": 64}
    assert labels(select(records, ["option.ctx=64", "error=normal:0,0.5"])) == [("perplexity", "none"), ("perplexity", "normal:0,0.5")]
    with pytest.raises(KvinjectError, match=r"no records match bench=zzz option.ctx=1: bench takes ifeval, nexttoken, perplexity; option.ctx takes 64$"):
        select(records, ["bench=zzz", "option.ctx=1"])
    with pytest.raises(KvinjectError, match=r"--filter takes KEY=VALUE with KEY one of .*option.limit, option.ctx; got 'option.chunks=2'"):
        select(records, ["bench=zzz", "option.chunks=2"])


def test_a_panel_spans_its_scores_and_bands_but_not_a_runaway_interval():
    rows = pd.DataFrame({"mean": [0.35, 0.25, 0.1], "ci_low": [math.nan, 0.2, 0.05], "ci_high": [math.nan, 0.3, 0.15]})
    low, high = score_range(rows)
    assert low == pytest.approx(0.05 - 0.0125) and high == pytest.approx(0.35 + 0.0125), "the bands within, a 5% margin of the span"
    two_runs = rows.assign(ci_low=[math.nan, -1.95, -0.4], ci_high=[math.nan, 2.28, 0.6])  # t(0.975, 1) = 12.7
    low, high = score_range(two_runs)
    assert low == pytest.approx(0.1 - 0.25 - 0.0125) and high == pytest.approx(0.35 + 0.25 + 0.0125), "at most the span beyond the scores"


def test_an_f16_cache_is_named_beside_a_control_with_another():
    f32, f16 = Configuration.parse("none@f32"), Configuration.parse("none")
    assert [c.label_beside(f32) for c in (f32, f16, Configuration.parse("normal:0,0.25"), Configuration.parse("none@q8_0"))] == [
        "none @f32",
        "none @f16",
        "normal:0,0.25 @f16",
        "none @q8_0",
    ]
    assert f16.label_beside(f16) == "none", "beside an f16 control, f16 goes without saying"


def test_q_adjusts_the_tests_that_share_a_control_and_no_others():
    from scipy.stats import false_discovery_control

    p = {"a.gguf": [0.01, 0.04, 0.03], "b.gguf": [0.02, 0.5, 0.2]}
    rows = []
    for (model, sha), ps in zip((("a.gguf", "1" * 12), ("b.gguf", "2" * 12)), p.values()):
        rows.append(_row(model, sha, "none", [1024]))
        rows += [_row(model, sha, f"x{i}", [1024], n=3) | {"test": {"p_value": v}} for i, v in enumerate(ps)]
    table = study_table(pd.DataFrame(rows))
    for model, ps in p.items():
        q = table[(table["model"] == model) & table["p"].notna()]["q"].astype(float)
        assert list(q) == pytest.approx(list(false_discovery_control(ps))), model


def test_report_tables_fold_names_before_numbers_and_crop_nothing():
    from rich.console import Console

    from kvinject.analysis.tables import report_table

    labels = ["none", "kvquant:4,site=pre-rope,outliers=0.01,sinks=1,levels=nuq", "bitflip:0.0001,field=any,bit=14"]
    rows = [_row("m.gguf", "1" * 12, label, [1024], n=1 if label == "none" else 3) | {"nonfinite_items": 2} for label in labels]
    rows[1]["test"] = {"p_value": 0.000123456}
    [(_, part)] = terminal_tables(study_table(pd.DataFrame(rows), digits=3))
    console = Console(width=100, record=True, file=io.StringIO())
    console.print(report_table(part))
    text = console.export_text()
    assert max(map(len, text.splitlines())) <= 100
    header = text.splitlines()[1]
    assert header.split("┃")[1].strip(), "the configuration column keeps a width"
    for number in ("0.123–0.877", "0.00012", "100"):  # whole on one line
        assert number in text, number
    assert "NaN" in text and "nonfinite_items" not in text


def test_latex_escapes_what_latex_reads_as_markup():
    rows = [_row("m.gguf", "1" * 12, "none", [1024]) | {"metric": "prompt_level_strict_acc"}]
    latex = render(study_table(pd.DataFrame(rows), "prompt_level_strict_acc"), "latex")
    header = next(line for line in latex.splitlines() if "control" in line)
    assert "\\% control" in header and "% control" not in header.replace("\\%", ""), "an unescaped % comments out the rest of the line"
    assert "prompt\\_level\\_strict\\_acc" in latex


def test_a_filter_matches_the_stored_spelling_of_positions_and_error_specs():
    """positions=first:4 matched nothing: records store it as 0-3."""
    from kvinject.analysis.report import _canonical

    assert _canonical("positions", "first:4") == "0-3"
    assert _canonical("error", "normal:0,.25") == "normal:0,0.25"
    assert _canonical("error", "none@q8_0") == "none@q8_0" and _canonical("seed", "3") == "3"


RUN_GRID = """
[sweep]
models = ["{model}"]
runs = 1

[bench.niah]
lengths = [256]
depths = [0, 100]
samples = 3
family = "multikey"
max_tokens = 8

[[errors]]
model = "normal"
mean = 0
std = 0.25
"""


def test_report_reads_a_run_s_output_file_as_a_sweep_s_store(tmp_path, tiny_path):
    """`kvinject run --output` and a sweep of the same experiment hold the same records under the
    same cell keys: report prints the same table from either, and the two given together count
    each run once. niah's family is an option that decides what is pass/fail (multikey's accuracy
    is, and one run of it is tested with McNemar), so the file must record the bench's options."""
    store = swept(tmp_path, RUN_GRID.format(model=tiny_path))
    output = tmp_path / "run.json"
    flags = ["--bench", "niah", "--lengths", "256", "--depths", "0,100", "--samples", "3", "--family", "multikey", "--max-tokens", "8"]
    out = kvinject("run", "--model", tiny_path, *flags, "--error", "normal:0,0.25", "--runs", "1", "--output", output, "--format", "json")
    assert out.returncode == 0, out.stderr
    tables = [kvinject("report", *paths, "--format", "csv", "--all-metrics") for paths in ([store], [output], [store, output])]
    assert all(t.returncode == 0 for t in tables), [t.stderr for t in tables]
    from_store, from_output, from_both = (pd.read_csv(io.StringIO(t.stdout)) for t in tables)
    assert len(from_store) > 4 and set(from_store["configuration"]) == {"none", "normal:0,0.25"}
    pd.testing.assert_frame_equal(from_output, from_store)
    pd.testing.assert_frame_equal(from_both, from_store)
    [accuracy] = from_store[(from_store["metric"] == "accuracy") & ~from_store["control"]].to_dict("records")
    assert accuracy["n"] == 1 and accuracy["items_ci_method"] == "wilson" and "mcnemar_exact" in accuracy["test"]
    # and as the run itself aggregated its records
    [own] = [a for a in json.loads(output.read_text())["aggregates"] if a["metric"] == "accuracy" and not a["control"]]
    assert own["test"]["test"] == "mcnemar_exact" and own["items_ci"] == json.loads(accuracy["items_ci"])


def test_report_names_a_file_that_is_not_a_run_s_output(tmp_path):
    bad = tmp_path / "other.json"
    bad.write_text('{"results": []}')
    out = kvinject("report", bad)
    assert out.returncode == 2 and "not a file written by kvinject run --output" in out.stderr and "Traceback" not in out.stderr
    out = kvinject("report", tmp_path / "missing.json")
    assert out.returncode == 2 and "no run output at" in out.stderr


def test_csv_rounds_away_float_noise_and_keeps_what_was_measured():
    """A configuration equal to its control showed "% control" 99.99999999999999."""
    table = pd.DataFrame({"configuration": ["none", "same"], "score": [0.3, 0.1 + 0.2], "% control": [100.0, 100 * (0.1 + 0.2) / 0.3], "p": [math.nan, 1 / 3]})
    text = render(table, "csv")
    assert text.splitlines()[1:] == ["none,0.3,100,", "same,0.3,100,0.333333333333333"]
