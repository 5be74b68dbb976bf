"""Sweep grid files: TOML that declares models, benches, error models with parameter ranges,
targets, layers and cache types; the cells are their cross product plus explicit extra cells.

The file is validated completely before anything runs; every error names the key.
See docs/grid-format.md.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import tomllib
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

from ..benchmarks import BENCHMARKS
from ..engine.options import FLASH_ATTN, BackendOptions, CacheOptions
from ..engine.target import Target
from ..error_models import REGISTRY
from ..error_models.configuration import Configuration
from ..exceptions import KvinjectError, SpecError
from ..values import check_runs, unique
from .campaign import campaign_size


class GridError(KvinjectError):
    """A grid file that cannot be run; the message names the file and the key."""


# A grid larger than this is most likely a typo (a range step of 0.001); --max-cells allows it.
MAX_CELLS = 5000
MAX_RANGE = 10000  # values of one range, checked before they are made
SWEEP_KEYS = {
    "models",
    "runs",
    "seeds",
    "control",
    "control_per_cache",
    "targets",
    "layers",
    "positions",
    "heads",
    "caches",
    "flash_attn",
    "kv_rotation",
    "threads",
    "n_gpu_layers",
    "parallel",
    "margin",
    "confidence",
}


def settings_key(settings: dict[str, Any]) -> str:
    """A results store's key of a cell: a hash of what determines its results (:meth:`Cell.settings`)."""
    blob = json.dumps(settings, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


@dataclass(frozen=True)
class Cell:
    """One point of the grid: a model, a bench with its options, and one configuration."""

    model: str
    bench: str
    options: tuple[tuple[str, Any], ...]
    config: Configuration
    seed: int
    runs: int
    control: bool = False
    campaign: tuple[float, float] | None = None  # (margin, confidence): the runs of a configuration placing faults
    # The cache types ("q8_0/q8_0") of the control this cell is compared with, where each cache of
    # the grid has its own (sweep.control_per_cache: a fault campaign's golden run); None: one control.
    control_cache: str | None = None

    def settings(self, model_sha256: str) -> dict[str, Any]:
        """Everything that determines the cell's results, the model by content."""
        return {
            "model_sha256": model_sha256,
            "bench": self.bench,
            "options": dict(self.options),
            **self.config.to_dict(),
            "seed": self.seed,
            **({"control_cache": self.control_cache} if self.control_cache else {}),
        }

    def key(self, model_sha256: str) -> str:
        return settings_key(self.settings(model_sha256))

    @property
    def group(self) -> tuple[Any, ...]:
        """Cells that share a model, bench, options and seed (and control) are evaluated together."""
        return (self.model, self.bench, self.options, self.seed) + ((self.control_cache,) if self.control_cache else ())


def option_items(options: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    """A bench's options as a cell holds them: sorted, lists as tuples (hashable)."""
    return tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in options.items()))


def bench_labels(cells: list[Cell]) -> list[str]:
    """Each cell's bench with the options in which cells of that bench differ (``perplexity
    ctx=2048`` beside ``perplexity ctx=8192``), so that listed cells never look alike."""
    by_bench: dict[str, list[dict[str, Any]]] = {}
    for cell in cells:
        by_bench.setdefault(cell.bench, []).append(dict(cell.options))
    differing = {bench: sorted(k for k in set().union(*sets) if len({repr(o.get(k)) for o in sets}) > 1) for bench, sets in by_bench.items()}
    return [" ".join([c.bench, *(f"{k}={v}" for k, v in sorted(c.options) if k in differing[c.bench])]) for c in cells]


@dataclass
class Grid:
    path: Path
    cells: list[Cell] = field(default_factory=list)
    threads: int | None = None
    n_gpu_layers: int | None = None
    parallel: int | None = None


def _values(where: str, value: Any) -> list[Any]:
    """A scalar, a list, or a range table {start, stop, step} (stop included)."""
    if isinstance(value, dict):
        if set(value) != {"start", "stop", "step"}:
            raise GridError(f"{where}: a range needs exactly start, stop and step, got {', '.join(value)}")
        start, stop, step = (value[k] for k in ("start", "stop", "step"))
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (start, stop, step)) or step <= 0 or stop < start:
            raise GridError(f"{where}: a range needs numbers with step > 0 and stop >= start")
        count = np.floor((stop - start) / step + 1e-9) + 1
        if not count <= MAX_RANGE:  # inf for a step of 5e-324
            raise GridError(f"{where}: the range has {count:.0f} values (at most {MAX_RANGE}); raise step")
        n = int(count)
        return [round(start + i * step, 12) for i in range(n)]
    if isinstance(value, list):
        if not value:
            raise GridError(f"{where}: empty list")
        return unique(where, value, key=_fmt)  # a value twice would be a cell twice
    return [value]


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)  # TOML's true is no count


def _model_file(spec: str) -> str:
    """The file a local model names, so that two paths to one file are one model; else the spec."""
    path = Path(spec).expanduser()
    return str(path.resolve()) if path.is_file() else spec


def _fmt(value: Any) -> str:
    return repr(float(value)).removesuffix(".0") if isinstance(value, float) else str(value)


def _error_specs(where: str, entry: dict[str, Any]) -> list[str]:
    """The specs of one [[errors]] entry; with ``cache = "q8_0"`` (K/V types, as sweep.caches), each
    runs with that cache only, instead of each of sweep.caches."""
    if "cache" in entry:
        entry = dict(entry)
        cache = entry.pop("cache")
        if not isinstance(cache, str) or "@" in cache:
            raise GridError(f"{where}.cache must be cache types such as 'q8_0' or 'f16/q8_0', got {cache!r}")
        return [f"{spec}@{cache}" for spec in _error_specs(where, entry)]
    if "spec" in entry:
        if set(entry) != {"spec"}:
            raise GridError(f"{where}: give either spec or model with parameters, not both")
        return [str(s) for s in _values(f"{where}.spec", entry["spec"])]
    name = entry.get("model")
    cls = REGISTRY.get(name) if isinstance(name, str) else None
    if cls is None:
        raise GridError(f"{where}.model: unknown error model {name!r}; choose from {', '.join(REGISTRY)}")
    params = [f.name for f in fields(cls)]
    unknown = set(entry) - {"model", *params}
    if unknown:
        raise GridError(f"{where}: '{name}' has no parameter {sorted(unknown)[0]!r} (parameters: {', '.join(params) or 'none'})")
    lists = []
    for f in fields(cls):
        if f.name in entry:
            lists.append([(f.name, v) for v in _values(f"{where}.{f.name}", entry[f.name])])
        elif f.default is MISSING:
            raise GridError(f"{where}: '{name}' needs {f.name}")
    count = math.prod(len(values) for values in lists)
    if count > MAX_CELLS:
        raise GridError(f"{where}: the parameters of '{name}' cross into {count} specs (at most {MAX_CELLS})")
    specs = []
    for combo in itertools.product(*lists):
        positional = [_fmt(v) for k, v in combo if next(f for f in fields(cls) if f.name == k).default is MISSING]
        options = [f"{k}={_fmt(v)}" for k, v in combo if next(f for f in fields(cls) if f.name == k).default is not MISSING]
        args = ",".join(positional + options)
        specs.append(f"{name}:{args}" if args else name)
    return specs


def load_grid(path: Path, max_cells: int = MAX_CELLS) -> Grid:
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise GridError(f"cannot read {path}: {e.strerror}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:  # TOML is UTF-8 text
        raise GridError(f"{path}: not valid TOML: {e}") from None
    try:
        return build_grid(path, raw, max_cells)
    except (SpecError, GridError) as e:  # every message names the file, as docs/grid-format.md says
        message = str(e)
        raise GridError(message if message.startswith(f"{path}:") else f"{path}: {message}") from None


def _runs(path: Path, runs: Any) -> int:
    if not _integer(runs):
        raise GridError(f"{path}: sweep.runs must be an integer, got {runs!r}")
    try:
        return check_runs("sweep.runs", runs)
    except SpecError as e:
        raise GridError(f"{path}: {e}") from None


def build_grid(path: Path, raw: dict[str, Any], max_cells: int = MAX_CELLS) -> Grid:
    """A grid from the parsed TOML of ``path`` (or the same structure built in Python), checked completely."""
    unknown = set(raw) - {"sweep", "bench", "errors", "cells"}
    if unknown:
        raise GridError(f"{path}: unknown top-level key {sorted(unknown)[0]!r} (expected sweep, bench, errors, cells)")
    sweep = raw.get("sweep", {})
    if not isinstance(sweep, dict):
        raise GridError(f"{path}: sweep must be a table ([sweep]), got {sweep!r}")
    bad = set(sweep) - SWEEP_KEYS
    if bad:
        raise GridError(f"{path}: [sweep] has no key {sorted(bad)[0]!r} (keys: {', '.join(sorted(SWEEP_KEYS))})")
    benches = raw.get("bench")
    if not isinstance(benches, dict) or not benches:
        raise GridError(f"{path}: declare at least one benchmark, e.g. [bench.nexttoken]")
    option_sets = _option_sets(path, benches)
    runs = _runs(path, sweep.get("runs", 5))
    campaign = _campaign(path, sweep)
    seeds = _values("sweep.seeds", sweep.get("seeds", 0))
    if not all(_integer(s) and s >= 0 for s in seeds):
        raise GridError(f"{path}: sweep.seeds must be integers >= 0, got {seeds!r}")
    caches = _caches(path, sweep)
    targets = _targets(path, sweep)
    specs = _specs(path, raw.get("errors", []))
    models = unique("sweep.models", [str(m) for m in _values("sweep.models", sweep.get("models", "smollm2"))], key=_model_file)
    control_spec = str(sweep.get("control", "none"))
    per_cache = sweep.get("control_per_cache", False)
    if not isinstance(per_cache, bool):
        raise GridError(f"{path}: sweep.control_per_cache must be true or false, got {per_cache!r}")

    extras = raw.get("cells", [])
    if not isinstance(extras, list) or not all(isinstance(e, dict) for e in extras):
        raise GridError(f"{path}: cells must be an array of tables ([[cells]])")
    cells = len(models) * len(option_sets) * len(seeds) * (1 + len(specs) * len(targets) * len(caches) + len(extras))
    if cells > max_cells:
        raise GridError(f"{path}: the grid expands to {cells} cells, more than {max_cells}; narrow it, or allow it with --max-cells {cells}")
    grid = Grid(path, threads=sweep.get("threads"), n_gpu_layers=sweep.get("n_gpu_layers"), parallel=sweep.get("parallel"))
    seen: set[tuple[Any, ...]] = set()

    def add(model: str, bench: str, options: dict[str, Any], config: Configuration, seed: int, control: bool = False) -> None:
        control_cache = None
        if per_cache:  # compared with the control of its own cache types
            control_cache = f"{config.cache.type_k}/{config.cache.type_v}"
            if control_cache not in {f"{c.type_k}/{c.type_v}" for c in caches}:
                raise GridError(f"{path}: '{config.label}' stores K/V as {control_cache}, which has no control: add it to sweep.caches (control_per_cache)")
        try:
            BENCHMARKS[bench].check(config, BENCHMARKS[bench].Options.parse(options))
        except SpecError as e:
            raise GridError(f"{path}: [bench.{bench}] {e}") from None
        opts = option_items(options)
        cell = Cell(model, bench, opts, config, seed, runs, control, campaign, control_cache)
        identity = (model, bench, opts, config, seed)
        if identity not in seen:
            seen.add(identity)
            grid.cells.append(cell)

    def configure(where: str, spec: str, target: Target | None, cache: CacheOptions) -> Configuration:
        try:
            return Configuration.parse(spec, target, cache)
        except SpecError as e:
            raise GridError(f"{path}: {where}: {e}") from None

    for model, (bench, options), seed in itertools.product(models, option_sets, seeds):
        for cache in caches if per_cache else caches[:1]:
            add(model, bench, options, configure("sweep.control", control_spec, None, cache), seed, control=True)
        for spec, target, cache in itertools.product(specs, targets, caches):
            add(model, bench, options, configure(f"errors '{spec}'", spec, target, cache), seed)
        for i, extra in enumerate(extras):
            bad = set(extra) - {"error", "target", "layers", "positions", "heads"}
            if bad or "error" not in extra:
                raise GridError(f"{path}: cells[{i}] takes error (required), target, layers, positions and heads")
            try:
                defaults = (("target", "kv"), ("layers", "all"), ("positions", "all"), ("heads", "all"))
                target = Target.parse(*(str(extra.get(key, default)) for key, default in defaults))
            except SpecError as e:
                raise GridError(f"{path}: cells[{i}]: {e}") from None
            add(model, bench, options, configure(f"cells[{i}]", str(extra["error"]), target, caches[0]), seed)
    return grid


def _specs(path: Path, errors: Any) -> list[str]:
    """The error specs of the [[errors]] tables, each once."""
    if not isinstance(errors, list):
        raise GridError(f"{path}: errors must be an array of tables ([[errors]])")
    if not all(isinstance(e, dict) for e in errors):
        raise GridError(f"{path}: each entry of errors must be a table ([[errors]] with model = ... or spec = ...)")
    return unique("errors", [s for i, e in enumerate(errors) for s in _error_specs(f"errors[{i}]", e)])


def _option_sets(path: Path, benches: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """Each bench's option sets, checked: [bench.NAME] gives one, [[bench.NAME]] tables several."""
    option_sets = []
    for name, tables in benches.items():
        if name not in BENCHMARKS:
            raise GridError(f"{path}: [bench.{name}] is not a benchmark (choose from {', '.join(BENCHMARKS)})")
        if not isinstance(tables, list):
            tables = [tables]
        if not tables or not all(isinstance(options, dict) for options in tables):
            raise GridError(f"{path}: bench.{name} must be a table of options, [bench.{name}], or several, [[bench.{name}]]")
        parsed: dict[Any, int] = {}  # a table twice (as read) would repeat its cells
        for i, options in enumerate(tables):
            where = f"[bench.{name}]" if len(tables) == 1 else f"[[bench.{name}]] #{i + 1}"
            try:
                same = parsed.setdefault(BENCHMARKS[name].Options.parse(options), i + 1)
            except SpecError as e:
                raise GridError(f"{path}: {where} {e}") from None
            if same != i + 1:
                raise GridError(f"{path}: {where} is the same as #{same}: give each table once")
            option_sets.append((name, options))
    return option_sets


def _campaign(path: Path, sweep: dict[str, Any]) -> tuple[float, float] | None:
    """sweep.margin and sweep.confidence, checked: the size of fault campaigns, or None."""
    if "margin" not in sweep:
        if "confidence" in sweep:
            raise GridError(f"{path}: sweep.confidence goes with sweep.margin (the runs of configurations that place faults)")
        return None
    campaign = (sweep["margin"], sweep.get("confidence", 0.95))
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in campaign):
        raise GridError(f"{path}: sweep.margin and sweep.confidence must be numbers (0.03 for ±3%, 0.95), got {campaign!r}")
    try:
        campaign_size(*campaign)
    except KvinjectError as e:
        raise GridError(f"{path}: [sweep] {e}") from None
    return campaign


def _caches(path: Path, sweep: dict[str, Any]) -> list[CacheOptions]:
    """The backend settings checked, then every cache of sweep.caches with the grid's flash attention and rotation."""
    for key in ("threads", "n_gpu_layers", "parallel"):
        if key in sweep and not _integer(sweep[key]):
            raise GridError(f"{path}: sweep.{key} must be an integer, got {sweep[key]!r}")
    try:
        BackendOptions(sweep.get("n_gpu_layers"), sweep.get("threads"), sweep.get("parallel"))
    except SpecError as e:
        raise GridError(f"{path}: {e.keyed(SWEEP_KEYS, '[sweep]')}") from None
    flash = sweep.get("flash_attn", "auto")
    if not isinstance(flash, str) or flash not in FLASH_ATTN:  # CacheOptions would say --flash-attn, at the first cache
        raise GridError(f"{path}: sweep.flash_attn must be auto, on or off, got {flash!r}")
    rotation = sweep.get("kv_rotation", True)
    if not isinstance(rotation, bool):
        raise GridError(f"{path}: sweep.kv_rotation must be true or false, got {rotation!r}")
    caches = []
    for i, spec in enumerate(_values("sweep.caches", sweep.get("caches", "f16"))):
        type_k, _, type_v = str(spec).partition("/")
        try:
            caches.append(CacheOptions(type_k, type_v or type_k, flash, rotation))
        except SpecError as e:
            raise GridError(f"{path}: sweep.caches[{i}]: {e}") from None
    return caches


def _targets(path: Path, sweep: dict[str, Any]) -> list[Target]:
    """Every combination of sweep.targets, layers, positions and heads."""
    targets = []
    for c, layers, positions, heads in itertools.product(
        _values("sweep.targets", sweep.get("targets", "kv")),
        _values("sweep.layers", sweep.get("layers", "all")),
        _values("sweep.positions", sweep.get("positions", "all")),
        _values("sweep.heads", sweep.get("heads", "all")),
    ):
        try:
            targets.append(Target.parse(str(c), str(layers), str(positions), str(heads)))
        except SpecError as e:
            raise GridError(f"{path}: {e.keyed(SWEEP_KEYS, '[sweep]')}") from None
    return targets
