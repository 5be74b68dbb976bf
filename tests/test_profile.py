"""`kvinject profile`: one error in one layer's K or V at a time, as a resumable sweep."""

import pandas as pd
import pytest

from kvinject.benchmarks import make_bench
from kvinject.engine.options import BackendOptions, CacheOptions
from kvinject.engine.target import Target
from kvinject.error_models import parse_error
from kvinject.error_models.configuration import Configuration
from kvinject.exceptions import KvinjectError
from kvinject.experiments.profile import profile_metric, sensitivity
from kvinject.experiments.runner import run
from kvinject.experiments.store import Store

from .cli_runs import PNG, kvinject


def profile(*args):
    return kvinject("profile", *args, timeout=600)


def test_profile_maps_each_layer_and_component_as_a_targeted_run_measures_it(tmp_path, tiny_path, tiny):
    store, png, csv = tmp_path / "p.sqlite", tmp_path / "p.png", tmp_path / "p.csv"
    args = ["--model", tiny_path, "--error", "normal:0,0.5", "--ctx", 64, "--chunks", 2, "--store", store]
    out = profile(*args, "--heatmap", png, "--csv", csv)
    assert out.returncode == 0, out.stderr
    assert png.read_bytes()[:8] == PNG
    table = pd.read_csv(csv, index_col="layer")
    assert list(table.index) == [0, 1] and list(table.columns) == ["k", "v"]
    with Store(store, readonly=True) as s:
        assert len(list(s.records())) == 1 + 2 * 2, "the control and one run per layer and component"
    # Each entry is what a run with the error on that layer's K or V alone measures.
    bench = make_bench("perplexity", {"ctx": 64, "chunks": 2})
    configs = [Configuration(), Configuration.parse("normal:0,0.5", Target.parse("v", "1"))]
    _, alone = run(tiny, [bench], configs, runs=1)
    assert table.loc[1, "v"] == pytest.approx(alone.metrics["kld"], rel=1e-12)
    assert (table > 0).all().all()
    again = profile(*args)  # resumes: nothing left to compute
    assert again.returncode == 0, again.stderr
    with Store(store, readonly=True) as s:
        assert len(list(s.records())) == 5


def test_profile_refuses_no_error_and_an_unknown_metric(tmp_path, tiny_path):
    out = profile("--model", tiny_path, "--error", "none@q8_0", "--ctx", 64, "--chunks", 1, "--store", tmp_path / "s.sqlite")
    assert out.returncode != 0 and "puts no error anywhere" in out.stderr and "Traceback" not in out.stderr
    out = profile("--model", tiny_path, "--error", "normal:0,0.5", "--metric", "accuracy", "--store", tmp_path / "s.sqlite")
    assert out.returncode != 0 and "--metric accuracy: a profile of perplexity measures ppl, mean_nll, kld" in out.stderr
    assert not (tmp_path / "s.sqlite").exists(), "refused before anything ran"


def test_sensitivity_keeps_single_layer_records_of_its_error():
    def record(error, target, layers, kld):
        return {"settings": {"error": error, "target": target, "layers": layers}, "metrics": {"kld": kld, "ppl": 1.0}}

    records = [
        record("none", "kv", "all", 0.0),
        record("normal:0,0.5", "k", "0", 0.2),
        record("normal:0,0.5", "k", "0", 0.4),  # a second run: averaged
        record("normal:0,0.5", "v", "0", 0.1),
        record("normal:0,0.5", "kv", "0", 9.0),  # both components: not a cell of the map
        record("normal:0,0.5", "k", "0-1", 9.0),  # several layers: neither
        record("normal:0,0.25", "k", "1", 9.0),  # another error
        record("normal:0,0.5", "v", "1", 0.3),
    ]
    table = sensitivity(records, parse_error("normal:0,0.5"), "kld")
    assert table.loc[0, "k"] == pytest.approx(0.3) and table.loc[0, "v"] == 0.1 and table.loc[1, "v"] == 0.3
    assert pd.isna(table.loc[1, "k"])
    with pytest.raises(KvinjectError, match="no metric 'accuracy'"):
        sensitivity(records, parse_error("normal:0,0.5"), "accuracy")


def test_profile_takes_the_cache_types_of_its_error_spec(tmp_path, tiny_path):
    store = tmp_path / "p.sqlite"
    out = profile("--model", tiny_path, "--error", "quant:4@f32", "--ctx", 64, "--chunks", 1, "--store", store)
    assert out.returncode == 0, out.stderr
    with Store(store, readonly=True) as s:
        caches = {(r["settings"]["cache"]["type_k"], r["settings"]["cache"]["type_v"]) for r in s.records()}
    assert caches == {("f32", "f32")}, "the control and every layer's cell in the spec's cache"


def test_a_metric_no_profile_run_would_measure_is_refused_before_any_run():
    """nexttoken lists the drift metrics, measured only against a cache-free control, which a
    profile does not have: asked for, they failed after every run was made."""
    with pytest.raises(KvinjectError, match="cache-free control"):
        profile_metric("nexttoken", "kld")
    assert profile_metric("nexttoken", "token_match") == "token_match"
    assert profile_metric("perplexity", "kld") == "kld"  # perplexity's own KL divergence from the control


def test_a_model_that_acts_on_every_layer_at_once_is_refused_as_the_profiles_limit():
    """It asked to leave --target and --layers at defaults the user never set."""
    from kvinject.experiments.profile import profile_grid

    with pytest.raises(KvinjectError, match="no per-layer profile") as e:
        profile_grid(None, make_bench("nexttoken", {"limit": 1}), set(), [parse_error("evict:streaming,0.5")], CacheOptions(), BackendOptions())
    assert "--target" not in str(e.value)
