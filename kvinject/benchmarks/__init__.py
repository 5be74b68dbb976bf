"""Benchmarks scored under K/V error, by name."""

from __future__ import annotations

from .base import Benchmark, RunResult
from .ifeval.bench import IFEval
from .nexttoken import NextToken
from .perplexity import Perplexity

BENCHMARKS: dict[str, type[Benchmark]] = {b.name: b for b in (IFEval, NextToken, Perplexity)}

__all__ = ["BENCHMARKS", "Benchmark", "IFEval", "NextToken", "Perplexity", "RunResult"]
