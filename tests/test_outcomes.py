"""Fault-campaign outcomes: masked, benign, SDC and DUE per item against the golden run."""

import numpy as np
import pytest

from kvinject.batching import generate_all
from kvinject.benchmarks import make_bench
from kvinject.config import Configuration
from kvinject.error_models import Draws, parse_error
from kvinject.exceptions import InjectionError
from kvinject.options import CacheOptions
from kvinject.outcomes import classify
from kvinject.runner import run
from kvinject.target import Target

from .cache_state import read_cells
from .cli_runs import PNG, kvinject, swept


def test_each_item_gets_the_outcome_its_definition_says():
    golden = [[1, 2, 3], [1, 2, 3], [1, 2, 3], [1, 2, 3], [1, 2, 3]]
    tokens = [[1, 2, 3], [1, 2, 4], [1, 2, 4], [1, 2, 4], [1, 2, 3]]
    got = classify(golden, [1.0, 1.0, 0.0, 1.0, 1.0], tokens, [1.0, 0.0, 1.0, 1.0, 1.0], [False, False, False, False, True], higher_is_better=True)
    assert got == {
        "masked": [1, 0, 0, 0, 0],
        "sdc": [0, 1, 0, 0, 0],  # another output, a worse score
        "benign": [0, 0, 1, 1, 0],  # another output, no worse a score (better counts as benign)
        "due": [0, 0, 0, 0, 1],  # NaN/Inf logits, whatever the tokens
    }
    lower = classify(golden[:2], [2.0, 2.0], tokens[:2], [2.0, 3.0], [False, False], higher_is_better=False)
    assert lower["masked"] == [1, 0] and lower["sdc"] == [0, 1], "a higher perplexity-like score is worse"


def test_every_configuration_but_the_control_is_classified(tiny):
    bench = make_bench("nexttoken", {"limit": 6})
    configs = [Configuration(), Configuration.parse("normal:0,0"), Configuration.parse("normal:0,4")]
    control, silent, loud = run(tiny, [bench], configs, runs=1)
    assert "masked" not in control.extra and "due" not in control.items
    assert silent.extra["masked"] == 1 and silent.items["masked"] == [1.0] * 6, "no error: every output is the golden one"
    per_item = np.sum([loud.items[k] for k in ("masked", "benign", "sdc", "due")], axis=0)
    assert per_item.tolist() == [1.0] * 6, "one outcome per item"
    assert loud.extra["masked"] < 1


@pytest.mark.parametrize("bit", [0, 10, 15])
def test_bitflip_at_one_bit_flips_only_that_bit(bit):
    x = np.random.default_rng(0).standard_normal((200, 64)).astype(np.float32)
    model = parse_error(f"bitflip:0.1,bit={bit}")
    y = x.copy()
    model.apply(y, Draws(model.draw, np.random.default_rng(1)))
    flipped = x.astype(np.float16).view(np.uint16) ^ y.astype(np.float16).view(np.uint16)
    assert set(np.unique(flipped).tolist()) == {0, 1 << bit}
    assert np.mean(flipped != 0) == pytest.approx(0.1, abs=0.01)
    assert np.array_equal(model.unchanged(x) != y, flipped != 0), "realized statistics see the flips, not the rounding"
    assert model.spec == f"bitflip:0.1,field=any,bit={bit}" and parse_error("bitflip:0.1").spec == "bitflip:0.1,field=any", (
        "specs without bit= stay as they were"
    )


def test_faults_flip_exactly_k_values_of_each_prompt_and_nothing_else(tiny):
    """An f16 cache holds what the hook wrote exactly: in the last layer (whose K/V no other
    cached value depends on), each item's prompt rows differ from the control's in exactly K
    values, each by the chosen bit; the first layer is untouched."""
    cache = CacheOptions("f16", "f16", "on")
    prompts = [tiny.tokenize("The quick brown fox jumps over the lazy dog."), tiny.tokenize("One two three four five six seven eight nine ten eleven.")]
    caches, realized = {}, {}
    for spec in ("none", "faults:3,bit=14"):
        with tiny.context(cache, parse_error(spec), Target.parse("kv", "1"), seed=5, n_ctx=128) as ctx:
            caches[spec] = [read_cells(ctx) for _ in generate_all(ctx, prompts, 4, items=[0, 1])]
            realized[spec] = ctx.realized.summary()
    # The realized statistics count the faults, not the rounding to fp16 they start from.
    assert sum(realized["faults:3,bit=14"][c]["changed"] for c in "kv") == 3 * len(prompts)
    for i, prompt in enumerate(prompts):
        (clean_pos, clean), (faulty_pos, faulty) = caches["none"][i], caches["faults:3,bit=14"][i]
        rows = {name: np.argsort(pos)[: len(prompt)] for name, pos in (("clean", clean_pos), ("faulty", faulty_pos))}

        def bits(c, layer):
            a, b = clean[c, layer][rows["clean"]], faulty[c, layer][rows["faulty"]]
            return a.astype(np.float16).view(np.uint16) ^ b.astype(np.float16).view(np.uint16)

        assert not any(bits(c, 0).any() for c in "kv"), "the first layer is untouched"
        flips = np.concatenate([bits(c, 1).ravel() for c in "kv"])
        # A flip that makes a NaN is stored quieted: fp16's quiet bit (9) set by the conversions.
        assert np.count_nonzero(flips) == 3 and set(flips[flips != 0].tolist()) <= {1 << 14, 1 << 14 | 1 << 9}


def test_faults_need_an_item_s_prompt(tiny):
    with tiny.context(error=parse_error("faults:1")) as ctx, pytest.raises(InjectionError, match="run it through a benchmark"):
        ctx.prefill(tiny.tokenize("Hello there"))


def test_report_draws_the_outcomes_of_a_campaign(tmp_path, tiny_path):
    store = swept(
        tmp_path, f'[sweep]\nmodels = ["{tiny_path}"]\nruns = 1\n\n[bench.nexttoken]\nlimit = 4\n\n[[errors]]\nspec = ["faults:2,bit=14", "faults:2,bit=3"]\n'
    )
    png = tmp_path / "outcomes.png"
    out = kvinject("report", store, "--outcomes", png)
    assert out.returncode == 0, out.stderr
    assert png.read_bytes()[:8] == PNG
