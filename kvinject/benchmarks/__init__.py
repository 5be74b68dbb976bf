"""Benchmarks scored under K/V error, by name."""

from __future__ import annotations

from typing import Any

from ..exceptions import KvinjectError
from .base import Benchmark, Plan, RunResult
from .ifeval.bench import IFEval
from .nexttoken import NextToken
from .perplexity import Perplexity

BENCHMARKS: dict[str, type[Benchmark]] = {b.name: b for b in (IFEval, NextToken, Perplexity)}


def make_bench(name: str, options: dict[str, Any]) -> Benchmark:
    """A benchmark from its name and the options the CLI and grid files use."""
    o = {k: v for k, v in options.items() if v is not None}
    if name == "ifeval":
        return IFEval(o.get("data"), o.get("limit"), o.get("max_tokens", 100), o.get("temperature", 0.0), tuple(o.get("exclude_instructions", ())), o.get("ctx", 2048))
    if name == "nexttoken":
        return NextToken(o.get("data"), o.get("limit"))
    if name == "perplexity":
        return Perplexity(o.get("data"), o.get("chunks", o.get("limit")), o.get("ctx", 512))
    raise KvinjectError(f"unknown bench '{name}': choose from {', '.join(BENCHMARKS)}")


__all__ = ["BENCHMARKS", "Benchmark", "IFEval", "NextToken", "Perplexity", "Plan", "RunResult", "make_bench"]
