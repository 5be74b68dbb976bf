"""Fault-campaign outcomes: masked, benign, SDC and DUE per item against the golden run."""

import numpy as np
import pytest

from kvinject.benchmarks import make_bench
from kvinject.config import Configuration
from kvinject.error_models import Draws, parse_error
from kvinject.outcomes import classify
from kvinject.runner import run


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
    assert model.spec == f"bitflip:0.1,field=any,bit={bit}" and parse_error("bitflip:0.1").spec == "bitflip:0.1,field=any", (
        "specs without bit= stay as they were"
    )
