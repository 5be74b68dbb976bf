"""Single-fault campaigns read per fault: campaign size, the recorded sites, and the maps."""

from __future__ import annotations

import json
import sqlite3

import numpy as np
import pytest
from scipy.stats import binomtest, chisquare

from kvinject.analysis.faults import fault_map, machine, readable
from kvinject.error_models import parse_error
from kvinject.exceptions import KvinjectError
from kvinject.experiments.campaign import campaign_margin, campaign_size
from kvinject.experiments.store import Store

from .cli_runs import PNG, kvinject, swept
from .tiny_model import N_HEAD_KV, TINY


@pytest.mark.parametrize(
    "margin, confidence, population, n",
    [
        # Krejcie and Morgan's table (1970), the finite-population formula Leveugle et al. use, at ±5% and 95%
        (0.05, 0.95, 100, 80),
        (0.05, 0.95, 1000, 278),
        (0.05, 0.95, 10000, 370),
        (0.05, 0.95, None, 385),  # 384.1 for an unbounded population
        (0.03, 0.95, None, 1068),  # 1067.1: ±3% at 95%, as examples/fault-campaign.toml's
        (0.01, 0.99, None, 16588),  # 2.5758² / 4 / 0.01² = 16587.2
    ],
)
def test_campaign_size_follows_the_finite_population_formula(margin, confidence, population, n):
    assert campaign_size(margin, confidence, population) == n


@pytest.mark.parametrize(
    "spec, bits_per_value, values",
    [
        ("faults:1,format=f16", 16, range(0, 64)),
        ("faults:1,field=exponent,format=bf16", 8, range(0, 64)),
        ("faults:1,format=q8_0", 8 + 16 / 32, range(0, 64)),  # a block: 32 codes of 8 bits and a 16-bit scale
        ("faults:1,field=scale,format=q4_0", 16 / 32, range(0, 64)),
        ("faults:1,field=code,format=q4_0,stage=generated", 4, range(64, 128)),
        ("faults:1,field=sign,format=f32,stage=any", 1, range(0, 128)),
    ],
)
def test_faults_are_drawn_uniformly_over_every_bit_they_may_hit(spec, bits_per_value, values):
    """Over many items' draws (a prompt writing 64 values, its generated tokens 64 more), each
    (value, bit) the spec allows is hit equally often (chi-square against the uniform, 30 expected
    per site), and only values of its stage: the space a campaign samples."""
    model = parse_error(spec)
    sites = int(len(values) * bits_per_value)
    rng = np.random.default_rng(7)
    hits: dict[tuple[int, int], int] = {}
    for _ in range(30 * sites):
        masks = model.stream(rng, (64, 64)).take(128)
        (value,) = np.nonzero(masks)[0]
        hits[value, int(masks[value])] = hits.get((value, int(masks[value])), 0) + 1
    assert len(hits) == sites and {v for v, _ in hits} <= set(values)
    assert chisquare(list(hits.values())).pvalue > 0.001


@pytest.mark.parametrize("injections, confidence", [(1068, 0.95), (385, 0.95), (16588, 0.99)])
def test_a_campaign_s_size_reaches_its_margin(injections, confidence):
    """campaign_margin inverts the formula for an unbounded population: the sizes above are the
    fewest injections that reach ±3%, ±5% and ±1%."""
    margin = {1068: 0.03, 385: 0.05, 16588: 0.01}[injections]
    assert campaign_margin(injections, confidence) <= margin < campaign_margin(injections - 1, confidence)


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


def test_a_map_counts_each_cause_of_due():
    record = _record("nexttoken", [[_site(14)], [_site(14)], [_site(14)], [_site(3)]], ["due", "due", "due", "masked"])
    record["items"] |= {"due_nonfinite": [1.0, 0, 0, 0], "due_raised": [0, 1.0, 0, 0], "due_timeout": [0, 0, 1.0, 0]}
    record["items"]["due"] = [1.0, 1.0, 1.0, 0]
    table = fault_map([record], ["bit"])
    assert readable(table, 3).set_index("bit")["due_cause"].to_dict() == {3: "", 14: "nonfinite 1, raised 1, timeout 1"}
    assert machine(table).set_index("bit").loc[14, ["due", "due_nonfinite", "due_raised", "due_timeout"]].tolist() == pytest.approx([1, 1 / 3, 1 / 3, 1 / 3])


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
    assert by_bit.loc[14, ["due_nonfinite", "due_raised", "due_timeout"]].tolist() == pytest.approx([1 / 3, 0, 0]), "before causes: NaN/Inf"
    with pytest.raises(KvinjectError, match="--faults draws maps by bit, field"):
        fault_map(records, ["colour"])
    with pytest.raises(KvinjectError, match="no single-fault injections"):
        fault_map(records[2:], ["bit"])


def test_a_campaign_records_every_fault_and_report_maps_them(tmp_path, tiny_path):
    """A grid's margin sizes the campaign: ±20% at 95% takes 25 injections (1.96² / 4 / 0.2²
    = 24.01), 4 runs of 8 items, where the grid's runs say 1; the dry run says so."""
    grid = f'[sweep]\nmodels = ["{tiny_path}"]\nruns = 1\nmargin = 0.2\n\n[bench.nexttoken]\nlimit = 8\n\n[[errors]]\nspec = ["faults:1"]\n'
    (tmp_path / "grid.toml").write_text(grid)
    dry = kvinject("sweep", tmp_path / "grid.toml", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "fault campaign: 32 injections (items x runs) in each configuration placing faults, a rate within ±17.3% at 95%" in dry.stdout
    store = swept(tmp_path, grid)
    with Store(store, readonly=True) as s:
        records = [r for r in s.records() if not r["settings"]["control"]]
    sites = [site for r in records for item in r["faults"] for site in item]
    assert len(records) == 4 and all(len(item) == 1 for r in records for item in r["faults"]) and len(sites) == 4 * 8
    assert {s["kv"] for s in sites} <= {"k", "v"} and all(0 <= s["layer"] < TINY.n_layer and 0 <= s["head"] < N_HEAD_KV for s in sites)
    assert all(0 <= s["bit"] < 16 and s["format"] == "f16" for s in sites)
    out = kvinject("report", store, "--faults", "field", "--format", "json")
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    assert sum(r["faults"] for r in rows) == 4 * 8
    assert all(r["masked"] + r["benign"] + r["sdc"] + r["due"] == pytest.approx(1) and r["sdc_low"] <= r["sdc"] <= r["sdc_high"] for r in rows)
    table = kvinject("report", store, "--faults", "bit")
    assert table.returncode == 0 and "1068 faults a row" in table.stdout, table.stderr
    drawn = kvinject("report", store, "--faults", "field,bit", "--plot", tmp_path / "map.png")
    assert drawn.returncode == 0 and (tmp_path / "map.png").read_bytes()[:8] == PNG and "fault map written to" in drawn.stderr, drawn.stderr
    mixed = kvinject("report", store, "--faults", "bit", "--outcomes", tmp_path / "x.png")
    assert mixed.returncode == 2 and "--faults prints a map of its own (--plot draws it): give --outcomes in another report" in mixed.stderr
    # A recorded fault replayed alone: the item decoded by itself lands it where recorded, with the recorded tokens and outcome.
    record = next(r for r in records if r["run"] == 2)
    out = kvinject("replay", store, "--item", 5, "--run", 2, "--format", "json")
    assert out.returncode == 0, out.stderr
    replayed = json.loads(out.stdout)
    assert replayed["same"] and replayed["faults"] == record["faults"][5] and replayed["tokens"] == record["outputs"][5]
    assert replayed["outcome"] == next(o for o in ("masked", "benign", "sdc", "due") if record["items"][o][5])
    ambiguous = kvinject("replay", store, "--item", 5)
    assert ambiguous.returncode == 2 and "4 runs that recorded faults match" in ambiguous.stderr and "--run" in ambiguous.stderr


def test_each_cache_gets_its_golden_run_where_the_grid_asks(tmp_path, tiny_path):
    """sweep.control_per_cache: a configuration is compared with the control of its own cache
    types, so an error that changes nothing leaves every item masked in a q8_0 cache as in an
    f16 one (against the f16 control, the q8_0 items would differ by quantization alone)."""
    grid = (
        f'[sweep]\nmodels = ["{tiny_path}"]\nruns = 1\ncaches = ["f16", "q8_0"]\ncontrol_per_cache = true\n\n'
        '[bench.nexttoken]\nlimit = 8\n\n[[errors]]\nspec = ["normal:0,0"]\n'
    )
    with Store(swept(tmp_path, grid), readonly=True) as s:
        records = list(s.records())
    controls = {r["settings"]["cache"]["type_k"] for r in records if r["settings"]["control"]}
    assert controls == {"f16", "q8_0"}
    treated = {r["settings"]["cache"]["type_k"]: r for r in records if not r["settings"]["control"]}
    assert set(treated) == {"f16", "q8_0"}
    assert all(r["settings"]["control_cache"] == f"{c}/{c}" and r["items"]["masked"] == [1.0] * 8 for c, r in treated.items())
    out = kvinject("report", tmp_path / "grid.results.sqlite", "--format", "json")
    assert out.returncode == 0, out.stderr
    assert [r["configuration"] for r in json.loads(out.stdout) if r["p"] is None] == ["none", "none @q8_0"], "each its own control"


def test_one_of_several_faults_replays_alone(tmp_path, tiny_path):
    """faults:3,only=J draws the item's three faults as its run did and keeps the J-th: `replay
    --fault 1` lands exactly the record's second fault and nothing else."""
    store = swept(tmp_path, f'[sweep]\nmodels = ["{tiny_path}"]\nruns = 1\n\n[bench.nexttoken]\nlimit = 3\n\n[[errors]]\nspec = ["faults:3"]\n')
    with Store(store, readonly=True) as s:
        record = next(r for r in s.records() if not r["settings"]["control"])
    out = kvinject("replay", store, "--item", 2, "--fault", 1, "--format", "json")
    assert out.returncode == 0, out.stderr
    replayed = json.loads(out.stdout)
    assert len(record["faults"][2]) == 3 and replayed["faults"] == [record["faults"][2][1]] and replayed["same"]
    assert replayed["recorded_outcome"] is None, "the record has the outcome of all three together"
    beyond = kvinject("replay", store, "--item", 2, "--fault", 3)
    assert beyond.returncode == 2 and "item 2 recorded 3 faults: give --fault 0..2" in beyond.stderr
    with sqlite3.connect(store) as db:  # a control of record format 1, which has no tokens
        db.execute("UPDATE runs SET record = json_remove(record, '$.outputs', '$.format', '$.kvinject') WHERE json_extract(settings, '$.control')")
    db.close()
    old = kvinject("replay", store, "--item", 2)
    assert old.returncode == 2 and "has no generated tokens (written by kvinject 0.1.0 before record format 2)" in old.stderr, old.stderr
