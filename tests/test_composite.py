"""Composite configurations against real llama.cpp on the tiny model (2 layers, 2 KV heads).

One prompt decoded in one llama_decode: layer 0's K and V are computed from the embeddings
alone, so each part's values there must be bit for bit what the part alone writes on its own
target, and what no part covers must be the control's. Layer 1's K and V enter after layer 0's
error has flowed through attention: where one part covers layer 0 and another layer 1, layer 1's
cache must be the second part's model applied to what the first part alone leaves there.
"""

from __future__ import annotations

import numpy as np
import pytest

from kvinject.engine.cache_bits import cache_bits
from kvinject.engine.context import Context
from kvinject.engine.options import CacheOptions
from kvinject.engine.target import Target
from kvinject.error_models import parse_error
from kvinject.error_models.composite import Composite, parse_where
from kvinject.error_models.configuration import Configuration
from kvinject.exceptions import KvinjectError, SpecError

from .cache_state import read_cells
from .tiny_model import HEAD_DIM

PROMPT = "The quick brown fox jumps over the lazy dog while the cat watches from the warm window sill."
F32 = CacheOptions("f32", "f32", "off")
KIVI = "kivi:2,group=4,residual=8"


def cache_of(model, spec: str, target: Target | None = None) -> dict[tuple[str, int], dict[int, np.ndarray]]:
    """The f32 cache after the prompt, decoded in one llama_decode: {(component, layer): {position: row}}."""
    config = Configuration.parse(spec, target, F32)
    with Context(model, F32, config.error, config.target, n_ctx=128) as ctx:
        tokens = model.tokenize(PROMPT)
        ctx.begin_item(0, 0, len(tokens))
        ctx.prefill(tokens)
        positions, cache = read_cells(ctx)
        return {site: dict(zip(positions.tolist(), rows)) for site, rows in cache.items()}


def rows(cache, site, positions=None) -> np.ndarray:
    held = cache[site]
    return np.array([held[p] for p in (positions if positions is not None else sorted(held))])


def heads(target: Target) -> np.ndarray:
    """The columns of a row of the tiny model's KV heads that ``target`` selects."""
    cols = target.columns(2 * HEAD_DIM, 2)
    return np.ones(2 * HEAD_DIM, bool) if cols is None else cols


# (composite, its parts as specs on their own targets): a pair of families each.
PAIRS = [
    ("quant:4[k]+float:e4m3[v]", [("quant:4", "k"), ("float:e4m3", "v")]),
    (f"{KIVI}[k]+float:e5m2[v]", [(KIVI, "k"), ("float:e5m2", "v")]),
    ("mantissa:3[v heads:0]+quant:3[v heads:1]", [("mantissa:3", "v heads:0"), ("quant:3", "v heads:1")]),
    ("quant:8[kv:0]+quant:2[kv:1]", [("quant:8", "kv:0"), ("quant:2", "kv:1")]),
    ("float:e2m1[k:0]+kivi:3,group=4,residual=8[v:1]", [("float:e2m1", "k:0"), ("kivi:3,group=4,residual=8", "v:1")]),
]


@pytest.mark.parametrize("spec,parts", PAIRS, ids=[p[0] for p in PAIRS])
def test_each_part_changes_its_own_values_as_it_does_alone(tiny, spec, parts):
    composite, clean = cache_of(tiny, spec), cache_of(tiny, "none")
    alone = [(model, parse_where(where, where), cache_of(tiny, f"{model}[{where}]")) for model, where in parts]
    covered = {(c, il): np.zeros(2 * HEAD_DIM, bool) for c in "kv" for il in range(2)}
    for _, target, own in alone:
        for c in target.components:
            if target.wants(c, 0):  # layer 0: what entered is the control's in every run
                cols = heads(target)
                assert np.array_equal(rows(composite, (c, 0))[:, cols], rows(own, (c, 0))[:, cols]), (spec, c)
                covered[c, 0] |= cols
    for c in "kv":  # and nothing else at layer 0 changed
        rest = ~covered[c, 0]
        assert np.array_equal(rows(composite, (c, 0))[:, rest], rows(clean, (c, 0))[:, rest]), (spec, c)
    first, second = alone
    if first[1].layers == {0} and second[1].layers == {1}:  # layer 1 entered as the first part alone left it
        model, target = parse_error(second[0]), second[1]
        for c in target.components:
            entered = rows(first[2], (c, 1))
            expect = _applied(model, entered, c)
            assert np.array_equal(rows(composite, (c, 1)), expect), (spec, c)


def _applied(model, entered: np.ndarray, component: str) -> np.ndarray:
    """A part's model applied to one layer's rows as they entered: an entry model to each row,
    KIVI as its test's reference (the prompt as one decode)."""
    if model.at_entry is not None:
        x = entered.copy()
        model.at_entry.apply_at(x, None, component, 1)
        return x
    from .test_kivi import kivi_reference

    return kivi_reference(entered, component, model.bits, model.group, model.residual)


def test_eviction_stacked_on_a_quantizer_keeps_its_tokens_with_the_quantizer_s_values(tiny):
    """streaming keeps tokens by position: the tokens the stack keeps are eviction's alone, and
    their values are the quantizer's alone."""
    stack, quant, evict = (cache_of(tiny, s) for s in ("quant:3+evict:streaming,8", "quant:3", "evict:streaming,8"))
    assert sorted(stack["k", 0]) == sorted(evict["k", 0]) and len(stack["k", 0]) == 8
    for c in "kv":
        kept = sorted(stack[c, 0])
        assert np.array_equal(rows(stack, (c, 0)), rows(quant, (c, 0), kept))


def test_a_random_part_draws_its_law_and_the_other_part_is_exact(tiny):
    composite, quant, clean = cache_of(tiny, "normal:0,0.25[k]+quant:4[v]"), cache_of(tiny, "quant:4[v]"), cache_of(tiny, "none")
    assert np.array_equal(rows(composite, ("v", 0)), rows(quant, ("v", 0)))
    x, y = rows(clean, ("k", 0)), rows(composite, ("k", 0))
    rel = (y - x) / x
    assert abs(rel.mean()) < 0.02 and rel.std() == pytest.approx(0.25, rel=0.05)


@pytest.mark.parametrize(
    "spec,canonical",
    [
        ("kivi:2[k] + float:e4m3[v]", "kivi:2,group=32,residual=128[k]+float:e4m3,block=0[v]"),
        ("quant:8[KV:0-3] +quant:3[kv:4-9]", "quant:8,group=32[kv:0-3]+quant:3,group=32[kv:4-9]"),
        ("quant:4[v:all heads:0]+quant:2[v heads:1]", "quant:4,group=32[v heads:0]+quant:2,group=32[v heads:1]"),
        ("normal:0,1e+3[k]+quant:4[v]", "normal:0,1000[k]+quant:4,group=32[v]"),
        ("quant:3+evict:streaming,8", "quant:3,group=32+evict:streaming,8,sinks=4"),
    ],
)
def test_a_composite_spec_round_trips_and_is_its_store_key(spec, canonical):
    config = Configuration.parse(spec)
    assert isinstance(config.error, Composite) and config.error.spec == canonical
    assert Configuration.parse(canonical) == config == Configuration.from_dict(config.to_dict())
    assert config.to_dict()["error"] == canonical


def test_one_part_is_that_model_on_its_target():
    assert Configuration.parse("quant:4[k:0-1]") == Configuration.parse("quant:4", Target.parse("k", "0-1"))
    assert Configuration.parse("quant:4[k:0-1]").to_dict()["error"] == "quant:4,group=32"


@pytest.mark.parametrize(
    "spec,target,message",
    [
        ("quant:4+quant:3", None, "both change the same values"),
        ("quant:4[k:0-3]+float:e4m3[k:3-5]", None, "both change the same values"),
        ("quant:4[v heads:0,1]+float:e4m3[v heads:1]", None, "both change the same values"),
        ("kivi:2+evict:knorm,0.5", None, "eviction would break"),
        ("normal:0,0.1[k]+uniform:0,0.1[v]", None, "at most one part may draw"),
        ("none[k]+quant:4[v]", None, "leave it out"),
        ("faults:1[k]+quant:4[v]", None, "run fault models on their own"),
        ("quant:4[x]+quant:3[v]", None, "must start with k, v or kv"),
        ("quant:4[k:0-3 foo:1]+quant:3[v]", None, "only heads:HEADS may follow"),
        ("quant:4[k:3-0]+quant:3[v]", None, "counts down"),
        ("quant:4[k]+", None, "joined by +"),
        ("quant:4[k]+quant:3[v]", Target.parse("k"), "leave out --target"),
        ("evict:knorm,0.5[k]+quant:3[v]", None, "leave --target and --layers"),
    ],
)
def test_what_cannot_combine_is_refused_in_one_line(spec, target, message):
    with pytest.raises(SpecError, match=message) as e:
        Configuration.parse(spec, target)
    assert "\n" not in str(e.value).split("valid form")[0].strip()


def test_a_part_names_a_layer_the_model_lacks_before_anything_runs(tiny):
    config = Configuration.parse("quant:4[k:0]+quant:3[v:5]")
    with pytest.raises(SpecError, match="layer 5"):
        config.check(tiny.shape)


def test_bits_per_element_weigh_each_part_by_what_it_covers(tiny):
    """quant:8 on layer 0 and quant:2 on layer 1: the mean of the two models' bits over every
    layer; eviction stacked on a quantizer scales the quantizer's bits by the share kept."""
    m = tiny.shape
    dims = (m.n_layer, m.n_head_kv, m.head_dim_k, m.head_dim_v)

    def bits(spec: str) -> float:
        config = Configuration.parse(spec)
        return cache_bits(config.error, config.target, config.cache, *dims)

    assert bits("quant:8[kv:0]+quant:2[kv:1]") == pytest.approx((bits("quant:8") + bits("quant:2")) / 2, rel=1e-12)
    assert bits("quant:4[k]+float:e4m3[v]") == pytest.approx((bits("quant:4") + bits("float:e4m3")) / 2, rel=1e-12)
    assert bits("quant:3[v heads:0]+quant:3[v heads:1]") == pytest.approx(bits("quant:3[v]"), rel=1e-12)
    assert bits("quant:4+evict:knorm,0.5") == pytest.approx(bits("quant:4") / 2, rel=1e-12)


def test_a_composite_runs_in_generation_and_measures_each_component(tiny):
    from kvinject.engine.generation.batching import generate_all

    config = Configuration.parse(f"{KIVI}[k]+float:e4m3[v]", cache=F32)
    with Context(tiny, F32, config.error, config.target, n_ctx=256, n_seq=2, n_batch=8) as ctx:
        out = dict(generate_all(ctx, [tiny.tokenize(PROMPT), tiny.tokenize("A short one")], 12, ignore_eos=True))
        realized = ctx.realized
    assert sorted(out) == [0, 1] and realized.k.changed > 0 and realized.v.changed > 0


def test_each_part_s_realized_error_is_its_own_and_they_add_up_to_the_whole(tiny):
    """quant:8 on layer 0 and quant:2 on layer 1 (entry), then KIVI's V beside e4m3's K (entry
    and resident) and two heads of one V: each part's statistics count its own values only,
    and the parts' counts add up to the component's."""
    from kvinject.engine.generation.batching import generate_all

    for spec, coarse in (("quant:8[kv:0]+quant:2[kv:1]", 1), (f"float:e4m3[k]+{KIVI}[v]", None), ("quant:8[v heads:0]+quant:2[v heads:1]", 1)):
        config = Configuration.parse(spec, cache=F32)
        with Context(tiny, F32, config.error, config.target, n_ctx=256, n_batch=8) as ctx:
            dict(generate_all(ctx, [tiny.tokenize(PROMPT)], 10, ignore_eos=True))
            summary = ctx.realized.summary()
        parts = summary["parts"]
        assert sorted(parts) == ["0", "1"]
        for c in "kv":
            assert sum(p[c]["values"] for p in parts.values()) == summary[c]["values"]
            assert sum(p[c]["changed"] for p in parts.values()) == summary[c]["changed"]
        if coarse is not None:  # the 2-bit part errs more than the 8-bit one
            c = "v"
            assert parts[str(coarse)][c]["snr_db"] < parts["0"][c]["snr_db"] - 20
        else:
            assert parts["0"]["v"]["values"] == 0 and parts["1"]["k"]["values"] == 0 and parts["1"]["v"]["changed"] > 0


def test_grids_and_lm_eval_take_a_composite_as_they_take_any_spec(tmp_path):
    from kvinject.experiments.grid import build_grid
    from kvinject.lmeval.settings import Settings

    spec = "quant:8[kv:0]+quant:2[kv:1]"
    grid = build_grid(tmp_path / "g.toml", {"bench": {"nexttoken": {"limit": 2}}, "errors": [{"spec": [spec, "kivi:2[k]+float:e4m3[v]"]}]})
    labels = [c.config.error.spec for c in grid.cells if not c.control]
    assert labels == ["quant:8,group=32[kv:0]+quant:2,group=32[kv:1]", "kivi:2,group=32,residual=128[k]+float:e4m3,block=0[v]"]
    assert Settings.parse({"error": spec}).configuration == Configuration.parse(spec)
    with pytest.raises(KvinjectError, match="both change the same values"):
        build_grid(tmp_path / "g.toml", {"bench": {"nexttoken": {}}, "errors": [{"spec": ["quant:8+quant:2"]}]})


def test_a_profile_refuses_a_composite_before_it_opens_the_model():
    from kvinject.benchmarks import make_bench
    from kvinject.engine.options import BackendOptions
    from kvinject.experiments.profile import profile_grid

    with pytest.raises(KvinjectError, match="is a composite of several: give one"):
        profile_grid("/nonexistent.gguf", make_bench("nexttoken", {"limit": 1}), set(), [parse_error("quant:4[k]+quant:2[v]")], F32, BackendOptions())
