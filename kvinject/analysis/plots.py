"""Figures of a report: degradation curves, length x depth heatmaps, the quality-versus-
memory frontier, sensitivity and divergence maps. Matplotlib is optional (the ``plot`` extra) and imported only to draw."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..benchmarks import BENCHMARKS
from ..benchmarks.outcomes import METRICS as OUTCOMES
from ..exceptions import KvinjectError
from ..experiments.allocation import pareto
from ..files import write_with
from .report import experiment_ids, experiments, primary_rows


def _pyplot(option: str) -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise KvinjectError(f"{option} needs matplotlib: pip install 'kvinject[plot]'") from None
    return plt


def _save(plt: Any, fig: Any, path: Path) -> None:
    """The figure into ``path`` by way of a temporary sibling (kvinject.files), and closed."""
    try:
        write_with(path, lambda tmp: fig.savefig(tmp, dpi=120))
    finally:
        plt.close(fig)


def plot(df: pd.DataFrame, path: Path, metric: str | None = None) -> None:
    """Degradation curves: each bench's primary score (or `metric`) against the realized
    relative error of K (std), one line per error family, with the runs' 95% CI as a band; a
    panel per experiment (a model's bench with its options), a row of panels per model, each
    against its own control (none drawn for a metric measured against it, such as kld)."""
    plt = _pyplot("--plot")
    panels = experiments(df[primary_rows(df, metric)])
    by_model: dict[str, list[tuple[str, pd.DataFrame]]] = {}
    for title, rows in panels:
        by_model.setdefault(rows["model_sha256"].iloc[0], []).append((title, rows))
    columns = min(4, max(map(len, by_model.values())))
    places, n_rows = [], 0  # each model's panels from a row of their own
    for group in by_model.values():
        places += [((n_rows + i // columns, i % columns), panel) for i, panel in enumerate(group)]
        n_rows += math.ceil(len(group) / columns)
    fig, axes = plt.subplots(n_rows, columns, figsize=(5 * columns, 4 * n_rows), squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    for (r, c), (title, rows) in places:
        ax = axes[r, c]
        ax.axis("on")
        is_control = rows["control"].astype(bool)
        control = rows[is_control]
        if len(control):
            ax.axhline(control["mean"].iloc[0], color="gray", linestyle="--", label=f"control ({control['configuration'].iloc[0]})")
        families = rows[~is_control].assign(family=lambda d: d["label"].str.split(":").str[0])
        for family, part in families.groupby("family", sort=False):
            part = part.dropna(subset=["realized_k_rel_std"]).sort_values("realized_k_rel_std")
            if part.empty:
                continue
            x = part["realized_k_rel_std"]
            ax.plot(x, part["mean"], marker="o", label=family)
            # One run has no interval across runs: no band there, rather than one of zero width.
            ax.fill_between(x, part["ci_low"], part["ci_high"], where=part["ci_low"].notna(), alpha=0.2)
        drawn = rows[is_control | rows["realized_k_rel_std"].notna()]  # the native caches have no point
        if np.isfinite(drawn["mean"].to_numpy(float)).any():
            ax.set_ylim(*score_range(drawn))
        ax.set_xlabel("realized relative error of K (std)")
        ax.set_ylabel(metric or BENCHMARKS[rows["bench"].iloc[0]].primary)
        ax.set_title(title, fontsize="small", wrap=True)
        ax.legend(fontsize="small")
    fig.tight_layout()
    _save(plt, fig, path)


def score_range(rows: pd.DataFrame) -> tuple[float, float]:
    """A panel's vertical range: its finite scores and their bands, which widen it by at most
    the scores' span on each side. A t-interval over two or three runs can reach far past what a
    metric can take (an accuracy's -2 to 2) and would flatten every curve; such bands are cut."""
    finite = rows[np.isfinite(rows["mean"].to_numpy(float))]
    low, high = finite["mean"].min(), finite["mean"].max()
    span = (high - low) or 0.1 * abs(high) or 0.1
    bottom = max(np.nanmin([finite["ci_low"].min(), low]), low - span)
    top = min(np.nanmax([finite["ci_high"].max(), high]), high + span)
    return bottom - 0.05 * span, top + 0.05 * span


# Per-cell metrics of the long-context benchmarks: METRIC@LENGTH/DEPTH.
CELL_METRIC = re.compile(r"(?P<metric>.+)@(?P<length>\d+)/(?P<depth>\d+)")


def cell_scores(records: list[dict[str, Any]]) -> dict[tuple[str, str], dict[tuple[int, int], list[float]]]:
    """(bench and options, configuration) -> (length, depth) -> the bench's primary metric in
    that cell, one value per run."""
    panels: dict[tuple[str, str], dict[tuple[int, int], list[float]]] = {}
    for r in records:
        s = r["settings"]
        bench = BENCHMARKS.get(s["bench"])
        options = ", ".join(f"{k}={v}" for k, v in sorted(s["options"].items()) if k not in ("lengths", "depths") and v is not None)
        for name, value in r["metrics"].items():
            m = CELL_METRIC.fullmatch(name)
            if m and bench is not None and m["metric"] == bench.primary and value is not None:
                cell = (int(m["length"]), int(m["depth"]))
                model = Path(str(s.get("model"))).name
                panels.setdefault((f"{model} {s['bench']} ({options})", r["label"]), {}).setdefault(cell, []).append(value)
    return panels


def heatmap(records: list[dict[str, Any]], path: Path) -> None:
    """The primary score over context length x needle depth, as needle-in-a-haystack plots
    show it: one panel per bench (with its options) and configuration, the mean across runs."""
    panels = cell_scores(records)
    if not panels:
        raise KvinjectError(
            f"--heatmap needs per-cell metrics (METRIC@LENGTH/DEPTH, recorded by passkey, niah and vt); none of the {len(records)} records has them"
        )
    plt = _pyplot("--heatmap")
    cols = min(3, len(panels))
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.5 * cols, 3.8 * rows), squeeze=False, layout="constrained")
    for ax in axes.flat[len(panels) :]:
        ax.axis("off")
    for ax, ((experiment, label), cells) in zip(axes.flat, panels.items()):
        lengths = sorted({n for n, _ in cells})
        depths = sorted({d for _, d in cells})
        grid = np.full((len(depths), len(lengths)), np.nan)
        for (n, d), values in cells.items():
            grid[depths.index(d), lengths.index(n)] = np.mean(values)
        image = ax.imshow(grid, cmap="RdYlGn", vmin=0, vmax=1, aspect="auto")
        for (i, j), value in np.ndenumerate(grid):
            if np.isfinite(value):
                ax.text(j, i, f"{value:.2f}", ha="center", va="center", fontsize="small")
        ax.set_xticks(range(len(lengths)), [str(n) for n in lengths])
        ax.set_yticks(range(len(depths)), [f"{d}%" for d in depths])
        ax.set_xlabel("context length (tokens)")
        ax.set_ylabel("depth")
        ax.set_title(f"{label}\n{experiment}", fontsize="small")
    fig.colorbar(image, ax=axes, shrink=0.8)
    _save(plt, fig, path)


def family(label: str) -> str:
    """The compressor family of a configuration label: its error model's name, the native
    cache type for ``none @q4_0``, or the method of an eviction (each a compressor of its own)."""
    name = re.split(r"[:\s@]", label, maxsplit=1)[0]
    if name == "none":
        return "native " + label.partition("@")[2] if "@" in label else "none"
    if name == "evict":
        return "evict " + re.split(r"[,\s@]", label.partition(":")[2], maxsplit=1)[0]
    return name


def interval(row: pd.Series) -> tuple[float, float]:
    """A configuration's 95% interval: across runs, or for one run (a deterministic compressor)
    the interval over items; NaN where neither exists."""
    if pd.notna(row["ci_low"]):
        return row["ci_low"], row["ci_high"]
    boot = row.get("items_ci")
    if isinstance(boot, (list, tuple)) and len(boot) == 2 and None not in boot:
        return boot[0], boot[1]
    return math.nan, math.nan


def frontier_points(rows: pd.DataFrame) -> tuple[bool, np.ndarray, list[tuple[float, float]]]:
    """What a frontier panel draws for each row: percent of control with its paired 95% interval
    where the rows have one (the comparison the tables test; the control at 100 without one),
    else the score with its 95% CI. An absolute score's interval over items spans the items'
    spread (perplexity 8.6-11.3 for the control over 20 chunks) and hid differences of 1-2% that
    the paired test finds. Returns whether relative, the values and their intervals."""
    bounds = [(ci[0], ci[1]) if isinstance(ci, (list, tuple)) and None not in ci else (math.nan, math.nan) for ci in rows["percent_ci"]]
    if all(math.isnan(lo) for lo, _ in bounds):
        return False, rows["mean"].to_numpy(float), [interval(row) for _, row in rows.iterrows()]
    return True, rows["percent_of_control"].fillna(100.0).to_numpy(float), bounds


def bits_column(df: pd.DataFrame) -> pd.Series:
    """Each row's bits per K/V element as the runs of its own experiment recorded them (an
    eviction's depend on the lengths its bench ran at), indexed as ``df``; NaN where none were."""
    keys = pd.Series(list(zip(experiment_ids(df), df["label"])), index=df.index)
    recorded = df["metric"] == "bits"
    return keys.map(df[recorded].groupby(keys[recorded])["mean"].mean())


def frontier(df: pd.DataFrame, path: Path, metric: str | None = None) -> None:
    """Each bench's primary score (or `metric`) against bits per K/V element, one point per
    configuration: as percent of control with its paired 95% interval where the panel's rows
    have one, else the score with its 95% CI (:func:`interval`); the Pareto front drawn, one colour per compressor
    family: compressors side by side at equal memory. A panel per experiment (a model's bench
    with its options), with the bits its own runs recorded (an eviction's depend on the lengths)."""
    table = df[primary_rows(df, metric)]
    if not (df["metric"] == "bits").any():
        raise KvinjectError("--frontier needs the bits per element that results record since this version of kvinject: rerun the sweep")
    plt = _pyplot("--frontier")
    try:
        from adjustText import adjust_text
    except ImportError:
        raise KvinjectError("--frontier needs adjustText: pip install 'kvinject[plot]'") from None
    panels = experiments(table)
    bits = bits_column(df)
    fig, axes = plt.subplots(1, len(panels), figsize=(8.5 * len(panels), 5.5), squeeze=False, layout="constrained")
    colours = {f: plt.cm.tab10(i % 10) for i, f in enumerate(dict.fromkeys(map(family, table["label"])))}
    for ax, (title, rows) in zip(axes[0], panels):
        bench = rows.iloc[0]["bench"]
        x = bits[rows.index].to_numpy(float)
        relative, y, bounds = frontier_points(rows)
        texts = []
        for (label, row), xi, yi, (lo, hi) in zip(rows.iterrows(), x, y, bounds):
            err = [[yi - lo], [hi - yi]] if pd.notna(lo) else None
            f = family(row["label"])
            ax.errorbar(xi, yi, yerr=err, fmt="o", color=colours[f], capsize=3, label=f)
            if np.isfinite(xi):
                texts.append(ax.text(xi, yi, row["configuration"], fontsize="x-small"))
        ok = np.isfinite(x) & np.isfinite(y)
        shown = metric or BENCHMARKS[bench].primary
        front = np.flatnonzero(ok)[pareto(x[ok], y[ok], BENCHMARKS[bench].higher_is_better[shown])]
        if len(front):  # the front holds from its last point to the most bits shown
            fx, fy = np.append(x[front], x[ok].max()), np.append(y[front], y[front[-1]])
            ax.step(fx, fy, where="post", color="black", linewidth=0.8, alpha=0.6, label="Pareto front")
        ax.margins(x=0.12)
        handles, labels = ax.get_legend_handles_labels()
        unique = dict(zip(labels, handles))
        ax.legend(unique.values(), unique.keys(), fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1))  # outside: labels go anywhere
        ax.set_xlabel("bits per K/V element")
        ax.set_ylabel(f"{shown}, % of control (paired 95% CI)" if relative else shown)
        if relative:
            ax.axhline(100, color="gray", linewidth=0.6, linestyle=":")
        ax.set_title(title, fontsize="small")
        # Compressors crowd at equal bits (8.5: q8_0, kivi:4, quant:8): labels moved apart, a line to each point.
        adjust_text(texts, x=x[ok], y=y[ok], ax=ax, arrowprops={"arrowstyle": "-", "color": "gray", "lw": 0.5})
    _save(plt, fig, path)


def sensitivity_map(table: pd.DataFrame, metric: str, title: str, path: Path) -> None:
    """A profile's metric per layer (across) for K and V, or their heads (down), as a heatmap."""
    plt = _pyplot("--heatmap")
    grid = table.T.to_numpy(float)
    fig, ax = plt.subplots(figsize=(max(6.0, 0.35 * grid.shape[1] + 2), max(2.6, 0.3 * grid.shape[0] + 2)), layout="constrained")
    image = ax.imshow(grid, cmap="magma_r", aspect="auto")
    if grid.shape[1] <= 40:
        for (i, j), value in np.ndenumerate(grid):
            ax.text(j, i, f"{value:.2g}", ha="center", va="center", fontsize="xx-small", color="gray")
    ax.set_xticks(range(grid.shape[1]), [str(layer) for layer in table.index], fontsize="x-small")
    ax.set_yticks(range(grid.shape[0]), [c.upper() for c in table.columns])
    ax.set_xlabel("layer")
    ax.set_title(title, fontsize="small")
    fig.colorbar(image, ax=ax, label=metric)
    _save(plt, fig, path)


def outcomes(df: pd.DataFrame, path: Path) -> None:
    """A fault campaign's outcomes: per configuration, the shares of items masked, benign, SDC
    and DUE against the control (stacked, mean over runs), a panel per model and bench; a sweep
    over ``bit=`` gives the per-bit sensitivity."""
    rows = df[df["metric"].isin(list(OUTCOMES))]
    if rows.empty:
        raise KvinjectError("--outcomes needs the per-item outcomes that generation benchmarks record against the control; these records have none")
    plt = _pyplot("--outcomes")
    panels = experiments(rows)
    fig, axes = plt.subplots(
        len(panels), 1, figsize=(max(6.0, 0.45 * rows["configuration"].nunique() + 2), 3.6 * len(panels)), squeeze=False, layout="constrained"
    )
    colours = {"masked": "#4c9f70", "benign": "#9ecae1", "sdc": "#e6550d", "due": "#636363"}
    for ax, (title, part) in zip(axes[:, 0], panels):
        table = part.pivot_table(index="configuration", columns="metric", values="mean", sort=False).reindex(columns=list(OUTCOMES)).fillna(0)
        bottom = np.zeros(len(table))
        for name in OUTCOMES:
            ax.bar(range(len(table)), table[name], bottom=bottom, color=colours[name], label=name)
            bottom += table[name].to_numpy()
        ax.set_xticks(range(len(table)), table.index, rotation=60, ha="right", fontsize="x-small")
        ax.set_ylabel("share of items")
        ax.set_ylim(0, 1)
        ax.set_title(f"{title}, outcomes against the control", fontsize="small")
        ax.legend(fontsize="x-small", loc="center left", bbox_to_anchor=(1.0, 0.5))
    _save(plt, fig, path)


def fault_map(table: pd.DataFrame, by: list[str], path: Path) -> None:
    """A single-fault campaign's vulnerability map (kvinject/analysis/faults.py): the SDC and DUE
    rates with their 95% Wilson intervals for each value of ``by`` (a bit position, a field and
    bit, a layer), a panel per model, bench and stored format."""
    plt = _pyplot("--faults with --plot")
    panels = list(table.groupby(["model", "bench", "format"], sort=False))
    width = max(6.0, 0.32 * max(len(p) for _, p in panels) + 2)
    fig, axes = plt.subplots(len(panels), 1, figsize=(width, 3.2 * len(panels)), squeeze=False, layout="constrained")
    for ax, ((model, bench, fmt), part) in zip(axes[:, 0], panels):
        x = np.arange(len(part))
        for name, colour, shift in (("sdc", "#e6550d", -0.12), ("due", "#636363", 0.12)):
            low, high = (np.array([ci[i] for ci in part[f"{name}_ci"]]) for i in (0, 1))
            rate = part[name].to_numpy()
            ax.errorbar(x + shift, rate, yerr=[rate - low, high - rate], fmt="o", ms=3, color=colour, capsize=2, label=name.upper())
        ax.set_xticks(x, [" ".join(str(part[b].iloc[i]) for b in by) for i in range(len(part))], rotation=60, ha="right", fontsize="x-small")
        ax.set_xlabel(" ".join(by), fontsize="small")
        ax.set_ylabel("share of single faults")
        highest = max(high for name in ("sdc_ci", "due_ci") for _, high in part[name])
        ax.set_ylim(-0.02, min(1.02, max(0.1, highest * 1.1)))
        ax.set_title(f"{Path(str(model)).name}: {bench}, {fmt} cache, {int(part['faults'].sum())} single faults (95% Wilson intervals)", fontsize="small")
        ax.legend(fontsize="x-small", loc="upper left")
    _save(plt, fig, path)


def divergence_map(offsets: np.ndarray, grids: list[np.ndarray], labels: list[str], title: str, path: Path) -> None:
    """Layer-wise divergence, layers (down) x positions from the first generated token (across),
    a panel per configuration on one logarithmic scale; a distance of exactly 0 is white,
    positions without a value (the last layer before the prompt's last token) grey."""
    from matplotlib.colors import LogNorm

    plt = _pyplot("--heatmap")
    positive = np.concatenate([g[np.isfinite(g) & (g > 0)] for g in grids])
    low, high = (positive.min(), positive.max()) if positive.size else (1e-9, 1.0)
    norm = LogNorm(vmin=low, vmax=max(high, low * 10))
    cmap = plt.get_cmap("magma_r").with_extremes(under="white", bad="lightgrey")
    width = max(6.0, min(16.0, 0.08 * len(offsets) + 3))
    fig, axes = plt.subplots(
        len(grids), 1, figsize=(width, 0.12 * grids[0].shape[0] * len(grids) + 1.2 * len(grids) + 0.6), squeeze=False, layout="constrained"
    )
    for ax, grid, label in zip(axes[:, 0], grids, labels):
        shown = np.where(grid == 0, low / 10, grid)  # exactly 0: below the scale, drawn white
        image = ax.imshow(
            shown, cmap=cmap, norm=norm, aspect="auto", interpolation="nearest", extent=(offsets[0] - 0.5, offsets[-1] + 0.5, grid.shape[0] - 0.5, -0.5)
        )
        ax.set_ylabel("layer")
        ax.set_title(label, fontsize="small")
    axes[-1, 0].set_xlabel("position from the first generated token")
    fig.suptitle(title, fontsize="small")
    fig.colorbar(image, ax=axes[:, 0], label="||x - x_ref|| / ||x_ref||", extend="min")
    _save(plt, fig, path)
