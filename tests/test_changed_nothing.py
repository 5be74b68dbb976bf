"""No silent no-ops: a configuration that could not change what a bench measures is refused before
anything runs, or flagged in every output when it changed no value of the cache."""

from __future__ import annotations

import json

import pytest

from kvinject.benchmarks.perplexity import Perplexity
from kvinject.engine.options import CacheOptions
from kvinject.error_models.configuration import Configuration
from kvinject.exceptions import SpecError
from kvinject.experiments.grid import GridError, load_grid

from .cli_runs import kvinject


@pytest.mark.parametrize("spec", ["kivi:2", "evict:streaming,0.25", "evict:tova,0.5"])
def test_perplexity_refuses_a_compressor_between_decodes_without_step(spec):
    config = Configuration.parse(spec, cache=CacheOptions(flash_attn="off"))
    with pytest.raises(SpecError, match="--step"):
        Perplexity.check(config, Perplexity.Options.parse({}))
    Perplexity.check(config, Perplexity.Options.parse({"step": 8}))
    Perplexity.check(Configuration.parse("normal:0,0.5"), Perplexity.Options.parse({}))  # acts as values enter: fine


def test_a_grid_of_kivi_on_one_decode_perplexity_is_refused(tmp_path):
    grid = tmp_path / "g.toml"
    grid.write_text('[bench.perplexity]\nchunks = 2\n[[errors]]\nspec = "kivi:2"\n')
    with pytest.raises(GridError, match=r"\[bench.perplexity\].*--step"):
        load_grid(grid)
    grid.write_text('[bench.perplexity]\nchunks = 2\nstep = 16\n[[errors]]\nspec = "kivi:2"\n')
    assert len(load_grid(grid).cells) == 2


def test_run_refuses_it_in_one_line(tiny_path):
    out = kvinject("run", "--bench", "perplexity", "--error", "kivi:2", "--chunks", "1", "--model", tiny_path)
    assert out.returncode != 0 and "--step" in out.stderr and "Traceback" not in out.stderr


def test_an_error_that_reached_no_value_is_flagged_in_json_table_and_warning(tiny_path, tmp_path):
    """--positions past every 10-word snippet: the hook is installed, and changes nothing."""
    output = tmp_path / "out.json"
    args = ["run", "--bench", "nexttoken", "--error", "normal:0,0.5", "--positions", "1000-", "--runs", "1", "--limit", "3"]
    out = kvinject(*args, "--model", tiny_path, "-o", output)
    assert out.returncode == 0, out.stderr
    flags = {a["configuration"]: a["changed_nothing"] for a in json.loads(output.read_text())["aggregates"]}
    assert flags and not flags["none"] and all(flag for name, flag in flags.items() if name != "none")
    assert "†" in out.stdout and "changed no value" in out.stderr
    quiet = kvinject(*args[:5], "--runs", "1", "--limit", "3", "--model", tiny_path)
    assert quiet.returncode == 0 and "†" not in quiet.stdout and "changed no value" not in quiet.stderr


def test_report_flags_it_from_the_store(tiny_path, tmp_path):
    grid = tmp_path / "g.toml"
    grid.write_text(
        f'[sweep]\nmodels = ["{tiny_path}"]\nruns = 1\n[bench.nexttoken]\nlimit = 3\n'
        '[[errors]]\nspec = "uniform:-0.5,0.5"\n[[cells]]\nerror = "normal:0,0.5"\npositions = "1000-"\n'
    )
    assert kvinject("sweep", grid).returncode == 0
    store = grid.with_suffix(".results.sqlite")
    header, *rows = kvinject("report", store, "--format", "csv").stdout.strip().splitlines()
    assert header.endswith(",changed_nothing")
    assert [row.endswith(",True") for row in rows] == [False, False, True]  # none, uniform, normal past every prompt
    table = kvinject("report", store)
    assert table.returncode == 0 and table.stdout.count("†") == 2 and "changed no value" in table.stdout  # the mark and the note
    markdown = kvinject("report", store, "--format", "markdown").stdout
    assert "†" in markdown and "changed_nothing" not in markdown


def test_an_eviction_whose_budget_no_prompt_reaches_is_flagged_and_one_that_evicts_is_not(tiny_path, tmp_path):
    """Eviction changes no value (it removes tokens): what it did shows in its bits per element."""
    output = tmp_path / "out.json"
    errors = ["--error", "evict:streaming,1000", "--error", "evict:streaming,0.25"]
    out = kvinject("run", "--bench", "nexttoken", *errors, "--runs", "1", "--limit", "3", "--model", tiny_path, "-o", output)
    assert out.returncode == 0, out.stderr
    flags = {a["label"]: a["changed_nothing"] for a in json.loads(output.read_text())["aggregates"] if a["metric"] == "accuracy"}
    assert flags == {"none": False, "evict:streaming,1000,sinks=4": True, "evict:streaming,0.25,sinks=4": False}
