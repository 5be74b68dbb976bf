"""Run benchmarks under the control and each configuration, the control first, as a sweep of
their cells into a results store; record the settings."""

from __future__ import annotations

import datetime as dt
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Callable, Iterator

from .. import __version__
from ..benchmarks.base import Benchmark, RunResult
from ..engine.model import Model, versions
from ..error_models.configuration import Configuration
from .grid import Cell, Grid, option_items
from .store import Store, temporary_store
from .sweep import Sweep

# progress(bench, total) -> advance(n): a progress bar per benchmark.
ProgressFactory = Callable[[Benchmark, int], Callable[[int], None]]


def cells(model: Model, benches: list[Benchmark], configs: list[Configuration], runs: int, seed: int) -> list[Cell]:
    """The cells of a run, bench by bench, its control (the first configuration) first: those of
    a grid file that names the same model, benches, options, configurations and seed."""
    spec = str(model.path)
    return [Cell(spec, b.name, option_items(b.options.given()), c, seed, runs, control=c == configs[0]) for b in benches for c in dict.fromkeys(configs)]


def run(
    model: Model,
    benches: list[Benchmark],
    configs: list[Configuration],
    runs: int = 5,
    seed: int = 0,
    progress: ProgressFactory | None = None,
    store: Store | None = None,
    notice: Callable[[str], None] | None = None,
) -> Iterator[RunResult]:
    """Evaluate every bench under ``configs`` (the control first) as a sweep of their cells into
    ``store`` (a temporary one if None), where each run is kept as it finishes; yields the runs
    evaluated, as they finish. Runs the store holds already are not evaluated again (read them
    with :func:`records`); ``notice`` hears how many."""
    for config in configs:  # before the control has run, not after
        config.check(model.shape)
        for bench in benches:
            bench.check(config, bench.options)
    with ExitStack() as stack:
        store = store or stack.enter_context(temporary_store())
        grid = Grid(Path(model.path), cells(model, benches, configs, runs, seed))
        sweep = Sweep(grid, store, models={str(model.path): model}, benches=benches)
        planned = sweep.plan()
        kept = sum(sweep.runs_of(p.cell) - len(p.runs) for p in planned)
        if kept and notice:
            notice(f"{kept} of {kept + sum(len(p.runs) for p in planned)} runs are in {store.path} already: not evaluated again")
        group = (lambda bench, _, total: progress(bench, total)) if progress else None
        yield from (result for _, result, added in sweep.results(group) if added)


def records(store: Store, model: Model, benches: list[Benchmark], configs: list[Configuration], runs: int, seed: int) -> list[dict[str, Any]]:
    """The store's records of a run's cells, in its order (bench, configuration, run), as
    :meth:`Store.records` gives them."""
    by_name = {b.name: b for b in benches}
    order = {c.key(model.sha256): (i, by_name[c.bench].runs_needed(c.config, runs)) for i, c in enumerate(cells(model, benches, configs, runs, seed))}
    wanted = [r for r in store.records() if r["cell"] in order and r["run"] < order[r["cell"]][1]]  # a store may hold more runs than asked for
    return sorted(wanted, key=lambda r: (order[r["cell"]][0], r["run"]))


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
