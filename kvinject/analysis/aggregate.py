"""Aggregation with honest statistics: per configuration and metric, across runs and across
items, against the control."""

from __future__ import annotations

import math

import numpy as np

from ..benchmarks.base import Benchmark, RunResult
from ..benchmarks.options import Options
from ..engine.perturbation import changed_nothing as changes_nothing
from .stats import across_runs, bootstrap_ci, compare_to_control, paired_bootstrap, percent_of_control, proportion_ci


def _matrix(results: list[RunResult], metric: str) -> np.ndarray | None:
    rows = [r.items[metric] for r in results if metric in r.items]
    return np.array(rows, dtype=np.float64) if rows and len(rows) == len(results) else None


def changed_nothing(group: list[RunResult], control: list[RunResult]) -> bool:
    """A configuration meant to change the cache that changed nothing of it in any run: it
    measured nothing (a --positions selection past every prompt, a compressor whose budget the
    prompts never reach). Where no run's statistics can say (eviction), it did something where
    its bits per element fall below the control's."""
    verdicts = [changes_nothing(r.config.error, r.realized) for r in group]
    if all(v is None for v in verdicts):
        bits, ctl = [r.metrics.get("bits") for r in group], control[0].metrics.get("bits")
        return ctl is not None and None not in bits and all(b >= ctl for b in bits)
    return all(v is not False for v in verdicts)


def aggregate(bench: Benchmark | type[Benchmark], results: list[RunResult], options: Options | None = None) -> list[dict[str, object]]:
    """Per configuration and metric: across-run mean/std/t-CI, an interval across items,
    percent of control and a paired test against the control, with paired bootstrap CIs of
    the difference and of percent of control (items are the unit). ``options``: the bench's,
    when ``bench`` is its class (what is pass/fail may depend on them; without, the class's
    ``binary`` says)."""
    if options is None and isinstance(bench, Benchmark):
        options = bench.options
    binary = bench.binary if options is None else bench.pass_fail(options)
    groups: dict[str, list[RunResult]] = {}
    for r in results:
        groups.setdefault(r.config.label, []).append(r)
    if not groups:
        return []
    control_label, control = next(iter(groups.items()))
    out = []
    for label, group in groups.items():
        shown = group[0].config.label_beside(control[0].config)
        nothing = changed_nothing(group, control)
        metrics = list(dict.fromkeys(k for r in group for k in (*r.metrics, *r.extra)))
        for metric in metrics:
            values = [r.metrics.get(metric, r.extra.get(metric, math.nan)) for r in group]
            summary = across_runs(values)
            control_values = [r.metrics.get(metric, r.extra.get(metric, math.nan)) for r in control]
            control_mean = float(np.nanmean(control_values)) if np.isfinite(control_values).any() else math.nan
            item_metric, transform = bench.proxies.get(metric, (metric, None))
            matrix = _matrix(group, item_metric)
            # Item weights, the same in every run; records before format 3 have none.
            weighing = _matrix(group, bench.weights[metric]) if metric in bench.weights else None
            weights = weighing[0] if weighing is not None else None
            control_matrix = _matrix(control, item_metric)
            passes = item_metric in binary or (item_metric in bench.binary_if_zero_one and _zero_one(matrix) and _zero_one(control_matrix))
            # One run of pass/fail values: the Wilson interval, which a percentile bootstrap
            # shrinks to a point at 0 of n (a fault campaign's SDC rate) or n of n.
            proportion = matrix is not None and matrix.shape[0] == 1 and passes
            items_ci = None if matrix is None else proportion_ci(matrix) if proportion else bootstrap_ci(matrix, weights=weights)
            if items_ci is not None and transform is not None:
                items_ci = tuple(transform(x) for x in items_ci)
            row: dict[str, object] = {
                "bench": bench.name,
                "label": label,
                "metric": metric,
                "configuration": shown,  # the label as tables show it (Configuration.label_beside)
                "control": label == control_label,
                **summary.to_dict(),
                "items_ci": list(items_ci) if items_ci is not None else None,
                "items_ci_method": None if items_ci is None else "wilson" if proportion else "bootstrap",
                "percent_of_control": percent_of_control(summary.mean, control_mean),
                "diff_ci": None,
                "percent_ci": None,
                "nonfinite_items": sum(r.nonfinite_items for r in group),
                "changed_nothing": nothing,
                "test": None,
            }
            if label != control_label and matrix is not None and control_matrix is not None and np.isfinite(control_matrix).any():
                row["test"] = compare_to_control(control_matrix, matrix, binary=passes).to_dict()
                row["diff_ci"], row["percent_ci"] = map(list, paired_bootstrap(control_matrix, matrix, transform, weights=weights))
            out.append(row)
    return out


def _zero_one(matrix: np.ndarray | None) -> bool:
    """Every value given is 0 or 1 (NaN, an item not scored, left out)."""
    return matrix is not None and bool(np.isin(matrix[np.isfinite(matrix)], (0.0, 1.0)).all())
