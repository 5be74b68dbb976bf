"""Bits per element of a configuration's cache, and that every result records them."""

import pytest

from kvinject.benchmarks import make_bench
from kvinject.engine.cache_bits import cache_bits
from kvinject.engine.context import Context
from kvinject.engine.target import Target
from kvinject.error_models.configuration import Configuration
from kvinject.experiments.runner import run


def bits(spec: str, target: str = "kv", layers: str | None = None, heads: str | None = None, n_head_kv: int = 1, head_dim_v: int = 64) -> float:
    config = Configuration.parse(spec, Target.parse(target, layers, heads=heads))
    return cache_bits(config.error, config.target, config.cache, 4, n_head_kv, 64 // n_head_kv, head_dim_v // n_head_kv)


@pytest.mark.parametrize(
    "spec,expected",
    [
        ("none", 16),
        ("none@f32", 32),
        ("none@q8_0", 8.5),  # 34-byte blocks of 32: an fp16 scale and 32 int8
        ("none@q4_0", 4.5),
        ("none@f16/q4_0", (16 + 4.5) / 2),
        ("normal:0,0.25", 16),
        ("quant:4", 4.5),
        ("quant:4,group=64", 4.25),
        ("quant:8@q4_0", 4.5),  # values on an 8-bit grid stored at 4.5 bits take 4.5
        ("float:e4m3", 8),
        ("float:e2m1,block=32", 4.25),
        ("mantissa:7", 16),
    ],
)
def test_bits_of_a_configuration(spec: str, expected: float) -> None:
    assert bits(spec) == pytest.approx(expected)


def test_bits_count_only_the_targeted_components_and_layers() -> None:
    assert bits("float:e4m3", target="v") == pytest.approx((16 + 8) / 2)  # K16/V8: keys at 16 bits, values in fp8
    assert bits("quant:4", layers="0") == pytest.approx((4.5 + 3 * 16 + 4.5 + 3 * 16) / 8)  # K and V of layer 0 of 4
    # A row's components weigh: K of 64 at 4.5 bits, V of 192 at 16.
    assert bits("quant:4", target="k", head_dim_v=192) == pytest.approx((64 * 4.5 + 192 * 16) / 256)
    # Heads 0 and 2 of 4 in every layer: half of each vector at 4.5 bits.
    assert bits("quant:4", heads="0,2", n_head_kv=4) == pytest.approx((4.5 + 16) / 2)
    assert bits("quant:4", target="v", heads="1", n_head_kv=4) == pytest.approx((16 + (4.5 + 3 * 16) / 4) / 2)
    # A per-row overhead (kvquant's outlier row pointer, 32 bits a token) spreads over the selected head's 16 components.
    assert bits("kvquant:4,outliers=0.01", target="k", heads="0", n_head_kv=4) == pytest.approx((16 + (4 + 0.01 * 32 + 32 / 16 + 3 * 16) / 4) / 2)


def test_every_result_records_its_bits(tiny) -> None:
    bench = make_bench("perplexity", {"ctx": 64, "chunks": 1})
    configs = [Configuration(), Configuration.parse("quant:4", Target.parse("v"))]
    control, quant = run(tiny, [bench], configs, runs=1)
    assert control.metrics["bits"] == 16
    assert quant.metrics["bits"] == pytest.approx((16 + 4.5) / 2)
    assert quant.to_dict()["metrics"]["bits"] == quant.metrics["bits"]


def test_kivi_counts_its_exact_window_in_the_share_the_run_held():
    kivi = Configuration.parse("kivi:2,group=32,residual=128").error
    assert kivi.bits_per_element(16, "k") == 2 + 32 / 32, "long sequences: BITS plus an fp16 scale and minimum per group"
    # 300 tokens: K holds 256 quantized (whole blocks of 128), V 172 (all but the last 128).
    assert kivi.bits_per_element(16, "k", [300]) == pytest.approx((256 * 3 + 44 * 16) / 300)
    assert kivi.bits_per_element(16, "v", [300]) == pytest.approx((172 * 3 + 128 * 16) / 300)
    assert kivi.bits_per_element(16, "v", [100]) == 16, "a sequence shorter than the window stays exact"


def test_a_context_reports_kivi_bits_at_the_lengths_it_held(tiny):
    model = Configuration.parse("kivi:2,group=4,residual=8").error
    with Context(tiny, error=model, n_ctx=64) as ctx:
        ctx.prefill(list(range(1, 21)))
        ctx.forget(0)
        ctx.prefill(list(range(1, 14)))
        quantized = 2 + 32 / 4  # an fp16 scale and minimum per group of 4
        k = ((16 + 8) * quantized + (4 + 5) * 16) / 33  # K: 16 of 20 and 8 of 13 tokens quantized
        v = ((12 + 5) * quantized + (8 + 8) * 16) / 33  # V: all but the last 8 of each
        assert ctx.cache_bits == pytest.approx((k + v) / 2)
