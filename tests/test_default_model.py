"""End-to-end on the real default model (SmolLM2-135M-Instruct): slower, few of them."""

from __future__ import annotations

import json

import pytest

from kvinject.engine.context import Context
from kvinject.engine.info import gather

from .conftest import SHARED
from .test_cli import kvinject

pytestmark = pytest.mark.slow


def test_generate_on_a_fresh_install_decodes_and_injects():
    # A subprocess: a crash in llama.cpp's first decode (see docs) must fail this test, not pytest.
    out = kvinject("generate", "The capital of France is", "--error", "none", "--error", "normal:0,0.5", "--format", "json", "-n", "12")
    assert out.returncode == 0, out.stderr
    control, noisy = json.loads(out.stdout)["results"]
    assert "Paris" in control["text"]
    assert noisy["text"] != control["text"]
    for component in "kv":
        stats = noisy["realized"][component]
        assert stats["values"] > 0 and stats["rel_err_std"] == pytest.approx(0.5, abs=0.02)
        assert control["realized"][component]["values"] == 0


def test_info_cache_sizes_match_the_estimate(smollm):
    report = gather(smollm, 4096)
    assert (report["n_layer"], report["n_head_kv"], report["head_dim_k"]) == (30, 3, 64)
    sizes = {row["type"]: row for row in report["cache_sizes"]}
    # 2·L·H·D·N·b = 2·30·3·64·4096·2 bytes = 90 MiB for f16.
    assert sizes["f16"]["estimate_mib"] == pytest.approx(90.0)
    for name in ("f32", "f16", "q8_0", "q4_0"):
        assert sizes[name]["ratio"] == pytest.approx(1.0, abs=0.01), name


def test_run_scores_the_three_benches_against_the_control(tmp_path):
    output = tmp_path / "run.json"
    out = kvinject(
        "run",
        "--bench",
        "ifeval",
        "--bench",
        "nexttoken",
        "--bench",
        "perplexity",
        "--error",
        "normal:0,0.25",
        "--runs",
        "2",
        "--limit",
        "3",
        "--max-tokens",
        "16",
        "--chunks",
        "2",
        "--ctx",
        "256",
        "-o",
        str(output),
    )
    assert out.returncode == 0, out.stderr
    for title in ("ifeval: prompt_level_strict_acc", "nexttoken: accuracy", "perplexity: ppl"):
        assert title in out.stdout
    data = json.loads(output.read_text())
    ppl = {a["label"]: a["mean"] for a in data["aggregates"] if a["bench"] == "perplexity" and a["metric"] == "ppl"}
    assert ppl["normal:0,0.25"] > ppl["none"] > 1


WIKITEXT = SHARED / "data/wikitext-2-raw/wiki.test.raw"


@pytest.mark.skipif(not WIKITEXT.exists(), reason="../shared/data not present")
def test_perplexity_agrees_with_llama_perplexity(smollm):
    """llama-perplexity -c 128 --chunks 16 -b 128 -t 2 on wiki.test.raw printed
    'Final estimate: PPL = 35.0054 +/- 3.62590' for this model (docs/perplexity.md)."""
    from kvinject.benchmarks import Perplexity
    from kvinject.error_models.configuration import Configuration
    from kvinject.experiments.runner import run

    (result,) = run(smollm, [Perplexity(data=str(WIKITEXT), chunks=16, ctx=128)], [Configuration()], runs=1)
    assert result.metrics["ppl"] == pytest.approx(35.0054, rel=0.005)
    assert result.metrics["ppl_err"] == pytest.approx(3.62590, rel=0.005)


def test_ignore_eos_generates_past_the_end_of_an_answer(smollm):
    from kvinject.engine.generation.batching import generate_all

    prompt = smollm.tokenize(smollm.chat_prompt("Reply with one word: is the sky blue?"), parse_special=True)
    with Context(smollm) as ctx:
        ((_, short),) = generate_all(ctx, [prompt], max_tokens=40)
        ((_, full),) = generate_all(ctx, [prompt], max_tokens=40, ignore_eos=True)
    assert len(short.tokens) < 40
    assert len(full.tokens) == 40 and full.tokens[: len(short.tokens)] == short.tokens
    assert smollm.is_eog(full.tokens[len(short.tokens)])
