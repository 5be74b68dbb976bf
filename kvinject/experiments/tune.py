"""`kvinject tune`: the cheapest KV cache a model tolerates, found on one text and proven on another.

Three sweeps into one store, each resumable, each built from what the one before stored:

1. **profile**: every choice (``quant:2``, ``quant:4``, ...) in one layer's K or V at a time, on
   the tuning text (kvinject/experiments/profile.py's grid, one error per choice);
2. **candidates**: allocations from a knapsack over that profile (kvinject/experiments/allocation.py),
   each a composite spec, and every choice uniformly, run whole on the tuning text: the real
   (bits, metric) points whose Pareto front the command shows, and the allocation chosen among
   them for the budget;
3. **held out**: the chosen allocation and the uniform choice at equal bits on text the search
   never saw (perplexity's chunks after the tuning ones, or ``--holdout-data``), compared item by
   item with a paired test.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from ..benchmarks import Benchmark
from ..engine.ggml import BITS_PER_VALUE
from ..engine.model import Shape
from ..engine.options import BackendOptions, CacheOptions
from ..engine.target import format_indices
from ..error_models import ErrorModel
from ..error_models.composite import Composite
from ..error_models.configuration import Configuration
from ..exceptions import KvinjectError
from ..values import check_runs, unique
from .allocation import Problem, hull, pareto, within
from .grid import Grid, build_grid
from .profile import given_options, profile_grid, sensitivity

CANDIDATES = 8  # allocations of the hull run whole, spread over its bits, besides those for the budget


@dataclass(frozen=True)
class Tuning:
    """What a tune searches over and for: the choices per layer and K/V, the bench and metric,
    the budget (``bits``: at most this many bits per element; ``max_metric``: the metric no
    worse than this), and where it runs."""

    model: str
    shape: Shape
    bench: Benchmark
    given: set[str]
    choices: tuple[ErrorModel, ...]  # NoError among them: the cache's own values, no error
    metric: str
    lower_is_better: bool
    cache: CacheOptions
    backend: BackendOptions
    store: Path
    holdout: dict[str, Any]  # the bench's options for the held-out text
    bits: float | None = None
    max_metric: float | None = None
    seed: int = 0
    runs: int = 1
    candidates: int = CANDIDATES

    @property
    def options(self) -> dict[str, Any]:
        """The bench's options the user gave, as the profile's grid holds them."""
        return given_options(self.bench, self.given)

    def profile(self) -> Grid:
        """Stage 1: each choice that changes values in one layer's K or V at a time."""
        changing = [c for c in self.choices if c.injects]
        return profile_grid(self.model, self.bench, self.given, changing, self.cache, self.backend, self.runs, self.seed, self.store)

    def problem(self, records: list[dict[str, Any]]) -> Problem:
        """The knapsack the profile's records pose: a cell per layer's K and per layer's V."""
        n = self.shape.n_layer
        cost = np.empty((2 * n, len(self.choices)))
        for j, choice in enumerate(self.choices):
            if not choice.injects:  # exact: the control's own value
                cost[:, j] = _control_value(records, self.metric, self.options, self.lower_is_better)
                continue
            table = sensitivity(records, choice, self.metric)
            cost[:, j] = np.concatenate([table["k"].reindex(range(n)).to_numpy(), table["v"].reindex(range(n)).to_numpy()])
        if np.isnan(cost).any():
            raise KvinjectError(f"the profile in {self.store} lacks some layers' {self.metric}: run the same command again to finish it")
        rows = {"k": self.shape.n_head_kv * self.shape.head_dim_k, "v": self.shape.n_head_kv * self.shape.head_dim_v}
        bits = np.array([[self._bits(choice, c, rows[c]) for choice in self.choices] for c in "kv" for _ in range(n)])
        weight = np.array([rows[c] for c in "kv" for _ in range(n)], float)
        return Problem(cost if self.lower_is_better else -cost, bits, weight)

    def _bits(self, choice: ErrorModel, component: str, row: int) -> float:
        stored = BITS_PER_VALUE[self.cache.type_k if component == "k" else self.cache.type_v]
        return min(stored, choice.bits_per_element(stored, component, (), row)) if choice.injects else stored

    def allocations(self, problem: Problem) -> list[str]:
        """Stage 2's composite specs: up to ``candidates`` hull points spread over its bits, and
        for a budget of bits the allocation within it and the hull points on either side."""
        points = hull(problem)
        spread = np.unique(np.linspace(0, len(points) - 1, min(self.candidates, len(points))).round().astype(int))
        picks = [points[i] for i in spread]
        if self.bits is not None:
            below = [p for p in points if problem.average_bits(p) <= self.bits + 1e-12]
            above = [p for p in points if problem.average_bits(p) > self.bits + 1e-12]
            fitted = within(problem, self.bits)
            picks += [*below[-2:], *above[:1], *([fitted] if fitted is not None else [])]
        return list(dict.fromkeys(self.spec(p) for p in picks))

    def spec(self, pick: np.ndarray) -> str:
        """An allocation as its composite spec: a part per choice and K/V, K and V merged where
        they take the same choice in the same layers; cells left exact take no part."""
        n = self.shape.n_layer
        layers: dict[tuple[int, str], frozenset[int]] = {}
        for cell, j in enumerate(pick.tolist()):
            if self.choices[j].injects:
                key = (j, "kv"[cell // n])
                layers[key] = layers.get(key, frozenset()) | {cell % n}
        parts = []
        for j in sorted({j for j, _ in layers}):
            k, v = layers.get((j, "k")), layers.get((j, "v"))
            for components, cells in [("kv", k)] if k == v else [(c, s) for c, s in (("k", k), ("v", v)) if s]:
                where = components if len(cells) == n else f"{components}:{format_indices(cells)}"
                parts.append(f"{self.choices[j].spec}[{where}]")
        return Configuration.parse("+".join(parts) or "none", cache=self.cache).spec

    def uniform(self) -> list[str]:
        """Every choice on every layer's K and V."""
        return [c.spec for c in self.choices if c.injects]

    def whole(self, specs: Sequence[str], options: dict[str, Any], holdout: bool = False) -> Grid:
        """Stages 2 and 3: ``specs`` run whole with the bench's ``options`` (and the control)."""
        sweep: dict[str, Any] = {
            "models": [self.model],
            "runs": self.runs,
            "seeds": [self.seed],
            "caches": [f"{self.cache.type_k}/{self.cache.type_v}"],
            "flash_attn": self.cache.flash_attn,
            "kv_rotation": self.cache.kv_rotation,
        }
        b = self.backend
        sweep |= {k: v for k, v in (("threads", b.threads), ("n_gpu_layers", b.n_gpu_layers), ("parallel", b.parallel)) if v is not None}
        raw = {"sweep": sweep, "bench": {self.bench.name: options}, "errors": [{"spec": list(dict.fromkeys(specs))}] if specs else []}
        return build_grid(self.store, raw)

    def candidates_grid(self, records: list[dict[str, Any]]) -> tuple[Grid, list[str]]:
        specs = [*self.uniform(), *self.allocations(self.problem(records))]
        return self.whole(specs, self.options), specs

    def run(self, execute: Callable[[Grid], object], read: Callable[[], list[dict[str, Any]]]) -> Result:
        """The three sweeps, each by ``execute`` (which runs a grid into the store) and read back
        by ``read``; each resumes where the store stops."""
        execute(self.profile())
        grid, specs = self.candidates_grid(read())
        execute(grid)
        records = read()
        found = points(records, specs, self.metric, self.options)
        chosen = self.choose(found)
        rival = self.rival(chosen, found)
        execute(self.whole(["none", chosen.spec, *([rival.spec] if rival else [])], self.holdout))
        return Result(found, front(found, self.lower_is_better), chosen, rival, read())

    def choose(self, points: list[Point]) -> Point:
        """The candidate the budget asks for: the best within ``bits``, or the cheapest whose
        metric is within ``max_metric``."""
        if self.bits is not None:
            fits = [p for p in points if p.bits <= self.bits + 1e-9]
            if not fits:
                raise KvinjectError(f"no candidate stores {self.bits:g} bits per element or fewer: the cheapest choice stores {min(p.bits for p in points):g}")
            return min(fits, key=lambda p: (p.loss(self.lower_is_better), p.bits))
        limit = self.max_metric if self.lower_is_better else -self.max_metric
        fits = [p for p in points if p.loss(self.lower_is_better) <= limit]
        if not fits:
            best = min(points, key=lambda p: p.loss(self.lower_is_better))
            raise KvinjectError(f"no candidate keeps {self.metric} within {self.max_metric:g}: the best, {best.spec}, reaches {best.value:.4g}")
        return min(fits, key=lambda p: (p.bits, p.loss(self.lower_is_better)))

    def rival(self, chosen: Point, points: list[Point]) -> Point | None:
        """The uniform choice the chosen allocation is proven against: the most bits no more than
        its budget's (or its own)."""
        budget = self.bits if self.bits is not None else chosen.bits
        specs = set(self.uniform())
        uniform = [p for p in points if p.spec in specs and p.bits <= budget + 1e-9 and p.spec != chosen.spec]
        return max(uniform, key=lambda p: p.bits) if uniform else None


@dataclass(frozen=True)
class Point:
    """A configuration run whole: its spec, bits per element and the metric's mean over runs."""

    spec: str
    bits: float
    value: float

    def loss(self, lower_is_better: bool) -> float:
        return self.value if lower_is_better else -self.value


def points(records: list[dict[str, Any]], specs: Sequence[str], metric: str, options: dict[str, Any]) -> list[Point]:
    """The real (bits, metric) of each of ``specs`` with the bench's ``options``, means over runs."""
    found: dict[str, list[tuple[float, float]]] = {}
    for r, spec in _of(records, specs, options):
        found.setdefault(spec, []).append((r["metrics"]["bits"], r["metrics"][metric]))
    return [Point(spec, float(np.mean([b for b, _ in v])), float(np.mean([m for _, m in v]))) for spec, v in found.items()]


def front(all_points: list[Point], lower_is_better: bool) -> list[Point]:
    """The points no other beats in both bits and the metric."""
    bits, loss = np.array([p.bits for p in all_points]), np.array([p.loss(lower_is_better) for p in all_points])
    return [all_points[i] for i in pareto(bits, loss, higher_is_better=False)]


def item_values(records: list[dict[str, Any]], spec: str, key: str, options: dict[str, Any]) -> np.ndarray:
    """Per item, the mean over runs of ``key`` for ``spec`` with ``options``."""
    runs = [r["items"][key] for r, _ in _of(records, [spec], options)]
    if not runs:
        raise KvinjectError(f"no held-out record of {spec}: run the same command again to finish it")
    return np.nanmean(np.array(runs, float), axis=0)


def _of(records: list[dict[str, Any]], specs: Sequence[str], options: dict[str, Any]) -> Iterator[tuple[dict[str, Any], str]]:
    """The records of ``specs`` (configurations' :attr:`Configuration.spec`) run with ``options``, each with its spec."""
    wanted, options = set(specs), _normal(options)
    for r in records:
        s = r["settings"]
        if _normal(s["options"]) == options and (spec := Configuration.from_dict(s).spec) in wanted:
            yield r, spec


def _normal(options: dict[str, Any]) -> str:
    return json.dumps(options, sort_keys=True, default=list)


def _control_value(records: list[dict[str, Any]], metric: str, options: dict[str, Any], lower_is_better: bool) -> float:
    """The control's value of ``metric``; one it does not record compares a run with the control
    (kld, same_top_p), which the control matches exactly: 0, or 1 for a share of agreement."""
    controls = [r["metrics"] for r, _ in _of(records, ["none"], options)]
    if not controls:
        raise KvinjectError("the profile has no control run: run the same command again to finish it")
    values = [m[metric] for m in controls if metric in m]
    return float(np.mean(values)) if values else 0.0 if lower_is_better else 1.0


@dataclass(frozen=True)
class Result:
    """What a tune found: every configuration run whole on the tuning text, their front, the
    allocation chosen for the budget, the uniform choice it is proven against, and the records."""

    points: list[Point]
    front: list[Point]
    chosen: Point
    rival: Point | None
    records: list[dict[str, Any]]

    def front_csv(self) -> str:
        lines = ["bits,value,spec"] + [f"{p.bits:.15g},{p.value:.15g},{json.dumps(p.spec)}" for p in self.front]
        return "\n".join(lines) + "\n"


def plan_tuning(
    model: str | None,
    cache: CacheOptions,
    backend: BackendOptions,
    choices: Sequence[str],
    bench: str,
    values: dict[str, Any],
    *,
    bits: float | None = None,
    max_metric: float | None = None,
    data: str | None = None,
    holdout_data: str | None = None,
    holdout_chunks: int | None = None,
    metric: str | None = None,
    runs: int = 1,
    seed: int = 0,
    store: Path | None = None,
    candidates: int = CANDIDATES,
) -> Tuning:
    """A tune as the command's flags describe it, checked before anything runs."""
    from ..benchmarks import BENCHMARKS, make_benches
    from ..engine.model import DEFAULT_MODEL, Model, resolve_model
    from .profile import profile_metric

    check_runs("--runs", runs)
    models = {spec: _choice(spec, cache) for spec in choices}
    parsed = [models[spec] for spec in unique("--choice", list(choices), key=lambda s: models[s].spec)]
    if len([c for c in parsed if c.injects]) < 1 or len(parsed) < 2:
        raise KvinjectError("give at least two --choice, one of them an error model (quant:2, quant:4, ...; none keeps a layer's K or V exact)")
    (b,) = make_benches([bench], values, [data] if data else [])
    metric = profile_metric(bench, metric)
    if metric == "bits":
        raise KvinjectError("--metric bits is what tune spends, not what it protects: give a quality metric (kld, ppl, accuracy, ...)")
    given = {k for k, v in values.items() if v not in (None, [], ())} | ({"data"} if data else set())
    path = resolve_model(model)
    with Model(str(path), BackendOptions(n_gpu_layers=0)) as m:  # mmapped: the shape, not the weights
        shape = m.shape
    tuning = Tuning(
        model=model or DEFAULT_MODEL,  # as the user named it: records and reports show the name, not this machine's path
        shape=shape,
        bench=b,
        given=given,
        choices=tuple(parsed),
        metric=metric,
        lower_is_better=not BENCHMARKS[bench].higher_is_better[metric],
        cache=cache,
        backend=backend,
        store=store or Path(f"tune-{path.stem}-{bench}.results.sqlite"),
        holdout={},
        bits=bits,
        max_metric=max_metric,
        seed=seed,
        runs=runs,
        candidates=candidates,
    )
    return replace(tuning, holdout=holdout_options(b, tuning.options, holdout_data, holdout_chunks))


def _choice(spec: str, cache: CacheOptions) -> ErrorModel:
    config = Configuration.parse(spec, cache=cache)
    if config.spec != config.error.spec or isinstance(config.error, Composite):
        raise KvinjectError(f"--choice {spec}: give one error model, which tune puts where it decides")
    if config.error.injects and not config.error.changes_values:
        raise KvinjectError(f"--choice {spec}: '{config.error.name}' removes tokens from every layer at once; tune chooses per layer's K and V")
    if (config.cache.type_k, config.cache.type_v) != (cache.type_k, cache.type_v):
        raise KvinjectError(f"--choice {spec}: a choice takes the cache's types (--cache-type-k/v), which are one per cache in llama.cpp")
    return config.error


def holdout_options(bench: Benchmark, options: dict[str, Any], data: str | None, chunks: int | None = None) -> dict[str, Any]:
    """The bench's options for text the search never saw: ``data``, or perplexity's chunks after
    the tuning ones; ``chunks`` of it (perplexity; default as many as tuned on)."""
    if chunks is not None and bench.name != "perplexity":
        raise KvinjectError(f"--holdout-chunks counts perplexity's chunks; {bench.name} has none (give --holdout-data and its own size)")
    sized = {"chunks": chunks} if chunks is not None else {}
    if data is not None:
        return {**options, "data": data, **sized}
    if bench.name != "perplexity":
        raise KvinjectError(f"kvinject tune proves its allocation on text it did not tune on: give {bench.name} --holdout-data")
    if not options.get("chunks"):
        raise KvinjectError("kvinject tune tunes on the first --chunks N chunks and proves on the ones after: give --chunks (or --holdout-data)")
    return {**options, "skip": options["chunks"], "chunks": chunks or options["chunks"]}
