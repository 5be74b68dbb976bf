"""Sensitivity maps: one error put into one layer's K or V at a time (or one KV head of it),
measured on one metric.

A profile is a sweep: its grid holds the control and, for every layer and for K and V (and for
every KV head, head by head), the error targeted there alone, so it runs, resumes and shares
workers as any sweep does, in its own store. The map is the metric's mean over runs per
(layer, component[, head]); for perplexity the default metric is the KL divergence of each
position's token distribution from the control's, which moves long before perplexity does.
"""

from __future__ import annotations

import re
from dataclasses import asdict
from pathlib import Path
from typing import Any, Sequence

import pandas as pd

from ..benchmarks import BENCHMARKS, Benchmark
from ..benchmarks.drift import METRICS as DRIFT
from ..engine.model import DEFAULT_MODEL, Model, resolve_model
from ..engine.options import BackendOptions, CacheOptions
from ..engine.target import Target
from ..error_models import ErrorModel
from ..exceptions import KvinjectError, SpecError
from .grid import Grid, build_grid

DEFAULT_METRIC = {"perplexity": "kld"}


def profile_metric(bench: str, metric: str | None) -> str:
    """``metric`` checked against what ``bench`` measures, or the profile's default for it."""
    if metric is None:
        return DEFAULT_METRIC.get(bench, BENCHMARKS[bench].primary)
    # A generation bench's drift metrics are measured against a cache-free control, and a
    # profile's control is `none`: asked for, they would be missing after every run was made.
    known = [m for m in (*BENCHMARKS[bench].higher_is_better, "bits") if not (m in DRIFT and bench != "perplexity")]
    if metric not in known:
        why = " (the drift metrics need a cache-free control, recompute, which a profile does not have)" if metric in DRIFT else ""
        raise KvinjectError(f"--metric {metric}: a profile of {bench} measures {', '.join(known)}{why}")
    return metric


def default_store(model: Path, bench: str, error: str) -> Path:
    slug = re.sub(r"[^A-Za-z0-9.]+", "_", error).strip("_")
    return Path(f"profile-{model.stem}-{bench}-{slug}.results.sqlite")


def profile_grid(
    model: str | None,
    bench: Benchmark,
    given: set[str],
    errors: Sequence[ErrorModel],
    cache: CacheOptions,
    backend: BackendOptions,
    runs: int = 1,
    seed: int = 0,
    store: Path | None = None,
    by_head: bool = False,
) -> Grid:
    """The profile as a grid whose path is its store (default: :func:`default_store`), built
    through the grid parser so that it is checked as a grid file is: the bench with the options
    named in ``given`` as ``bench.options`` holds them, the control, and each of ``errors`` on
    each layer's K and on each layer's V (``by_head``: on each KV head of them)."""
    for error in errors:
        if len(error.parts_on(Target())) > 1:
            raise KvinjectError(f"a profile puts one error model into one layer's K or V at a time, and '{error.spec}' is a composite of several: give one")
    for error in (e for e in errors if e.resident is not None):
        try:
            error.check_target(Target.parse("k", "0"), cache)
        except SpecError:  # said as the profile's own limit, not as flags the user never gave
            raise KvinjectError(
                f"a profile puts the error into one layer's K or V at a time, and '{error.spec}' acts on every layer's K and V together: "
                "it has no per-layer profile (compare it as a whole with kvinject run)"
            ) from None
    path = resolve_model(model)
    with Model(str(path), BackendOptions(n_gpu_layers=0)) as shape:  # mmapped: the layers, not the weights
        n_layer, n_head_kv = shape.n_layer, shape.n_head_kv
    options = given_options(bench, given)
    sweep: dict[str, Any] = {
        "models": [model or DEFAULT_MODEL],  # as the user named it, as kvinject run records it
        "runs": runs,
        "seeds": [seed],
        "targets": ["k", "v"],
        "layers": [str(il) for il in range(n_layer)],
        "heads": [str(h) for h in range(n_head_kv)] if by_head else ["all"],
        "caches": [f"{cache.type_k}/{cache.type_v}"],
        "flash_attn": cache.flash_attn,
        "kv_rotation": cache.kv_rotation,
    }
    sweep |= {k: v for k, v in (("threads", backend.threads), ("n_gpu_layers", backend.n_gpu_layers), ("parallel", backend.parallel)) if v is not None}
    raw = {"sweep": sweep, "bench": {bench.name: options}, "errors": [{"spec": [e.spec for e in errors]}]}
    return build_grid(store or default_store(path, bench.name, "+".join(e.spec for e in errors)), raw)


def given_options(bench: Benchmark, given: set[str]) -> dict[str, Any]:
    """The options of ``bench`` named in ``given`` (those the user set), as a grid's bench table holds them."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(bench.options).items() if k in given and v is not None}


def sensitivity(records: list[dict[str, Any]], error: ErrorModel, metric: str, by_head: bool = False) -> pd.DataFrame:
    """Layer x {k, v}: the metric's mean over the runs of ``error`` on that layer's K or V alone
    (records of other errors, or targeting several layers, are left out); ``by_head``: layer x
    {k0, k1, ..., v0, ...}, one KV head of that layer's K or V alone."""
    spec = error.spec
    values: dict[tuple[int, str, int], list[float]] = {}
    for r in records:
        s = r["settings"]
        heads = s.get("heads", "all")
        single = re.fullmatch(r"\d+", heads) if by_head else heads == "all"
        if s["error"] != spec or s["target"] not in ("k", "v") or not re.fullmatch(r"\d+", s["layers"]) or not single:
            continue
        value = r["metrics"].get(metric)
        if value is None:
            raise KvinjectError(f"the records have no metric '{metric}'; they have {', '.join(r['metrics'])}")
        values.setdefault((int(s["layers"]), s["target"], int(heads) if by_head else -1), []).append(value)
    if not values:
        raise KvinjectError(f"no record puts {spec} into a single {'KV head of a ' if by_head else ''}layer's K or V")
    cells = {(layer, c if head < 0 else f"{c}{head}"): sum(v) / len(v) for (layer, c, head), v in values.items()}
    table = pd.Series(cells).unstack()
    table.index.name, table.columns.name = "layer", None
    heads = sorted({head for _, _, head in values})
    return table.sort_index().reindex(columns=[c if head < 0 else f"{c}{head}" for c in "kv" for head in heads])
