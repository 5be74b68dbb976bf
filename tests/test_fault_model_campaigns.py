"""Fault models in a campaign: recorded per item, mapped, DUE where ECC detects, and replayed."""

from __future__ import annotations

import json

import pytest

from kvinject.analysis.faults import fault_map
from kvinject.analysis.report import control_of, load_records
from kvinject.error_models.configuration import Configuration
from kvinject.experiments.replay import replay

from .cli_runs import kvinject, swept
from .tiny_model import TINY

SPECS = [
    "faults:1,kind=double",
    "faults:1,kind=adjacent",
    "faults:1,kind=burst,bits=6",
    "faults:1,kind=random",
    "faults:1,kind=zero",
    "faults:1,kind=stuck1",
    "faults:1,kind=word",
    "faults:1,kind=double,ecc=secded",
    "faults:1,kind=word,ecc=secded",
    "faults:1,ecc=secded",
    "faults:1,kind=burst,bits=6,ecc=secded@q8_0",
]


@pytest.fixture(scope="module")
def campaign(tmp_path_factory, tiny_path):
    errors = ", ".join(f'"{s}"' for s in SPECS)
    grid = f'[sweep]\nmodels = ["{tiny_path}"]\nruns = 1\n\n[bench.nexttoken]\nlimit = 6\n\n[[errors]]\nspec = [{errors}]\n'
    store = swept(tmp_path_factory.mktemp("campaign"), grid)
    return store, load_records([store])


def test_each_fault_model_is_recorded_and_mapped(campaign):
    _, records = campaign
    treated = {r["settings"]["error"]: r for r in records if not r["settings"]["control"]}
    assert len(treated) == len(SPECS)
    for spec, record in treated.items():
        assert all(len(item) == 1 and item[0]["kind"] == (spec.split("kind=")[1].split(",")[0] if "kind=" in spec else "flip") for item in record["faults"])
        assert all(("ecc" in item[0]) == ("ecc=secded" in spec) for item in record["faults"])
    # SECDED detects every double-bit error in a word: each item DUE, its cause the detection.
    detected = next(r for s, r in treated.items() if s.startswith("faults:1,field=any,kind=double,ecc"))
    assert detected["items"]["due"] == [1.0] * 6 and detected["items"]["due_ecc_detected"] == [1.0] * 6
    corrected = next(r for s, r in treated.items() if s == "faults:1,field=any,ecc=secded")
    assert corrected["items"]["masked"] == [1.0] * 6, "every single flip corrected"
    table = fault_map(records, ["field"])
    assert table["faults"].sum() == 6 * len(SPECS)
    assert table.loc[table["field"] == "sign+exponent+mantissa", "faults"].sum() >= 6 * 2, "whole values: random and zero"


@pytest.mark.parametrize("spec", SPECS)
def test_a_fault_model_s_item_replays_as_recorded(campaign, spec):
    store, records = campaign
    record = next(r for r in records if r["label"] == Configuration.parse(spec).label)
    # the item the fault changed most: one not masked where there is one
    item = next((i for i, m in enumerate(record["items"]["masked"]) if not m), 0)
    replayed = replay(record, control_of(records, record), item)
    assert replayed.same, (replayed.faults, replayed.recorded_faults, replayed.outcome, replayed.recorded_outcome)
    assert replayed.faults == record["faults"][item]


def test_fit_scales_each_factor_by_the_cache_s_bits(campaign):
    """--fit-per-mbit R --ctx N: a whole cache's SDC and DUE FIT are R times its Mbit (2^20 bits:
    layers x KV heads x (K + V head size) x N tokens x bits a value) times the factor, its
    interval the factor's alike; a map by layer splits it into rows that add up to it."""
    store, _ = campaign
    whole = json.loads(kvinject("report", store, "--faults", "format", "--fit-per-mbit", 1000, "--ctx", 4096, "--format", "json").stdout)
    assert len(whole) == len(SPECS)
    for row in whole:
        mbit = TINY.n_layer * TINY.n_head_kv * 2 * TINY.head_dim * 4096 * {"f16": 16, "q8_0": 8.5}[row["format"]] / 2**20
        assert row["mbit"] == pytest.approx(mbit)
        for o in ("sdc", "due"):
            assert row[f"{o}_fit"] == pytest.approx(1000 * mbit * row[o])
            assert row[f"{o}_fit_low"] == pytest.approx(1000 * mbit * row[f"{o}_low"]) and row[f"{o}_fit_high"] == pytest.approx(1000 * mbit * row[f"{o}_high"])
    by_layer = json.loads(kvinject("report", store, "--faults", "layer", "--fit-per-mbit", 1000, "--ctx", 4096, "--format", "json").stdout)
    for row in whole:
        parts = [r for r in by_layer if (r["format"], r["kind"], r["ecc"]) == (row["format"], row["kind"], row["ecc"])]
        assert sum(r["due_fit"] for r in parts) == pytest.approx(row["due_fit"]) and sum(r["mbit"] for r in parts) == pytest.approx(row["mbit"])
    alone = kvinject("report", store, "--fit-per-mbit", 1000, "--ctx", 4096)
    assert alone.returncode == 2 and "give --faults too" in alone.stderr
    half = kvinject("report", store, "--faults", "format", "--fit-per-mbit", 1000)
    assert half.returncode == 2 and "--fit-per-mbit and --ctx go together" in half.stderr
