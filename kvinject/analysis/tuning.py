"""What `kvinject tune` shows: the chosen allocation against the uniform choice on held-out text,
item by item, and the front as a figure."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from ..experiments.tune import Point, Result, Tuning, item_values, points
from .plots import _pyplot, _save
from .stats import PairedTest, compare_to_control


@dataclass(frozen=True)
class Proof:
    """The chosen allocation and its rival on the held-out text: their metric, and the paired
    test of the chosen one's items against the rival's (None without a rival)."""

    metric: str
    chosen: Point
    rival: Point | None
    test: PairedTest | None

    def table(self) -> pd.DataFrame:
        """The held-out comparison: each configuration's bits and metric, and the paired test."""
        rows = [("chosen", self.chosen)] + ([("uniform", self.rival)] if self.rival else [])
        table = pd.DataFrame([(name, p.spec, p.bits, p.value) for name, p in rows], columns=["held out", "configuration", "bits", self.metric])
        if self.test is not None:
            table["difference per item"] = [self.test.mean_diff, None]
            table["p"] = [self.test.p_value, None]
            table["items"] = [self.test.n, None]
        return table

    def text(self) -> str:
        c = self.chosen
        held = f"held out: {c.spec if self.rival is None else 'the chosen allocation'} {self.metric} {c.value:.4g} at {c.bits:.3g} bits"
        if self.rival is None or self.test is None:
            return held + " (no uniform choice within its bits to compare with)"
        t = self.test
        return (
            f"{held}; uniform {self.rival.spec} {self.rival.value:.4g} at {self.rival.bits:.3g} bits: "
            f"{t.mean_diff:+.4g} per item, {t.test} p = {t.p_value:.2g} over {t.n} items"
        )


def proof(tuning: Tuning, result: Result) -> Proof:
    """The held-out records of ``result`` compared: Wilcoxon's signed-rank test over items of
    the metric (or the per-item value it is computed from: perplexity's mean NLL per chunk)."""
    specs = [result.chosen.spec, *([result.rival.spec] if result.rival else [])]
    held = {p.spec: p for p in points(result.records, specs, tuning.metric, tuning.holdout)}
    chosen, rival = held[result.chosen.spec], held.get(result.rival.spec) if result.rival else None
    if rival is None:
        return Proof(tuning.metric, chosen, None, None)
    key = tuning.metric if tuning.metric in result.records[0]["items"] else tuning.bench.proxies[tuning.metric][0]
    ours, theirs = (item_values(result.records, spec, key, tuning.holdout) for spec in (chosen.spec, rival.spec))
    return Proof(tuning.metric, chosen, rival, compare_to_control(theirs, ours, binary=False))


def front_table(tuning: Tuning, result: Result) -> pd.DataFrame:
    """Every configuration run whole on the tuning text, by bits: which is chosen, uniform or on the front."""
    front, uniform = {p.spec for p in result.front}, set(tuning.uniform())
    rows = []
    for p in sorted(result.points, key=lambda p: (p.bits, p.value)):
        mark = "chosen" if p.spec == result.chosen.spec else "uniform" if p.spec in uniform else "front" if p.spec in front else ""
        rows.append((p.bits, p.value, mark, p.spec))
    return pd.DataFrame(rows, columns=["bits", tuning.metric, "", "configuration"])


def markdown(table: pd.DataFrame) -> str:
    return table.astype(object).where(table.notna(), None).to_markdown(index=False, floatfmt=".4g", missingval="")


def front_plot(tuning: Tuning, result: Result, path: Path) -> None:
    """The metric against bits per element on the tuning text: every configuration run whole,
    the uniform choices marked, the front drawn and the chosen allocation ringed."""
    plt = _pyplot("--plot")
    fig, ax = plt.subplots(figsize=(7, 4.5), layout="constrained")
    uniform = set(tuning.uniform())
    for name, chosen in (("allocations", lambda p: p.spec not in uniform), ("uniform choices", lambda p: p.spec in uniform)):
        shown = [p for p in result.points if chosen(p)]
        ax.plot([p.bits for p in shown], [p.value for p in shown], "o" if name == "allocations" else "s", label=name, alpha=0.8)
    for p in result.points:
        if p.spec in uniform:
            ax.annotate(p.spec, (p.bits, p.value), fontsize="x-small", xytext=(4, 4), textcoords="offset points")
    front = np.array([(p.bits, p.value) for p in result.front])
    ax.step(front[:, 0], front[:, 1], where="post", color="black", linewidth=0.8, alpha=0.6, label="Pareto front")
    ax.plot(result.chosen.bits, result.chosen.value, "o", markersize=14, fillstyle="none", color="red", label="chosen")
    ax.set_xlabel("bits per K/V element")
    ax.set_ylabel(tuning.metric)
    if tuning.lower_is_better and all(p.value > 0 for p in result.points):
        ax.set_yscale("log")
    ax.set_title(f"{Path(tuning.model).name} {tuning.bench.name}: {tuning.metric} on the tuning text", fontsize="small")
    ax.legend(fontsize="small")
    _save(plt, fig, path)
