"""Stores written before a change to the code are read, reported and resumed as they were: the
committed studies' stores (docs/*.results.sqlite) against their tables as `kvinject report
--format csv` printed them at commit 94b901e, kvinject 0.1.0 (tests/fixtures/reports/),
each study's grid finds nothing left to run in its store (its keys are unchanged), the
tables a results page says it generated are what the command prints from the store, and the
web pages it links hold what `report --html` gives from it now."""

import csv
import io
import json
import math
import re
import shlex
from pathlib import Path

import pytest

from kvinject.analysis.html_page import INLINED
from kvinject.analysis.page_data import page_data
from kvinject.analysis.page_figures import figures
from kvinject.analysis.report import load_records, summarize
from kvinject.engine.model import file_sha256, resolve_model

from .cli_runs import kvinject
from .page_tables import GENERATED, pages, report, web_pages

ROOT = Path(__file__).resolve().parent.parent
RECORDED = Path(__file__).resolve().parent / "fixtures" / "reports"
STORES = sorted(p.name.removesuffix(".csv") for p in RECORDED.glob("*.csv"))


def _cells(text: str) -> list[list[str]]:
    return list(csv.reader(io.StringIO(text)))


def _same(a: str, b: str) -> bool:
    """Text alike, or numbers alike to the report's 4 significant digits: a statistic whose last
    bit differs on another CPU (numpy sums in another order on AVX-512) can move the last
    printed digit by one."""
    if a == b:
        return True
    parts_a, parts_b = a.split("–"), b.split("–")  # an interval, lower–upper
    try:
        pairs = [(float(x), float(y)) for x, y in zip(parts_a, parts_b, strict=True)]
    except ValueError:
        return False
    return all(math.isclose(x, y, rel_tol=1e-3, abs_tol=1e-12) for x, y in pairs)


@pytest.mark.parametrize("name", STORES)
def test_committed_store_reports_as_recorded(name):
    out = kvinject("report", ROOT / "docs" / f"{name}.results.sqlite", "--format", "csv")
    assert out.returncode == 0, out.stderr
    got, want = _cells(out.stdout), _cells((RECORDED / f"{name}.csv").read_text())
    assert len(got) == len(want)
    for row, (g, w) in enumerate(zip(got, want)):
        assert len(g) == len(w) and all(_same(a, b) for a, b in zip(g, w)), f"row {row}: {g} != {w}"


@pytest.mark.parametrize("name", [n for n in STORES if (ROOT / "examples" / f"{n}.toml").exists()])
def test_committed_store_resumes_with_nothing_left(name):
    store = ROOT / "docs" / f"{name}.results.sqlite"
    models = {(r["settings"]["model"], r["settings"]["model_sha256"]) for r in load_records([store])}
    for model, sha256 in models:  # a store's keys hold the model file's hash: another file is another model
        if file_sha256(resolve_model(model)) != sha256:
            pytest.skip(f"the installed {model} is another file than the one {store.name} was measured with")
    out = kvinject("sweep", ROOT / "examples" / f"{name}.toml", "--store", ROOT / "docs" / f"{name}.results.sqlite", "--dry-run")
    assert out.returncode == 0, out.stderr
    assert " 0 runs left" in out.stdout, out.stdout


def _markdown_rows(text: str) -> list[list[str]]:
    return [[c.strip() for c in line.strip().strip("|").split("|")] for line in text.strip().splitlines() if line.startswith("|")]


@pytest.mark.parametrize("page", [p.name for p in pages()])
def test_a_page_s_tables_regenerate_from_its_store(page):
    for _, command, args, table, _ in GENERATED.findall((ROOT / "docs" / page).read_text()):
        out = report(args, command)
        assert out.returncode == 0, out.stderr
        got, want = _markdown_rows(out.stdout), _markdown_rows(table)
        assert len(got) == len(want), f"{page}: `kvinject {command} {args}` printed {len(got)} rows, the page has {len(want)}"
        for row, (g, w) in enumerate(zip(got, want)):
            assert len(g) == len(w) and all(_same(a, b) for a, b in zip(g, w)), f"{page}, `{args}`, row {row}: {g} != {w}"


def _alike(a: object, b: object) -> bool:
    """Data alike, numbers to 6 significant digits (another CPU sums in another order) and
    printed numbers as :func:`_same` reads them."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_alike(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(map(_alike, a, b))
    if isinstance(a, float) and isinstance(b, (int, float)) and not isinstance(b, bool):
        return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-12)
    if isinstance(a, str) and isinstance(b, str):
        return _same(a, b)
    return a == b


@pytest.mark.parametrize("args,path", web_pages(), ids=[p.name for _, p in web_pages()])
def test_a_results_page_s_web_page_holds_what_its_stores_give(args, path):
    words = shlex.split(args)
    stores = [Path(a) for a in words[: words.index("--html")]]
    text = path.read_text()
    committed = {name: json.loads(re.search(rf'<script type="application/json" id="kv-{name}">(.*?)</script>', text, re.S)[1]) for name in ("data", "figures")}
    records = load_records([ROOT / s for s in stores])
    data = page_data(records, summarize(records), stores)
    now = json.loads(json.dumps({"data": {k: data[k] for k in INLINED}, "figures": figures(data)}))
    hint = f"differ from what `kvinject report {args}` gives: python -m tests.page_tables"
    for part in ("rows", "columns", "items"):
        assert _alike(committed["data"][part], now["data"][part]), f"{path.name}: {part} {hint}"
    for key in ("models", "settings", "stores", "records", "configurations"):
        assert committed["data"]["manifest"][key] == now["data"]["manifest"][key], f"{path.name}: the manifest's {key} {hint}"
    assert committed["figures"].keys() == now["figures"].keys()
    for name, figure in now["figures"].items():
        assert _alike(committed["figures"][name]["spec"]["data"], figure["spec"]["data"]), f"{path.name}: figure {name} {hint}"
