"""Single-fault campaigns read per fault: campaign size, the recorded sites, and the maps."""

from __future__ import annotations

import json

import pytest
from scipy.stats import binomtest

from kvinject.analysis.faults import campaign_size, fault_map
from kvinject.exceptions import KvinjectError
from kvinject.experiments.store import Store

from .cli_runs import kvinject, swept
from .tiny_model import N_HEAD_KV, TINY


@pytest.mark.parametrize(
    "margin, confidence, population, n",
    [
        # Krejcie and Morgan's table (1970), the finite-population formula Leveugle et al. use, at ±5% and 95%
        (0.05, 0.95, 100, 80),
        (0.05, 0.95, 1000, 278),
        (0.05, 0.95, 10000, 370),
        (0.05, 0.95, None, 385),  # 384.1 for an unbounded population
        (0.03, 0.95, None, 1068),  # 1067.1: ±3% at 95%, as issue 34's campaign
        (0.01, 0.99, None, 16588),  # 2.5758² / 4 / 0.01² = 16587.2
    ],
)
def test_campaign_size_follows_the_finite_population_formula(margin, confidence, population, n):
    assert campaign_size(margin, confidence, population) == n


def test_campaign_size_refuses_shares_out_of_range():
    with pytest.raises(KvinjectError, match="margin is a share"):
        campaign_size(3)
    with pytest.raises(KvinjectError, match="confidence is in"):
        campaign_size(0.03, 95)


def _record(bench: str, faults, outcomes: list[str]) -> dict:
    return {
        "settings": {"model": "m.gguf", "bench": bench},
        "faults": faults,
        "items": {o: [float(x == o) for x in outcomes] for o in ("masked", "benign", "sdc", "due")},
    }


def _site(bit: int, layer: int = 0, kv: str = "k") -> dict:
    return {
        "layer": layer,
        "kv": kv,
        "position": 3,
        "head": 0,
        "element": 5,
        "bit": bit,
        "field": "exponent" if 10 <= bit <= 14 else "mantissa",
        "format": "f16",
    }


def test_a_map_counts_each_single_fault_once_with_wilson_intervals():
    records = [
        _record("ifeval", [[_site(14)], [_site(14)], [_site(3)], [_site(14), _site(3)]], ["sdc", "due", "masked", "sdc"]),
        _record("ifeval", [[_site(14, 1)], [_site(3, 1)]], ["masked", "benign"]),
        _record("ifeval", None, ["masked", "masked"]),  # the control: no faults
    ]
    by_bit = fault_map(records, ["bit"]).set_index("bit")
    assert by_bit["faults"].to_dict() == {3: 2, 14: 3}, "the item with two faults is left out"
    assert by_bit.loc[14, ["masked", "sdc", "due"]].tolist() == pytest.approx([1 / 3, 1 / 3, 1 / 3])
    assert by_bit.loc[3, ["masked", "benign"]].tolist() == [0.5, 0.5]
    wilson = binomtest(1, 3).proportion_ci(0.95, method="wilson")
    assert by_bit.loc[14, "sdc_ci"] == pytest.approx([wilson.low, wilson.high])
    by_layer_kv = fault_map(records, ["layer", "kv"])
    assert by_layer_kv[["layer", "kv", "faults"]].values.tolist() == [[0, "k", 3], [1, "k", 2]]
    assert set(by_layer_kv["format"]) == {"f16"}, "every map names the stored format"
    with pytest.raises(KvinjectError, match="--faults draws maps by bit, field"):
        fault_map(records, ["colour"])
    with pytest.raises(KvinjectError, match="no single-fault injections"):
        fault_map(records[2:], ["bit"])


def test_a_campaign_records_every_fault_and_report_maps_them(tmp_path, tiny_path):
    store = swept(tmp_path, f'[sweep]\nmodels = ["{tiny_path}"]\nruns = 3\n\n[bench.nexttoken]\nlimit = 8\n\n[[errors]]\nspec = ["faults:1"]\n')
    with Store(store, readonly=True) as s:
        records = [r for r in s.records() if not r["settings"]["control"]]
    sites = [site for r in records for item in r["faults"] for site in item]
    assert len(records) == 3 and all(len(item) == 1 for r in records for item in r["faults"]) and len(sites) == 3 * 8
    assert {s["kv"] for s in sites} <= {"k", "v"} and all(0 <= s["layer"] < TINY.n_layer and 0 <= s["head"] < N_HEAD_KV for s in sites)
    assert all(0 <= s["bit"] < 16 and s["format"] == "f16" for s in sites)
    out = kvinject("report", store, "--faults", "field", "--format", "json")
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    assert sum(r["faults"] for r in rows) == 3 * 8
    assert all(r["masked"] + r["benign"] + r["sdc"] + r["due"] == pytest.approx(1) and r["sdc_low"] <= r["sdc"] <= r["sdc_high"] for r in rows)
    table = kvinject("report", store, "--faults", "bit")
    assert table.returncode == 0 and "1068 faults a row" in table.stdout, table.stderr
    mixed = kvinject("report", store, "--faults", "bit", "--plot", tmp_path / "x.png")
    assert mixed.returncode == 2 and "--faults prints a map of its own: give --plot in another report" in mixed.stderr
