"""The command line, run as a user runs it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from kvinject import __version__
from kvinject.record_format import RECORD_FORMAT
from tests import cli_tree, fuzz_cli


def kvinject(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}  # as when piped from a script
    return subprocess.run([sys.executable, "-m", "kvinject", *args], capture_output=True, text=True, timeout=300, env=env)


def test_errors_lists_every_registered_model():
    from kvinject.error_models import REGISTRY

    out = kvinject("errors")
    assert out.returncode == 0
    for cls in REGISTRY.values():  # a line starts with the whole syntax (not kvquant's "quant")
        assert re.search(rf"^{re.escape(cls.syntax)}\n(    .*\n)+    e\.g\. {re.escape(cls.example)} *$", out.stdout, re.M), cls.name


@pytest.mark.parametrize(
    "args,message",
    [
        (["generate", "hi", "--error", "gauss:1"], "unknown error model 'gauss'"),
        (["generate", "hi", "--error", "normal:0"], "needs a value for 'std'"),
        (["generate", "hi", "--cache-type-v", "q8_0", "--flash-attn", "off"], "needs flash attention"),
        (["generate", "hi", "--cache-type-k", "q3"], "not a cache type"),
        (["generate", "hi", "--error", "normal:0,0.25@f16/q9"], "'normal:0,0.25@f16/q9': after @ give the cache types as K or K/V, each one of"),
        (["generate", "hi", "--layers", "x-1"], "bad --layers"),
        (["generate", "hi", "--model", "/nonexistent/model.gguf"], "model file not found"),
        (["run", "--bench", "nexttoken", "--parallel", "0"], "--parallel must be between 1 and 256"),
        (["run", "--bench", "ifeval", "--limit", "0"], "limit must be at least 1, got 0"),
        (["run", "--bench", "nexttoken", "--limit", "0"], "limit must be at least 1, got 0"),
        (["run", "--bench", "perplexity", "--chunks", "-1"], "chunks must be at least 1, got -1"),
        # --chat is a flag: the --limit after it is read as --limit, not as --chat's value
        (["run", "--bench", "gsm8k", "--chat", "--limit", "0"], "gsm8k: --limit must be at least 1, got 0"),
        (["run", "--bench", "ifeval", "--no-chat"], "--chat applies to gsm8k, lmeval, not to ifeval"),
        (
            ["run", "--bench", "ifeval", "--data", "nexttoken=x.txt"],
            "--data nexttoken=x.txt: nexttoken is not a selected bench (ifeval); add --bench nexttoken",
        ),
        (
            ["run", "--bench", "nexttoken", "--output", "/nonexistent/dir/x.json"],
            "cannot write /nonexistent/dir/x.json: the folder /nonexistent/dir does not exist",
        ),
        (["run", "--bench", "nexttoken", "--seed", "-1"], "'--seed': must be at least 0, got -1"),
        (["sweep", "examples/faults.toml", "--max-cells", "0"], "'--max-cells': must be at least 1, got 0"),
        (["run", "--bench", "ifeval", "--temperature", "nan"], "--temperature must be a number, got 'nan'"),
        (["run", "--bench", "nexttoken", "--runs", "1000000000"], "--runs must be between 1 and 10000, got 1000000000"),
        (["run", "--bench", "nexttoken", "--format", "json", "--wide"], "--wide applies to --format table, not json: leave it out"),
        (["report", "docs/faults.results.sqlite", "--format", "csv", "--wide"], "--wide applies to --format table, not csv: leave it out"),
        (["profile", "--error", "normal:0,0.5", "--runs", "0"], "--runs must be between 1 and 10000, got 0"),
        (["tune", "--bits", "3", "--runs", "10001"], "--runs must be between 1 and 10000, got 10001"),
        (["run", "--bench", "niah", "--needles", "3"], "niah: --needles applies only with --family multikey, multivalue or multiquery, not single"),
        (["run", "--bench", "vt", "--data", "x.txt"], "vt: --data applies only with --haystack text, not noise"),
        (["run", "--bench", "vt", "--lengths", "256", "--chains", "100000"], "vt: an item's needles take at least 4000000 tokens, more than length 256"),
        (["run", "--bench", "nexttoken", "--max-tokens", "5"], "not to nexttoken"),
        (["run", "--bench", "ifeval", "--data", os.devnull], "leaves no item to evaluate"),
        (["generate", "hi", "--ctx", "2"], "do not fit --ctx 2"),
        (["generate", "Hi", "-n", "-3"], "--max-tokens must be at least 1, got -3"),
        (["divergence", "--error", "none", "--prompt", "Hi", "--max-tokens", "nan"], "error: --max-tokens must be an integer, got 'nan'"),
        (["divergence", "--error", "none", "--prompt", "Hi", "--max-tokens", "0"], "error: --max-tokens must be at least 1, got 0"),
        (["divergence", "--error", "none", "--prompt", "Hi", "--max-tokens", "100000"], "divergence: the longest prompt is 1 tokens, and with 100000"),
        (["divergence", "--error", "none", "--max-tokens", "100000", "--limit", "1"], "tokens, and with 100000 to generate it needs"),
        (["generate", ""], "the prompt is empty"),
        (["generate", "Hi", "--error", "@f16"], "'@f16': give an error model before the cache types"),
        (["generate", "hi", "--error", "bitflip:0.1,field=exponent,field=sign"], "option 'field' given twice"),
        (["generate", "hi", "--error", "normal:0,1_000"], "std must be a number, got '1_000'"),
        (["sweep", "examples/paper.toml", "--shard", ""], "--shard takes i/n"),
        (["score", "ifeval", "--data", "x", "--responses", "y", "-o", "/nonexistent/v.jsonl"], "cannot write /nonexistent/v.jsonl"),
    ],
)
def test_bad_input_fails_with_a_clear_message(args, message):
    out = kvinject(*args)
    assert out.returncode == 2
    assert message in out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize("columns", ["0", "wide"])
def test_a_columns_that_gives_no_width_leaves_every_line_printed(columns):
    """At COLUMNS=0 rich printed nothing: `kvinject errors` was empty and an error's one line
    never shown, each with its usual status."""
    env = {**os.environ, "COLUMNS": columns}
    listed = subprocess.run([sys.executable, "-m", "kvinject", "errors"], capture_output=True, text=True, timeout=300, env=env)
    assert listed.returncode == 0 and listed.stdout == kvinject("errors").stdout
    refused = subprocess.run([sys.executable, "-m", "kvinject", "generate", ""], capture_output=True, text=True, timeout=300, env=env)
    assert refused.returncode == 2 and refused.stderr == "error: the prompt is empty: give the text to complete\n", refused.stderr


def test_generate_takes_a_configuration_with_its_own_cache_types(tiny_path):
    out = kvinject("generate", "Once upon a time", "-e", "none@q8_0", "-e", "normal:0,0.5@f32", "-n", "3", "--format", "json", "--model", str(tiny_path))
    assert out.returncode == 0, out.stderr
    results = json.loads(out.stdout)["results"]
    assert [(r["error"], r["cache"]["type_k"]) for r in results] == [("none", "f16"), ("none", "q8_0"), ("normal:0,0.5", "f32")]


def test_generate_json_reports_text_and_realized_statistics(tiny_path):
    out = kvinject(
        "generate", "Once upon a time", "-e", "none", "-e", "normal:0,0.5", "--target", "v", "-n", "4", "--format", "json", "--model", str(tiny_path)
    )
    assert out.returncode == 0, out.stderr
    results = json.loads(out.stdout)["results"]
    assert [r["error"] for r in results] == ["none", "normal:0,0.5"]
    control, noisy = results
    assert control["realized"]["k"]["values"] == 0 and noisy["realized"]["k"]["values"] == 0
    assert noisy["realized"]["v"]["rel_err_std"] == pytest.approx(0.5, rel=0.05)
    for key in ("values", "rel_err_mean", "rel_err_std", "sign_flip_frac", "snr_db"):
        assert key in noisy["realized"]["v"]
    assert isinstance(noisy["text"], str)


def test_run_rejects_unknown_bench_and_ambiguous_data():
    out = kvinject("run", "--bench", "mmlu")
    assert out.returncode == 2 and "unknown bench 'mmlu'" in out.stderr
    out = kvinject("run", "--bench", "ifeval", "--bench", "nexttoken", "--data", "x.txt")
    assert out.returncode == 2 and "BENCH=PATH" in out.stderr


def test_run_writes_json_records_and_aggregates(tiny_path, tmp_path):
    output, csv = tmp_path / "out.json", tmp_path / "out.csv"
    out = kvinject(
        "run",
        "--bench",
        "nexttoken",
        "--error",
        "normal:0,0.5",
        "--runs",
        "2",
        "--limit",
        "4",
        "--parallel",
        "3",
        "--model",
        str(tiny_path),
        "-o",
        str(output),
        "--csv",
        str(csv),
    )
    assert out.returncode == 0, out.stderr
    assert "nexttoken" in out.stdout and "normal:0,0.5" in out.stdout
    assert "…" not in out.stdout, "piped tables must not cut their cells short"
    data = json.loads(output.read_text())
    assert data["meta"]["model_sha256"] and data["meta"]["runs"] == 2 and data["meta"]["seed"] == 0
    assert data["meta"]["parallel"] == 3
    assert data["meta"]["kvinject"] == __version__ and {(r["format"], r["kvinject"]) for r in data["records"]} == {(RECORD_FORMAT, __version__)}
    assert [(r["label"], r["run"]) for r in data["records"]] == [("none", 0), ("normal:0,0.5", 0), ("normal:0,0.5", 1)]
    assert {a["metric"] for a in data["aggregates"]} >= {"accuracy", "mean_logprob", "diverged"}
    assert csv.read_text().startswith("bench,label,metric")


def test_a_control_run_decodes_without_statistics_or_numba_loaded(tiny_path):
    """What a run holds while it decodes is its peak memory (perf/perplexity_lengths.py): a
    control has nothing to hook (numba's compiled callback, about 50 MB) and its statistics come
    after the runs (scipy.stats, 60 MB)."""
    code = (
        "import sys\n"
        "from kvinject.engine.context import Context\n"
        "from kvinject.cli.launch import main\n"
        "decode = Context.decode\n"
        "def watched(self, entries):\n"
        "    if not hasattr(Context, 'seen'):\n"
        "        Context.seen = sorted(m for m in ('scipy.stats', 'numba', 'pandas') if m in sys.modules)\n"
        "    decode(self, entries)\n"
        "Context.decode = watched\n"
        "sys.argv = ['kvinject', *sys.argv[1:]]\n"
        "try:\n"
        "    main()\n"
        "finally:\n"
        "    print('loaded while decoding:', Context.seen, file=sys.stderr)\n"
    )
    argv = ["run", "--bench", "perplexity", "--chunks", "1", "--ctx", "64", "--model", tiny_path, "--format", "json"]
    out = subprocess.run([sys.executable, "-c", code, *map(str, argv)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "loaded while decoding: []" in out.stderr
    assert json.loads(out.stdout)["aggregates"], "the statistics were computed after the runs"


def test_score_checks_responses_generated_elsewhere(tmp_path):
    fixtures = os.path.join(os.path.dirname(__file__), "fixtures", "ifeval")
    verdicts = tmp_path / "verdicts.jsonl"
    out = kvinject(
        "score",
        "ifeval",
        "--data",
        os.path.join(fixtures, "input_data.jsonl"),
        "--responses",
        os.path.join(fixtures, "responses.jsonl"),
        "-o",
        str(verdicts),
        "--format",
        "json",
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert set(result) >= {"prompt_level_strict_acc", "inst_level_strict_acc", "prompt_level_loose_acc", "inst_level_loose_acc"}
    lines = [json.loads(line) for line in verdicts.read_text().splitlines()]
    assert len(lines) == result["scored"] and all("strict" in v and "loose" in v for v in lines)


def test_result_tables_fit_100_columns_and_wide_shows_every_metric(tiny_path):
    args = (
        "run",
        "--bench",
        "perplexity",
        "--ctx",
        "64",
        "--chunks",
        "2",
        "-e",
        "normal:0,0.25",
        "-e",
        "uniform:-1.5,1.5@q8_0/q4_0",
        "--layers",
        "0-1",
        "--target",
        "k",
        "--runs",
        "2",
        "--model",
        str(tiny_path),
    )
    env = {**os.environ, "COLUMNS": "100"}
    narrow = subprocess.run([sys.executable, "-m", "kvinject", *args], capture_output=True, text=True, timeout=300, env=env)
    assert narrow.returncode == 0, narrow.stderr
    lines = narrow.stdout.splitlines()
    assert max(map(len, lines)) <= 100 and "…" not in narrow.stdout
    assert "[k:0-1]" in narrow.stdout  # labels are text, not markup
    # stderr is no terminal here (a job's log): a timed line per finished run, with its score
    logged = re.findall(r"^\d\d:\d\d:\d\d perplexity (.+) run (\d): ppl [\d.e+]+$", narrow.stderr, re.M)
    assert sorted(logged) == sorted([("none", "0")] + [(label, r) for label in ("normal:0,0.25 [k:0-1]", "uniform:-1.5,1.5 [k:0-1] @q8_0/q4_0") for r in "01"])
    assert lines[-1].startswith("--wide adds CI runs, kld"), "what did not fit is named"
    wide = subprocess.run([sys.executable, "-m", "kvinject", *args, "--wide"], capture_output=True, text=True, timeout=300, env={**env, "COLUMNS": "200"})
    assert wide.returncode == 0 and "same_top_p" in wide.stdout


@pytest.mark.parametrize(
    "args,shown,hidden",
    [
        (["--target", "k"], ["K rel. err mean±std", "K sign flips", "K SNR dB"], ["V rel. err", "K/V"]),
        ([], ["rel. err std K/V", "sign flips K/V", "SNR dB K/V"], ["K rel. err", "V rel. err"]),
    ],
)
def test_generate_shows_columns_only_for_what_got_error(tiny_path, args, shown, hidden):
    args = ["generate", "Once upon a time", "-e", "normal:0,0.5", "-n", "3", "--model", str(tiny_path), *args]
    out = subprocess.run([sys.executable, "-m", "kvinject", *args], capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "100"})
    assert out.returncode == 0, out.stderr
    header = " ".join(line for line in out.stdout.splitlines() if line.startswith("┃"))
    for name in shown:
        assert all(word in header for word in name.split()), name
    assert not any(name in out.stdout for name in hidden)
    assert max(map(len, out.stdout.splitlines())) <= 100


def test_version_as_an_option_and_a_command():
    assert [kvinject(*args).stdout for args in (["--version"], ["version"])] == [f"{__version__}\n"] * 2


def test_divergence_offers_only_the_options_of_generation_benches():
    from dataclasses import fields

    from kvinject.benchmarks import BENCHMARKS, GenerationBenchmark

    text = kvinject("divergence", "--help").stdout
    generation = {f.name for cls in BENCHMARKS.values() if issubclass(cls, GenerationBenchmark) for f in fields(cls.Options)}
    others = {f.name for cls in BENCHMARKS.values() for f in fields(cls.Options)} - generation
    assert others, "some bench (perplexity) does not generate"
    for name in others:
        assert not re.search(rf"--{name.replace('_', '-')}(?![\w-])", text), name
    assert all(re.search(rf"--{name.replace('_', '-')}(?![\w-])", text) for name in generation)


def test_outputs_and_stores_that_are_the_wrong_kind_of_path_say_so(tiny_path, tmp_path):
    (tmp_path / "afile").write_text("")
    out = kvinject("run", "--bench", "nexttoken", "--limit", "1", "--model", tiny_path, "-o", tmp_path / "afile" / "x.json")
    assert out.returncode != 0 and "afile is a file, not a folder" in out.stderr
    grid = tmp_path / "g.toml"
    grid.write_text("[bench.nexttoken]\nlimit = 1\n")
    out = kvinject("sweep", grid, "--store", tmp_path)
    assert out.returncode != 0 and "is a folder, not a results store" in out.stderr and "damaged" not in out.stderr


@pytest.mark.parametrize(
    "args",
    [
        ("generate", "Hi", "--error", "none", "--positions", "0-3"),
        ("generate", "Hi", "--error", "recompute", "--heads", "0"),
        ("divergence", "--prompt", "Hi", "--error", "none@f16", "--reference", "none@f32", "--layers", "99"),
    ],
)
def test_a_selection_with_no_error_to_place_is_refused(tiny_path, args):
    """These were accepted and did nothing."""
    out = kvinject(*args, "--model", tiny_path)
    assert out.returncode != 0 and "puts none anywhere" in out.stderr and "Traceback" not in out.stderr


def test_generate_says_when_an_error_reached_no_value(tiny_path):
    out = kvinject("generate", "Hi", "--error", "normal:0,1", "--positions", "100000-", "-n", "2", "--model", tiny_path, "--format", "json")
    assert out.returncode == 0, out.stderr
    assert [r["changed_nothing"] for r in json.loads(out.stdout)["results"]] == [False, True]
    table = kvinject("generate", "Hi", "--error", "normal:0,1", "--positions", "100000-", "-n", "2", "--model", tiny_path)
    assert "changed no value that reached the cache" in table.stdout


def _commands_with(option: str) -> list[tuple[str, list[str]]]:
    """Each command that takes ``option``, with a placeholder for each argument it requires."""
    import typer.main

    from kvinject.cli.app import app

    group = typer.main.get_command(app)
    out = []
    for name, command in group.commands.items():
        if any(option in p.opts for p in command.params):
            out.append((name, ["x" for p in command.params if p.param_type_name == "argument" and p.required]))
    return out


@pytest.mark.parametrize("name, arguments", _commands_with("--format"), ids=lambda v: v if isinstance(v, str) else "")
def test_every_command_refuses_a_format_it_does_not_write(name, arguments):
    """`kvinject info --format bogus` printed the table."""
    out = kvinject(name, *arguments, "--format", "bogus")
    assert out.returncode == 2 and out.stderr.startswith("error: --format must be") and len(out.stderr.strip().splitlines()) == 1, out.stderr


def verbose_commands() -> list[tuple[str, list[str]]]:
    """Each command with --verbose, and what asks it for JSON where it writes JSON."""
    out = []
    for name, command in cli_tree.commands().items():
        params = {cli_tree.flag(p): p for p in command.params}
        if "--verbose" in params:
            out.append((name, ["--format", "json"] if "json" in (getattr(params.get("--format"), "help", None) or "") else []))
    return out


@pytest.mark.parametrize("command, json_format", verbose_commands())
def test_verbose_shows_llama_cpp_s_log_on_standard_error_and_leaves_the_output_whole(command, json_format, tmp_path, tiny_path):
    """--verbose printed llama.cpp's log to standard output, into what --format json writes there."""
    fuzz_cli.workspace(tmp_path, tiny_path)
    args = [a for a in fuzz_cli.BASES[command][0] if a != "--dry-run"]  # tune's: the model is loaded
    argv = [sys.executable, "-m", "kvinject", command, *args, "--verbose", *json_format]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    if json_format:
        json.loads(out.stdout)
    assert "llama_model_loader: " in out.stderr and "llama_model_loader: " not in out.stdout
