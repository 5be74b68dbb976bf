"""The figures of a study's web page as Vega-Lite specifications (drawn with Altair), from the
page's data (page_data.py) alone: degradation curves, the bits frontier, length x depth
heatmaps, the board and the fault map, the ones ``report`` draws as PNG files (plots.py). Every
mark names its row (``id``) and configuration, which the page uses to filter its table."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..exceptions import KvinjectError

WIDTH, HEIGHT = 260, 200  # a panel's size in pixels
COLUMNS = 3  # panels a row
NEEDS = "--html needs altair and vl-convert-python: pip install 'kvinject[html]'"


def _altair() -> Any:
    try:
        import altair as alt
    except ImportError:
        raise KvinjectError(NEEDS) from None
    return alt


def figures(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each figure the data makes, by name: its title and Vega-Lite specification; a figure
    these records cannot give is left out."""
    made = {
        "curves": ("Degradation curves: score against the realized relative error of K", curves(data["rows"])),
        "frontier": ("Frontier: score against bits per K/V element, Pareto front in black", frontier(data["rows"])),
        "heatmap": ("Score over context length × needle depth", heatmap(data["heatmap"])),
        "board": ("Board: score per method and compression ratio", board(data["board"])),
        "faults": ("Fault map: SDC and DUE rates of single faults by bit", fault_map(data["faults"])),
    }
    return {name: {"title": title, "spec": chart.to_dict()} for name, (title, chart) in made.items() if chart is not None}


# What each figure's marks read of a row: the page carries the rows once, the figures these.
CURVE_KEYS = ("id", "experiment", "family", "control", "realized_k", "ci_low", "ci_high")
FRONTIER_KEYS = ("id", "experiment", "family", "control", "bits", "frontier_y", "frontier_low", "frontier_high", "relative", "front")


def _points(rows: list[dict[str, Any]], keep: str, keys: tuple[str, ...]) -> list[dict[str, Any]]:
    """The rows a figure places (those with ``_[keep]``), flat: the ``report --format json``
    numbers beside the page's ``keys``, one record per mark."""
    out = []
    for row in rows:
        extra = row["_"]
        if extra.get(keep) is None:
            continue
        out.append({**{k: extra[k] for k in keys}, "configuration": row["configuration"], "score": row["score"], "runs": row["runs"]})
    return out


def curves(rows: list[dict[str, Any]]) -> Any:
    """Each experiment's score against the realized relative error of K, a line per error
    family with the runs' 95% interval as a band, the control as a dashed rule."""
    points = _points([r for r in rows if not r["_"]["control"]], "realized_k", CURVE_KEYS)
    if not points:
        return None
    alt = _altair()
    experiments = {p["experiment"] for p in points}
    controls = [r for r in rows if r["_"]["control"] and r["_"]["experiment"] in experiments]
    values = points + _points(controls, "id", CURVE_KEYS)
    base = alt.Chart(alt.Data(values=values))
    curve = base.encode(x=alt.X("realized_k:Q", title="realized relative error of K (std)"), color=alt.Color("family:N", title="error family"))
    curve = curve.transform_filter("!datum.control")
    band = (
        curve.mark_errorband().encode(y=alt.Y("ci_low:Q", title="score", scale=alt.Scale(zero=False)), y2="ci_high:Q").transform_filter("datum.ci_low != null")
    )
    line = curve.mark_line().encode(y="score:Q", detail="family:N")
    marks = curve.mark_point(filled=True, size=50).encode(y="score:Q", tooltip=_tooltip("ci_low", "ci_high", "runs (n)")).properties(name="curves_points")
    rule = base.mark_rule(strokeDash=[4, 3], color="gray").encode(y="score:Q", tooltip=_tooltip("ci_low", "ci_high", "runs (n)"))
    layered = alt.layer(band, line, marks, rule.transform_filter("datum.control")).properties(width=WIDTH, height=HEIGHT)
    return _facet(alt, layered, values)


def frontier(rows: list[dict[str, Any]]) -> Any:
    """Each experiment's score (as percent of control where its panel has the paired interval)
    against bits per K/V element, a colour per compressor family, the Pareto front as a step."""
    points = _points(rows, "bits", FRONTIER_KEYS)
    points = [p for p in points if p["frontier_y"] is not None]
    if not points:
        return None
    alt = _altair()
    base = alt.Chart(alt.Data(values=points)).encode(x=alt.X("bits:Q", title="bits per K/V element", scale=alt.Scale(zero=False)))
    title = "% of control (paired 95% CI), or score"
    y = alt.Y("frontier_y:Q", title=title, scale=alt.Scale(zero=False))
    bars = base.mark_rule().encode(y=alt.Y("frontier_low:Q", title=title), y2="frontier_high:Q", color="family:N")
    bars = bars.transform_filter("datum.frontier_low != null")
    front = base.mark_line(interpolate="step-after", color="black", opacity=0.6).encode(y="frontier_y:Q").transform_filter("datum.front")
    tooltip = _tooltip("frontier_low", "frontier_high", "runs (n)", value="frontier_y")
    marks = base.mark_point(filled=True, size=60).encode(y=y, color=alt.Color("family:N", title="family"), tooltip=tooltip)
    layered = alt.layer(bars, front, marks.properties(name="frontier_points")).properties(width=WIDTH, height=HEIGHT)
    return _facet(alt, layered, points)


def heatmap(cells: list[dict[str, Any]]) -> Any:
    """The score over context length x needle depth: a panel per bench with its options, a row
    per configuration, a column per length and depth (the PNG's panel per configuration would
    make hundreds of panels of a board's study)."""
    if not cells:
        return None
    alt = _altair()
    cells = [{**{k: v for k, v in c.items() if k != "panel"}, "experiment": c["panel"], "cell": f"{c['length']}/{c['depth']}%"} for c in cells]
    order = [f"{n}/{d}%" for n, d in sorted({(c["length"], c["depth"]) for c in cells})]
    base = alt.Chart(alt.Data(values=cells)).encode(
        x=alt.X("cell:O", title="context length (tokens) / needle depth", sort=order), y=alt.Y("configuration:N", title=None, sort=None)
    )
    tooltip = ["configuration:N", "length:O", "depth:O", alt.Tooltip("score:Q", format=".3f"), alt.Tooltip("n:Q", title="runs (n)")]
    rect = base.mark_rect().encode(color=alt.Color("score:Q", scale=alt.Scale(scheme="redyellowgreen", domain=[0, 1])), tooltip=tooltip)
    text = base.mark_text(fontSize=9).encode(text=alt.Text("score:Q", format=".2f"))
    rows = max(len({c["configuration"] for c in cells if c["experiment"] == e}) for e in {c["experiment"] for c in cells})
    layered = alt.layer(rect.properties(name="heatmap_cells"), text).properties(width=34 * len(order), height=14 * rows)  # a Step fails in facets
    return _facet(alt, layered, cells)


def board(cells: list[dict[str, Any]]) -> Any:
    """The board (report --board): method down, compression ratio across, each cell its score."""
    if not cells:
        return None
    alt = _altair()
    cells = [{**c, "experiment": Path(str(c["model"])).name, "ratio_shown": f"{c['ratio']:.3g}"} for c in cells]
    base = alt.Chart(alt.Data(values=cells)).encode(x=alt.X("ratio_shown:O", title="compression ratio"), y=alt.Y("row:N", title="method"))
    tooltip = ["configuration:N", alt.Tooltip("score:Q", format=".3f"), alt.Tooltip("low:Q", format=".3f"), alt.Tooltip("high:Q", format=".3f")]
    tooltip += [alt.Tooltip("items:Q", title="items (n)"), alt.Tooltip("p:Q", format=".2g"), alt.Tooltip("bits:Q", format=".3g")]
    rect = base.mark_rect().encode(color=alt.Color("score:Q", scale=alt.Scale(scheme="redyellowgreen")), tooltip=tooltip)
    text = base.mark_text(fontSize=9).encode(text=alt.Text("score:Q", format=".2f"))
    layered = alt.layer(rect.properties(name="board_cells"), text).properties(width=WIDTH * 1.4, height=HEIGHT)
    return _facet(alt, layered, cells)


def fault_map(cells: list[dict[str, Any]]) -> Any:
    """SDC and DUE rates of single faults by bit (a colour per field of the format), with their
    Wilson intervals, a panel per model, bench, format and outcome."""
    if not cells:
        return None
    alt = _altair()
    values = []
    for c in cells:
        for outcome in ("sdc", "due"):
            title = f"{Path(str(c['model'])).name}: {c['bench']}, {c['format']}, {outcome.upper()}"
            values.append({**c, "experiment": title, "outcome": outcome, "rate": c[outcome], "low": c[f"{outcome}_low"], "high": c[f"{outcome}_high"]})
    base = alt.Chart(alt.Data(values=values)).encode(x=alt.X("bit:O", title="bit"))
    tooltip = ["field:N", "bit:O", "outcome:N", alt.Tooltip("rate:Q", format=".3f"), alt.Tooltip("low:Q", format=".3f")]
    tooltip += [alt.Tooltip("high:Q", format=".3f"), alt.Tooltip("faults:Q", title="faults (n)")]
    bars = base.mark_bar().encode(y=alt.Y("rate:Q", title="share of faults"), color="field:N", tooltip=tooltip).properties(name="fault_bars")
    rules = base.mark_rule().encode(y="low:Q", y2="high:Q")
    return _facet(alt, alt.layer(bars, rules).properties(width=WIDTH * 1.4, height=HEIGHT * 0.8), values)


def _tooltip(low: str, high: str, n: str, value: str = "score") -> list[Any]:
    """What hovering a configuration's point shows: its configuration, value, interval and n."""
    alt = _altair()
    return [
        "configuration:N",
        "experiment:N",
        alt.Tooltip(f"{value}:Q", title="value", format=".4g"),
        alt.Tooltip(f"{low}:Q", title="95% CI low", format=".4g"),
        alt.Tooltip(f"{high}:Q", title="95% CI high", format=".4g"),
        alt.Tooltip("runs:Q", title=n),
    ]


def _facet(alt: Any, chart: Any, values: list[dict[str, Any]]) -> Any:
    """A panel per experiment, each with its own vertical scale (an experiment has its own
    control), at most :data:`COLUMNS` a row."""
    faceted = chart.facet(facet=alt.Facet("experiment:N", title=None, sort=list(dict.fromkeys(v["experiment"] for v in values))), columns=COLUMNS)
    return faceted.resolve_scale(y="independent", x="independent")
