"""A study as one web page (``kvinject report --html``): a single file holding its scripts,
styles and data, which opens from disk with no network. Vega-Lite draws the figures, its
runtime inlined from vl-convert's bundle; page.js builds the table, its filters and sort, and
the items' drill-down; page_data.py gives the numbers of both."""

from __future__ import annotations

import html
import json
import resource
from pathlib import Path
from typing import Any

import pandas as pd

from ..exceptions import KvinjectError
from .page_data import page_data
from .page_figures import NEEDS, figures
from .tables import NOTHING_NOTE

HERE = Path(__file__).resolve().parent
# vl-convert's JavaScript engine (V8) reserves 64 GiB of address space as it starts and aborts the
# process, a C stack trace and no message, where it cannot: vl-convert-python 1.9 ran under
# `ulimit -v` of 72 GiB and aborted at 64 (2026-11-28, 2-core Xeon)
ADDRESS_SPACE = 72 << 30
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
    check_html()
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


def check_html() -> None:
    """What --html needs, checked before any store is read: altair and vl-convert, and the
    address space vl-convert's engine reserves."""
    try:
        import altair  # noqa: F401
        import vl_convert  # noqa: F401
    except ImportError:
        raise KvinjectError(NEEDS) from None
    limit, _ = resource.getrlimit(resource.RLIMIT_AS)
    if limit != resource.RLIM_INFINITY and limit < ADDRESS_SPACE:
        raise KvinjectError(
            f"--html runs vl-convert, whose JavaScript engine reserves 64 GiB of address space and aborts under this process's "
            f"limit of {limit / 2**30:.3g} GiB (ulimit -v): raise it to {ADDRESS_SPACE >> 30} GiB or more (ulimit -v unlimited) and run again"
        )


def _bundle() -> str:
    """Vega, Vega-Lite and vega-embed in one script, for the Vega-Lite version Altair writes."""
    import altair as alt
    import vl_convert

    version = "v" + "_".join(alt.SCHEMA_VERSION.lstrip("v").split(".")[:2])
    return vl_convert.javascript_bundle(vl_version=version)
