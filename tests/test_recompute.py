"""The cache-free reference (recompute) and the token flips and logit drift measured against it."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from kvinject.analysis.aggregate import aggregate
from kvinject.benchmarks import make_bench
from kvinject.benchmarks.drift import compare
from kvinject.engine.context import Context
from kvinject.engine.generation.batching import generate_all
from kvinject.engine.generation.cache_free import generate_cache_free, greedy, one_pass, pass_context
from kvinject.engine.options import CacheOptions
from kvinject.error_models import parse_error
from kvinject.error_models.configuration import Configuration, configurations
from kvinject.exceptions import SpecError
from kvinject.experiments.executor import evaluate
from kvinject.experiments.grid import GridError, load_grid
from kvinject.experiments.runner import run

from .test_cli import kvinject

FAST = {"limit": 3, "max_tokens": 12}
DRIFT = ("flip_rate", "flipped", "first_flip", "max_dlogit", "kld")


def test_recompute_parses_as_a_configuration_with_its_cache_types():
    c = Configuration.parse("recompute@f32/f16")
    assert c.cache_free and not c.error.injects
    assert (c.cache.type_k, c.cache.type_v) == ("f32", "f16")
    assert c.label == "recompute @f32/f16"
    assert Configuration.parse(c.error.spec, cache=c.cache) == c
    assert Configuration.from_dict(c.to_dict()).cache_free  # a stored configuration decodes as it did
    assert not Configuration.parse("none").cache_free and not Configuration.parse("normal:0,0.25").cache_free


def test_drift_of_hand_made_logits():
    own = np.array([[2.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 3.0], [1.0, 0.0, 0.0]], dtype=np.float32)
    assert compare(own, own) == {"flip_rate": 0.0, "flipped": 0.0, "first_flip": pytest.approx(math.nan, nan_ok=True), "max_dlogit": 0.0, "kld": 0.0}
    reference = own.copy()
    reference[1] = [2.0, 1.0, 0.0]  # greedy 0, not 1
    reference[3] = [1.0, 1.5, 0.0]  # greedy 1, not 0
    d = compare(own, reference)
    assert d["flip_rate"] == 0.5 and d["flipped"] == 1.0 and d["first_flip"] == 1.0
    assert d["max_dlogit"] == 2.0
    p1, q1 = np.exp([2.0, 1.0, 0.0]) / np.exp([2.0, 1.0, 0.0]).sum(), np.exp([0.0, 1.0, 0.0]) / np.exp([0.0, 1.0, 0.0]).sum()
    p3, q3 = np.exp([1.0, 1.5, 0.0]) / np.exp([1.0, 1.5, 0.0]).sum(), np.exp([1.0, 0.0, 0.0]) / np.exp([1.0, 0.0, 0.0]).sum()
    kl = lambda p, q: float((p * np.log(p / q)).sum())  # noqa: E731
    assert d["kld"] == pytest.approx((kl(p1, q1) + kl(p3, q3)) / 4)


def test_cache_free_generation_equals_one_pass_per_token(tiny):
    """Speculation changes the cost, not the result: every token is the greedy pick of one pass
    over its prefix, even with a draft that is nearly always wrong (noise of std 1)."""
    cache = CacheOptions("f32", "f32", "off")
    prompts = [tiny.tokenize("The capital of France is"), tiny.tokenize("Once upon a time, in a land far away, there")]
    with (
        Context(tiny, cache, parse_error("normal:0,1"), n_ctx=128, n_seq=2) as draft,
        pass_context(tiny, cache, 64) as verify,
        pass_context(tiny, cache, 64) as naive,
    ):
        gens = dict(generate_cache_free(draft, verify, prompts, 10, items=range(2)))
        for i, prompt in enumerate(prompts):
            tokens: list[int] = []
            while len(tokens) < 10 and not tiny.is_eog(pick := int(greedy(one_pass(naive, prompt, tokens))[-1])):
                tokens.append(pick)
            assert gens[i].tokens == tokens
            assert gens[i].logits.shape == (len(tokens) + (len(tokens) < 10), tiny.n_vocab)
            assert (greedy(gens[i].logits)[: len(tokens)] == tokens).all()


def test_a_zero_noise_configuration_drifts_by_zero(tiny):
    """recompute@f32 against a recompute@f32 reference computed separately: 0 flips, 0 distance."""
    bench = make_bench("ifeval", FAST)
    same = Configuration.parse("recompute@f32", cache=CacheOptions(flash_attn="off"))
    bench.prepare(tiny)
    control, other = evaluate(bench, tiny, [(same, [0]), (same, [0])], 0, lambda n: None)  # configurations() would drop the twin
    for result in (control, other):
        assert result.extra["flip_rate"] == 0 and result.extra["max_dlogit"] == 0 and result.extra["kld"] == 0
        assert result.items["flipped"] == [0.0] * 3
    assert other.extra["diverged"] == 0


def test_an_f32_cache_against_recompute_f32_is_measured(tiny):
    """Measured, not assumed: docs/recompute.md records the value on the default model."""
    bench = make_bench("gsm8k", {**FAST, "shots": 1})
    cache = CacheOptions(flash_attn="off")
    configs = configurations("recompute@f32", ["none@f32", "normal:0,1@f32"], cache=cache)
    results = list(run(tiny, [bench], configs, runs=1))
    assert [r.config.label for r in results] == ["recompute @f32", "none @f32", "normal:0,1 @f32"]
    f32, noisy = results[1].extra, results[2].extra
    for drift in (f32, noisy):
        assert 0 <= drift["flip_rate"] <= 1 and drift["max_dlogit"] >= 0 and drift["kld"] >= -1e-9
    assert f32["max_dlogit"] > 0  # another order of summation: cached decodes against one pass
    assert noisy["flip_rate"] > f32["flip_rate"] and noisy["kld"] > f32["kld"]
    rows = {(a["label"], a["metric"]): a for a in aggregate(bench, results)}
    assert rows[("normal:0,1 @f32", "flipped")]["test"]["test"] == "mcnemar_exact"
    assert rows[("normal:0,1 @f32", "flip_rate")]["test"]["test"] == "wilcoxon"


def test_a_cached_generation_keeps_the_logits_of_its_picks(tiny):
    prompt = tiny.tokenize("The capital of France is")
    with Context(tiny, n_ctx=64) as ctx:
        ((_, plain),) = generate_all(ctx, [prompt], 6)
        ((_, kept),) = generate_all(ctx, [prompt], 6, keep_logits=True)
        ((_, continued),) = generate_all(ctx, [prompt], 6, prefixes=[kept.tokens[:2]], keep_logits=True)
    assert plain.tokens == kept.tokens == continued.tokens and plain.logits is None
    assert (greedy(kept.logits)[: len(kept.tokens)] == kept.tokens).all()
    assert len(continued.logits) == len(kept.logits) - 2


def test_recompute_refuses_sampling(tmp_path):
    bench = make_bench("ifeval", {"limit": 1, "temperature": 0.5})
    with pytest.raises(SpecError, match="recompute generates greedily"):
        bench.check(configurations("recompute@f32", [])[0], bench.options)
    grid = tmp_path / "g.toml"  # a grid is checked as it is read, before anything runs
    grid.write_text('[sweep]\ncontrol = "recompute@f32"\n[bench.ifeval]\nlimit = 1\ntemperature = 0.5\n')
    with pytest.raises(GridError, match="recompute generates greedily"):
        load_grid(grid)


def test_cli_runs_against_a_cache_free_control(tiny_path, tmp_path):
    output = tmp_path / "out.json"
    args = ["--bench", "ifeval", "--limit", "2", "--max-tokens", "6", "--model", str(tiny_path), "-o", str(output)]
    out = kvinject("run", *args, "--control", "recompute@f32", "--error", "recompute@f16", "--error", "none@f16", "--wide")
    assert out.returncode == 0, out.stderr
    assert "flip_rate" in out.stdout and "recompute @f32" in out.stdout
    data = json.loads(output.read_text())
    assert [r["label"] for r in data["records"]] == ["recompute @f32", "recompute", "none"]
    assert all(set(DRIFT) <= set(r["metrics"]) and set(DRIFT) <= set(r["items"]) for r in data["records"])
    out = kvinject("generate", "The capital of France is", "-n", "4", "--error", "recompute@f32", "--model", str(tiny_path))
    assert out.returncode == 0 and "recompute @f32" in out.stdout, out.stderr
