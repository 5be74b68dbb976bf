"""`kvinject report --board` (kvinject/analysis/board.py): every bench of a model pooled item by
item against its control, eviction placed by its ratio, quantizers by their bits."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from kvinject.analysis.board import board, layout
from kvinject.exceptions import KvinjectError

SINGLE = {"family": "single", "lengths": [4096]}
MULTIKEY = {"family": "multikey", "lengths": [4096]}


def record(error: str, options: dict, items: list[float], bits: float = 16.0, control: bool = False) -> dict:
    settings = {"model": "m.gguf", "model_sha256": "1" * 64, "bench": "niah", "error": error, "target": "kv", "layers": "all", "seed": 0}
    settings |= {"cache": {"type_k": "f16", "type_v": "f16", "flash_attn": "off", "kv_rotation": True}, "options": options, "control": control}
    return {"settings": settings, "label": error, "run": 0, "metrics": {"accuracy": float(np.mean(items)), "bits": bits}, "items": {"accuracy": items}}


def records() -> list[dict]:
    return [
        record("none", SINGLE, [1, 1, 1, 1], control=True),
        record("none", MULTIKEY, [1, 1, 0, 1], control=True),
        record("evict:knorm,0.75,decode=0,query=agnostic", SINGLE, [1, 0, 1, 1], bits=12.0),
        record("evict:knorm,0.75,decode=0,query=agnostic", MULTIKEY, [0, 1, 0, 0], bits=12.0),
        record("evict:knorm,0.25,decode=0,query=agnostic", SINGLE, [0, 0, 0, 0], bits=4.0),
        record("evict:knorm,0.25,decode=0,query=agnostic", MULTIKEY, [0, 0, 0, 0], bits=4.0),
        record("evict:knorm,0.5,alloc=ada,alpha=0.2,decode=0,query=agnostic", SINGLE, [1, 1, 1, 0], bits=8.0),
        record("evict:knorm,0.5,alloc=ada,alpha=0.2,decode=0,query=agnostic", MULTIKEY, [1, 1, 0, 0], bits=8.0),
        record("quant:4", SINGLE, [1, 1, 1, 1], bits=4.5),
        record("quant:4", MULTIKEY, [1, 1, 0, 1], bits=4.5),
        record("evict:window,0.5,decode=0", SINGLE, [1, 1, 1, 1], bits=8.0),  # not run on multikey: not on the board
    ]


def test_benches_are_pooled_item_by_item_against_their_controls():
    table = board(records()).set_index("configuration")
    row = table.loc["evict:knorm,0.75,decode=0,query=agnostic"]
    control = np.array([1, 1, 1, 1, 1, 1, 0, 1])
    scores = np.array([1, 0, 1, 1, 0, 1, 0, 0])
    assert row["items"] == 8 and row["score"] == scores.mean() and row["control"] == control.mean()
    # Exact McNemar: 3 items the control passes and this fails, 0 the other way.
    assert row["p"] == pytest.approx(stats.binomtest(3, 3, 0.5).pvalue)
    wilson = stats.binomtest(int(scores.sum()), len(scores)).proportion_ci(0.95, method="wilson")
    assert (row["low"], row["high"]) == pytest.approx((wilson.low, wilson.high))
    assert (row["row"], row["ratio"], row["placed"]) == ("knorm (agnostic)", 0.25, "ratio")
    assert "evict:window,0.5,decode=0" not in table.index, "a configuration must be on every bench of the model"
    assert table.loc["evict:knorm,0.5,alloc=ada,alpha=0.2,decode=0,query=agnostic", "row"] == "knorm+ada (agnostic)", "budgets per head: a row of its own"


def test_quantizers_go_to_the_ratio_of_their_bits():
    table = board(records()).set_index("configuration")
    assert table.loc["quant:4", "ratio"] == pytest.approx(1 - 4.5 / 16) and table.loc["quant:4", "placed"] == "bits"
    ((_, wide),) = layout(board(records()))
    wide = wide.set_index("method")
    assert list(wide.columns) == ["0.25", "0.5", "0.75"], "the eviction ratios"
    assert wide.loc["quant", "0.75"].startswith("0.88 ") and wide.loc["quant", "0.75"].endswith("@4.5b")
    assert wide.loc["knorm (agnostic)", "0.75"].endswith("↓"), "0 of 8 against 7 of 8: McNemar p = 1/64"
    assert not wide.loc["knorm (agnostic)", "0.25"].endswith("↓"), "p = 0.25: no mark"


def test_what_the_board_cannot_place_is_said_in_one_line():
    with pytest.raises(KvinjectError, match="compressed once"):
        board([record("none", SINGLE, [1], control=True), record("evict:h2o,0.5", SINGLE, [1], bits=8.0)])
    with pytest.raises(KvinjectError, match="lacks a control"):
        board([record("quant:4", SINGLE, [1], bits=4.5)])


def test_two_configurations_of_a_row_in_one_column_get_a_row_each():
    """KIVI's exact window costs bits: kivi:4 and kivi:2 may both fall nearest one ratio."""
    extra = [record(spec, options, [1, 1, 1, 1], bits=bits) for spec, bits in (("kivi:4", 5.2), ("kivi:2", 3.3)) for options in (SINGLE, MULTIKEY)]
    ((_, wide),) = layout(board(records() + extra))
    wide = wide.set_index("method")
    assert "kivi" not in wide.index and wide.loc["kivi:4", "0.75"].endswith("@5.2b") and wide.loc["kivi:2", "0.75"].endswith("@3.3b")
