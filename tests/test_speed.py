"""The time model behind `sweep --dry-run`'s estimate (kvinject/benchmarks/speed.py)."""

from __future__ import annotations

import pytest

from kvinject.benchmarks.speed import PREFILL_TOK_S, Speed


def test_short_prompts_cost_in_proportion_and_long_ones_more():
    """Up to 512 tokens a prompt costs its tokens at the base speed; beyond, attention over the
    cached tokens makes doubling the length more than double the time, as measured at 8K
    (90 tokens/s, docs/performance.md) within a fifth."""
    speed = Speed()
    assert speed.prefill(20 * 512) == pytest.approx(20 * 512 / PREFILL_TOK_S)
    assert speed.prefill(256, 256) == speed.prefill(256)
    times = [speed.prefill(n, n) for n in (2048, 4096, 8192)]
    assert times[1] > 2 * times[0] and times[2] > 2 * times[1]
    assert 8192 / times[2] == pytest.approx(90, rel=0.2)


def test_generation_at_long_context_costs_more_per_token():
    speed = Speed()
    short, long = (speed.generation(1, n, 100) - speed.generation(1, n, 0) for n in (400, 8192))
    assert long > 1.5 * short
