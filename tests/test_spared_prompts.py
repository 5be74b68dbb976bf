"""A fault campaign's items whose faults land after the prompt restore the prompt that another
configuration decoded (kvinject/engine/cache/prefills.py). A run that restores must give what it
gives decoding every prompt itself: tokens and the logits of every pick bit for bit, the faults
where they landed, the cells each sequence holds at the end with their K and V (read back through
llama.cpp's state export), and the realized statistics (their float sums in another order: a
relative 1e-12, where summing some thousands of float64 terms in any order moves them by about
1e-13)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kvinject.engine.cache.prefills import Prefills
from kvinject.engine.context import Context
from kvinject.engine.generation.batching import generate_all
from kvinject.engine.options import CacheOptions
from kvinject.error_models import parse_error

from .cache_state import read_cells

TEXTS = [
    "The quick brown fox jumps over the lazy dog",
    "Rivers carry sediment from the mountains to the sea",
    "A prime number has exactly two divisors",
]
SPECS = [
    "faults:2,bit=14,stage=generated",
    "faults:1,kind=stuck1,stage=generated",
    "faults:1,kind=burst,bits=3,ecc=secded,stage=generated",
]


def campaign(model, spec: str, run: int, n_seq: int, prefills: Prefills | None, cache: CacheOptions) -> tuple[list, dict, int]:
    """Each item's tokens, pick logits, faults and final cells; the realized summary; the decodes."""
    prompts = [model.tokenize(t) for t in TEXTS]
    with Context(model, cache, parse_error(spec), n_ctx=64 * n_seq, n_seq=n_seq, n_batch=16, seed=5, run=run, streams=n_seq > 1) as ctx:
        gens = dict(generate_all(ctx, prompts, 6, items=range(len(prompts)), keep_logits=True, prefills=prefills, ignore_eos=True, contain=True))
        cells = [read_cells(ctx, i % n_seq) for i in range(len(prompts))] if n_seq >= len(prompts) else [None] * len(prompts)
        items = [(gens[i].tokens, gens[i].logits, gens[i].faults, cells[i]) for i in range(len(prompts))]
        return items, ctx.realized.summary(), next(iter(ctx.hook.site_counts.values()))


def assert_same_items(restored: list, decoded: list) -> None:
    for (tokens, logits, faults, cells), (tokens0, logits0, faults0, cells0) in zip(restored, decoded):
        assert tokens == tokens0
        assert np.array_equal(logits, logits0, equal_nan=True)
        assert faults == faults0 and faults, "the same faults, each where it landed"
        if cells0 is not None:
            assert np.array_equal(cells[0], cells0[0]), "the same cells, in the same order"
            assert all(np.array_equal(cells[1][k], cells0[1][k], equal_nan=True) for k in cells0[1])


def assert_close(summary: dict, summary0: dict) -> None:
    assert summary.keys() == summary0.keys()
    for key, value in summary0.items():
        if isinstance(value, dict):
            assert_close(summary[key], value)
        elif isinstance(value, int):
            assert summary[key] == value, key
        else:
            assert math.isclose(summary[key], value, rel_tol=1e-12) or (math.isnan(value) and math.isnan(summary[key])), key


@pytest.mark.parametrize("n_seq", [1, 4])
@pytest.mark.parametrize("spec", SPECS)
def test_a_restored_prompt_gives_what_decoding_it_gives(tiny, spec, n_seq):
    cache = CacheOptions("f16", "f16", "off")
    prefills = Prefills()
    first = campaign(tiny, spec, 0, n_seq, prefills, cache)
    assert len(prefills._kept) == len(TEXTS), "every prompt kept by the first configuration"
    alone = campaign(tiny, spec, 0, n_seq, None, cache)
    assert_same_items(first[0], alone[0])  # keeping a snapshot changes nothing
    assert first[1] == alone[1]
    restored, decoded = campaign(tiny, spec, 1, n_seq, prefills, cache), campaign(tiny, spec, 1, n_seq, None, cache)
    assert restored[2] < decoded[2], "the prompts were restored, not decoded"
    assert_same_items(restored[0], decoded[0])
    assert_close(restored[1], decoded[1])


def test_a_bf16_cache_restores_its_own_prompts_only(tiny):
    f16, bf16 = CacheOptions("f16", "f16", "off"), CacheOptions("bf16", "bf16", "off")
    prefills = Prefills()
    campaign(tiny, "faults:1,bit=14,stage=generated", 0, 1, prefills, f16)
    spec = "faults:1,bit=14,format=bf16,stage=generated"
    restored, decoded = campaign(tiny, spec, 1, 1, prefills, bf16), campaign(tiny, spec, 1, 1, None, bf16)
    assert restored[2] == decoded[2], "an f16 cache's prompt is not a bf16 one's"
    assert_same_items(restored[0], decoded[0])


def test_faults_in_the_prompt_decode_it(tiny):
    prefills = Prefills()
    campaign(tiny, "faults:1,bit=14", 0, 1, prefills, CacheOptions("f16", "f16", "off"))
    assert not prefills._kept
