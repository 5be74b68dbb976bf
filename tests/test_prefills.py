"""Prompts decoded once for every eviction configuration (kvinject/engine/cache/prefills.py): a
configuration that restores another's snapshot of a prompt must give, bit for bit, what it gives
decoding the prompt itself: the tokens, the logits of every pick, and the cells its sequence holds
at the end with their K and V (read back through llama.cpp's state export)."""

from __future__ import annotations

import numpy as np
import pytest

from kvinject.engine.cache.prefills import Prefills
from kvinject.engine.context import Context
from kvinject.engine.generation.batching import generate_all
from kvinject.engine.options import CacheOptions
from kvinject.error_models import parse_error
from kvinject.error_models.eviction import METHODS

from .cache_state import read_cells

OFF = CacheOptions("f16", "f16", "off")
TEXTS = [
    "The quick brown fox jumps over the lazy dog while the cat watches from the warm windowsill",
    "Rivers carry sediment from the mountains to the sea, and deltas grow where they slow down",
]
QUESTION = " Which animal watched?"


def prompts(model) -> tuple[list[list[int]], list[dict]]:
    """Two prompts, each a context and a question after it, with their context spans."""
    out, spans = [], []
    for text in TEXTS:
        context = model.tokenize(text)
        out.append(context + model.tokenize(QUESTION, add_special=False))
        spans.append({"context": [(0, len(context))]})
    return out, spans


def generate(model, spec: str, prefills: Prefills, n_batch: int = 8) -> list[tuple]:
    """Each prompt's tokens, pick logits, and the positions and K/V its sequence holds at the end."""
    items, spans = prompts(model)
    out = []
    with Context(model, OFF, parse_error(spec), n_ctx=128, n_seq=1, n_batch=n_batch, seed=3) as ctx:
        for i in range(len(items)):
            ((_, gen),) = generate_all(ctx, items[i : i + 1], 6, items=[i], spans=spans[i : i + 1], keep_logits=True, prefills=prefills, ignore_eos=True)
            positions, cache = read_cells(ctx, 0)
            out.append((gen.tokens, gen.logits, positions, cache))
    return out


def assert_same(restored: list[tuple], decoded: list[tuple]) -> None:
    for (tokens, logits, positions, cache), (tokens0, logits0, positions0, cache0) in zip(restored, decoded):
        assert tokens == tokens0
        assert np.array_equal(logits, logits0)
        assert np.array_equal(positions, positions0), "the same cells, in the same order"
        assert all(np.array_equal(cache[k], cache0[k]) for k in cache0)


@pytest.mark.parametrize("query", ["agnostic", "aware"])
@pytest.mark.parametrize("method", sorted(METHODS))
def test_a_restored_prompt_gives_what_decoding_it_gives(tiny, method, query):
    """Every method, query-agnostic (the context restored, the question decoded) and aware (the
    whole prompt restored, its logits with it), prompts in pieces of 8, a budget that cuts; the
    snapshot taken by another method that reads the same (attention or not)."""
    reads_attention = METHODS[method].reads == "attention"
    spec = f"evict:{method},0.5,decode=0,query={query}"
    prefills = Prefills()
    generate(tiny, f"evict:{'tova' if reads_attention else 'window'},0.25,decode=0,query={query}", prefills)
    assert len(prefills._kept) == 2, "one snapshot a prompt"
    assert_same(generate(tiny, spec, prefills), generate(tiny, spec, Prefills()))


def test_every_decode_after_the_prompt_may_cut_too(tiny):
    """The default (a cut after every decode) shares the prompt as well: the first cut is at its end."""
    prefills = Prefills()
    generate(tiny, "evict:window,0.5", prefills)
    assert_same(generate(tiny, "evict:h2o,0.5", prefills), generate(tiny, "evict:h2o,0.5", Prefills()))
    assert len(prefills._kept) == 4, "h2o reads attention: it cannot restore window's snapshots and takes its own"


def test_snapshots_past_the_budget_are_not_kept(tiny):
    prefills = Prefills(budget=1)
    generate(tiny, "evict:knorm,0.5,decode=0", prefills)
    assert not prefills._kept
    assert_same(generate(tiny, "evict:knorm,0.5,decode=0", prefills), generate(tiny, "evict:knorm,0.5,decode=0", Prefills()))


def test_other_models_and_several_sequences_do_not_share(tiny):
    """A model that acts within the prompt (KIVI, noise) has nothing to share; with several
    sequences a restore could not put the cells back where they were."""
    items, spans = prompts(tiny)
    for spec, n_seq in (("kivi:2,group=32,residual=32", 1), ("evict:window,0.5", 2)):
        prefills = Prefills()
        with Context(tiny, OFF, parse_error(spec), n_ctx=256, n_seq=n_seq) as ctx:
            list(generate_all(ctx, items, 4, items=range(2), spans=spans, prefills=prefills))
        assert not prefills._kept, spec
