"""A study as one web page (``kvinject report --html``): a single file holding its scripts,
styles and data, which opens from disk with no network. Vega-Lite draws the figures, its
runtime inlined from vl-convert's bundle; page.js builds the table, its filters and sort, and
the items' drill-down; page_data.py gives the numbers of both."""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

import pandas as pd

from ..exceptions import KvinjectError
from .page_data import page_data
from .page_figures import figures
from .tables import NOTHING_NOTE

HERE = Path(__file__).resolve().parent
INLINED = ("manifest", "rows", "columns", "items")  # what the page's script reads; the figures carry their own cells

TEMPLATE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{title}</title>
<style>{css}</style>
<script>{bundle}</script>
</head>
<body>
<h1>{title}</h1>
<dl id="kv-manifest"></dl>
<h2>Results</h2>
<p class="note">Each bench's primary metric per configuration: the score with its spread over runs, 95% intervals across runs and
over items, percent of control with its paired interval, the paired test's p and its Benjamini-Hochberg q (docs/statistics.md).
{note} Click a column to sort; click a point of a figure to show its configuration's rows.</p>
<div id="kv-filters"></div>
<p id="kv-count" class="note"></p>
<table id="kv-table"></table>
<div id="kv-drill" hidden></div>
<h2>Figures</h2>
<div id="kv-figures-box"></div>
<script type="application/json" id="kv-data">{data}</script>
<script type="application/json" id="kv-figures">{figures}</script>
<script>{script}</script>
</body>
</html>
"""


def html_page(records: list[dict[str, Any]], df: pd.DataFrame, stores: list[Path], metric: str | None = None) -> str:
    """The page of ``records`` (``df``: their summary, report.summarize) read from ``stores``."""
    data = page_data(records, df, stores, metric)
    names = ", ".join(Path(str(s["path"])).name for s in data["manifest"]["stores"])
    return TEMPLATE.format(
        title=html.escape(f"kvinject study: {names}"),
        css=(HERE / "page.css").read_text(),
        bundle=_bundle(),
        note=html.escape(NOTHING_NOTE),
        data=_inline({k: data[k] for k in INLINED}),
        figures=_inline(figures(data)),
        script=(HERE / "page.js").read_text(),
    )


def write_page(path: Path, records: list[dict[str, Any]], df: pd.DataFrame, stores: list[Path], metric: str | None = None) -> int:
    """Write the page to ``path``; its size in bytes."""
    text = html_page(records, df, stores, metric)
    path.write_text(text, encoding="utf-8")
    return len(text.encode())


def _inline(value: object) -> str:
    """JSON inside a script element: ``</`` would end the element early."""
    return json.dumps(value, separators=(",", ":"), allow_nan=False).replace("</", "<\\/")


def _bundle() -> str:
    """Vega, Vega-Lite and vega-embed in one script, for the Vega-Lite version Altair writes."""
    try:
        import altair as alt
        import vl_convert
    except ImportError:
        raise KvinjectError("--html needs altair and vl-convert-python: pip install 'kvinject[html]'") from None
    version = "v" + "_".join(alt.SCHEMA_VERSION.lstrip("v").split(".")[:2])
    return vl_convert.javascript_bundle(vl_version=version)
