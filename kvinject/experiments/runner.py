"""Run benchmarks under the control and each configuration, the control first; record the settings."""

from __future__ import annotations

import datetime as dt
from typing import Callable, Iterator

from .. import __version__
from ..benchmarks.base import Benchmark, RunResult
from ..engine.model import Model, versions
from ..error_models.configuration import Configuration

# progress(bench, total) -> advance(n): a progress bar per benchmark.
ProgressFactory = Callable[[Benchmark, int], Callable[[int], None]]


def run(
    model: Model,
    benches: list[Benchmark],
    configs: list[Configuration],
    runs: int = 5,
    seed: int = 0,
    progress: ProgressFactory | None = None,
) -> Iterator[RunResult]:
    """Evaluate every bench under ``configs`` (the control first); yields results as they finish."""
    for config in configs:  # before the control has run, not after
        config.check(model.shape)
        for bench in benches:
            bench.check(config, bench.options)
    for bench in benches:
        bench.prepare(model)
        plan = bench.plan(configs, runs)
        advance = progress(bench, bench.work(plan)) if progress else (lambda n: None)
        yield from bench.evaluate(model, plan, seed, advance)


def metadata(model: Model, benches: list[Benchmark], configs: list[Configuration], runs: int, seed: int, settings: dict[str, object]) -> dict[str, object]:
    return {
        "kvinject": __version__,
        **versions(),
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "model": str(model.path),
        "model_sha256": model.sha256,
        "model_description": model.description,
        "runs": runs,
        "seed": seed,
        "threads": model.backend.n_threads,
        "n_gpu_layers": model.n_gpu_layers,
        "parallel": model.parallel,
        **{f"{b.name}_chunks_per_decode": model.chunks_per_decode(b.n_ctx) for b in benches if b.name == "perplexity"},
        "configurations": [{"label": c.label, **c.to_dict()} for c in configs],
        "benches": {b.name: b.settings for b in benches},
        "options": {b.name: b.options.given() for b in benches},  # as a store records them: `report` reads this file
        **settings,
    }
