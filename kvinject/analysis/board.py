"""The board: compressors side by side at fixed compression ratios, as kvpress's leaderboard
sets them (github.com/NVIDIA/kvpress, RULER at 4K, ratios 0.25 to 0.875).

Per model, every bench and option set of the records is one set of items (RULER's tasks), and a
configuration's score is the mean over all of them, paired item by item with the control's: its
95% interval (Wilson's for pass/fail items in one run, else the bootstrap over items) and the
paired test (exact McNemar for pass/fail, else Wilcoxon), as the study tables test. An eviction
configuration sits in the row of its method and query mode, in the column of its compression
ratio, 1 - its budget; any other (the quantizers) in the row of its model, in the column nearest
1 - bits / 16 of the bits per element it recorded: the same memory as eviction at that ratio.
"""

from __future__ import annotations

from dataclasses import fields
from fractions import Fraction
from typing import Any

import numpy as np
import pandas as pd

from ..benchmarks import BENCHMARKS
from ..error_models.configuration import Configuration
from ..error_models.evict import Evict
from ..exceptions import KvinjectError
from .report import experiment_key
from .stats import bootstrap_ci, compare_to_control, item_means, percent_of_control, proportion_ci

DEFAULTS = {f.name: f.default for f in fields(Evict)}
SIGNIFICANT = 0.05  # p below which a cell is marked better or worse than the control


def _place(record: dict[str, Any]) -> tuple[str, float | None]:
    """The row and the column (compression ratio; None: by bits) of a record's configuration."""
    error = Configuration.from_dict(record["settings"]).error
    if isinstance(error, Evict):
        options = [f"{k}={getattr(error, k)}" for k in error.way.options() if getattr(error, k) != DEFAULTS[k]]
        method = f"{error.method}+{error.alloc}" if error.alloc else error.method  # budgets per head (ada) or layer (pyramid)
        row = f"{method} ({error.query or 'aware'})" + (f" {','.join(options)}" if options else "")
        if "." in error.budget and error.decode == 0:
            return row, float(1 - Fraction(error.budget))
        raise KvinjectError(f"--board places eviction by its ratio, compressed once (decode=0): {record['label']} is neither")
    return error.name, None


def board(records: list[dict[str, Any]]) -> pd.DataFrame:
    """One row per model and configuration: its row and ratio on the board, bits, the pooled
    score with its interval, percent of control and the paired test's p."""
    models: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for r in records:
        models.setdefault(r["settings"]["model_sha256"], {}).setdefault(experiment_key(r), []).append(r)
    rows = []
    for experiments in models.values():
        controls = {e: [r for r in group if r["settings"].get("control")] for e, group in experiments.items()}
        if not all(controls.values()):
            raise KvinjectError("--board pools every bench of a model against its control: a store lacks a control; give the store that holds it too")
        labels = [{r["label"] for r in group if not r["settings"].get("control")} for group in experiments.values()]
        first = next(iter(experiments.values()))
        everywhere = [label for label in dict.fromkeys(r["label"] for r in first) if all(label in found for found in labels)]  # in the grid's order
        control = np.concatenate([_items(controls[e]) for e in experiments])
        binary = _binary(control)
        for label in everywhere:
            found = [[r for r in group if r["label"] == label] for group in experiments.values()]
            scores = np.concatenate([_items(f) for f in found])
            row, ratio = _place(found[0][0])
            binary_here = binary and _binary(scores)
            ci = proportion_ci(scores) if binary_here and len(found[0]) == 1 else bootstrap_ci(scores[None, :])
            bits = float(np.mean([r["metrics"]["bits"] for f in found for r in f]))
            rows.append(
                {
                    "model": first[0]["settings"].get("model"),
                    "row": row,
                    "ratio": ratio if ratio is not None else 1 - bits / 16,
                    "placed": "ratio" if ratio is not None else "bits",
                    "configuration": label,
                    "bits": bits,
                    "items": int(np.isfinite(scores).sum()),
                    "score": float(np.nanmean(scores)),
                    "low": ci[0],
                    "high": ci[1],
                    "control": float(np.nanmean(control)),
                    "percent_of_control": percent_of_control(np.nanmean(scores), np.nanmean(control)),
                    "p": compare_to_control(control, scores, binary=binary_here).p_value,
                }
            )
    if not rows:
        raise KvinjectError("--board needs configurations run beside a control on every bench of a model (eviction at ratios, quantizers)")
    return pd.DataFrame(rows)


def _items(records: list[dict[str, Any]]) -> np.ndarray:
    """The item scores of one configuration in one experiment, averaged over its runs."""
    bench = BENCHMARKS[records[0]["settings"]["bench"]]
    return item_means([[np.nan if x is None else x for x in r["items"][bench.primary]] for r in records])


def _binary(scores: np.ndarray) -> bool:
    return bool(np.isin(scores[np.isfinite(scores)], (0.0, 1.0)).all())


def layout(table: pd.DataFrame, digits: int = 2) -> list[tuple[str, pd.DataFrame]]:
    """For reading, per model: methods down, ratios across, each cell the score with its interval
    and a mark where the paired test finds it below (↓) or above (↑) the control at p < 0.05; a
    configuration placed by its bits goes to the ratio column nearest to it."""
    ratios = sorted(table.loc[table["placed"] == "ratio", "ratio"].unique())
    if not ratios:
        raise KvinjectError("--board lays configurations out by the compression ratios of eviction (evict:METHOD,RATIO,decode=0): these records have none")
    out = []
    for model, part in table.groupby("model", sort=False):
        columns = [min(ratios, key=lambda x: abs(x - ratio)) for ratio in part["ratio"]]
        rows = list(part["row"])
        taken = pd.Series(list(zip(rows, columns))).duplicated(keep=False).tolist()
        cells: dict[str, dict[float, str]] = {}
        for r, column, twice in zip(part.itertuples(), columns, taken):
            mark = "" if not r.p < SIGNIFICANT else " ↓" if r.score < r.control else " ↑"
            text = f"{r.score:.{digits}f} ({r.low:.{digits}f}–{r.high:.{digits}f}){mark}" + (f" @{r.bits:.3g}b" if r.placed == "bits" else "")
            cells.setdefault(r.configuration if twice else r.row, {})[column] = text  # two of a row in one column: each its own row
        wide = pd.DataFrame([{"method": row, **{f"{ratio:g}": cells[row].get(ratio, "") for ratio in ratios}} for row in cells])
        control = part["control"].iloc[0]
        title = f"{model}: {int(part['items'].max())} items, full cache {control:.{digits}f}; compression ratio across (quantizers by their bits, @b)"
        out.append((title, wide))
    return out
