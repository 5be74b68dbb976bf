"""The plan before the work: every command builds and checks its whole plan (configurations,
items, prompts and their token counts, outputs, metrics) before its first decode, so that a
user's mistake never ends a command after minutes of compute. The decode is patched to note
that work has started; a user's error raised after it fails the test."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from kvinject.cli.app import app
from kvinject.engine.context import Context
from kvinject.exceptions import InjectionError, KvinjectError

RUN = ["run", "--runs", "1"]
LENGTH = ["--lengths", "1024", "--depths", "50", "--samples", "1", "--max-tokens", "2"]
DIVERGE = ["divergence", "--prompt", "Hi", "--max-tokens", "2"]
BAD = {  # each found wrong only with the model, data or items in hand
    "a layer the model lacks": [*RUN, "--bench", "nexttoken", "--limit", "1", "--error", "normal:0,0.5", "--layers", "7"],
    "a head the model lacks": [*RUN, "--bench", "nexttoken", "--limit", "1", "--error", "normal:0,0.5", "--heads", "5"],
    "a span the bench lacks": [*RUN, "--bench", "nexttoken", "--limit", "1", "--error", "normal:0,0.5", "--positions", "needle"],
    "the second bench's span": [*RUN, "--bench", "nexttoken,passkey", *LENGTH, "--limit", "1", "-e", "normal:0,0.5", "--positions", "needle"],
    "a group the heads do not divide": [*RUN, "--bench", "nexttoken", "--limit", "1", "--error", "normal:0,0.5", "--error", "kivi:2,group=48"],
    "a passkey longer than the context": [*RUN, "--bench", "passkey", "--lengths", "1024,999999", "--depths", "50", "--samples", "1"],
    "a later bench's bad data": [*RUN, "--bench", "nexttoken,ifeval", "--limit", "1", "--data", "ifeval=missing.jsonl"],
    "a perplexity window over the context": [*RUN, "--bench", "perplexity", "--limit", "1", "--ctx", "999999"],
    "a vt too short for its needles": [*RUN, "--bench", "nexttoken,vt", "--limit", "1", "--lengths", "256", "--depths", "50", "--samples", "1"],
    "a generated prompt too long": ["generate", "Hi " * 3000, "--ctx", "64", "--max-tokens", "2", "--error", "normal:0,0.5"],
    "a layer the model lacks, generate": ["generate", "Hi", "--max-tokens", "2", "--error", "normal:0,0.5", "--layers", "7"],
    "divergence's bad layer": [*DIVERGE, "--error", "normal:0,0.5", "--layers", "7"],
    "divergence's second error": [*DIVERGE, "--error", "normal:0,0.5", "--error", "kivi:2,group=48"],
    "profile's bad group": ["profile", "--error", "kivi:2,group=48", "--bench", "nexttoken", "--limit", "1"],
    "profile's bad metric": ["profile", "--error", "normal:0,0.5", "--bench", "nexttoken", "--limit", "1", "--metric", "bogus"],
}
GRIDS = {  # sweep: the second cell's mistake, found before the first cell decodes
    "a later cell's layer": "[[errors]]\nspec = 'normal:0,0.5'\n[[cells]]\nerror = 'normal:0,0.5'\nlayers = '7'\n",
    "a later bench's span": "[bench.passkey]\nlengths = [1024]\ndepths = [50]\nsamples = 1\n[sweep]\nruns = 1\npositions = ['needle']\n",
    "a later error's group": "[[errors]]\nspec = 'normal:0,0.5'\n[[errors]]\nspec = 'kivi:2,group=48'\n",
}


@pytest.fixture
def decodes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Each decode of a command appends to the list: its work has started."""
    started: list[int] = []
    decode = Context.decode

    def noted(self, entries):
        started.append(len(entries))
        return decode(self, entries)

    monkeypatch.setattr(Context, "decode", noted)
    return started


def planned(args: list[str], decodes: list[int]) -> None:
    """``kvinject ARGS`` ends in the user's error before its first decode."""
    result = CliRunner().invoke(app, args, catch_exceptions=True)
    error = result.exception
    if error is not None and not isinstance(error, (KvinjectError, SystemExit)) or isinstance(error, InjectionError):
        raise error
    assert isinstance(error, KvinjectError), f"kvinject {' '.join(args)[:200]}: no error ({result.output[-300:]})"
    assert not decodes, f"kvinject {' '.join(args)[:200]}: '{error}' after {len(decodes)} decodes"


@pytest.mark.parametrize("case", BAD)
def test_a_mistake_is_found_before_the_first_decode(case, tiny_path, decodes, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    planned([*BAD[case], "--model", str(tiny_path)], decodes)


@pytest.mark.parametrize("case", GRIDS)
def test_a_grid_mistake_is_found_before_the_first_decode(case, tiny_path, decodes, tmp_path):
    grid = tmp_path / "grid.toml"
    base = f"[sweep]\nruns = 1\nmodels = ['{tiny_path}']\n[bench.nexttoken]\nlimit = 1\n"
    text = GRIDS[case]
    grid.write_text(base.replace("[sweep]\nruns = 1\n", "") + text if text.startswith("[bench") else base + text)
    planned(["sweep", str(grid)], decodes)


def test_lm_eval_checks_its_model_args_before_the_first_decode(tiny_path, decodes, tmp_path):
    pytest.importorskip("lm_eval")
    planned(["lm-eval", "--model_args", f"model={tiny_path},error=mantissa:7,layers=7", "--tasks", "kvinject_nextword", "--limit", "1"], decodes)
