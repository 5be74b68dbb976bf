"""Stores written before a change to the code are read, reported and resumed as they were: the
committed studies' stores (docs/*.results.sqlite) against their tables as `kvinject report
--format csv` printed them at commit 94b901e, kvinject 0.1.0 (tests/fixtures/reports/),
each study's grid finds nothing left to run in its store (its keys are unchanged), and the
tables a results page says it generated are what the command prints from the store."""

import csv
import io
import math
from pathlib import Path

import pytest

from kvinject.analysis.report import load_records
from kvinject.engine.model import file_sha256, resolve_model

from .cli_runs import kvinject
from .page_tables import GENERATED, pages, report

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
    for _, args, table, _ in GENERATED.findall((ROOT / "docs" / page).read_text()):
        out = report(args)
        assert out.returncode == 0, out.stderr
        got, want = _markdown_rows(out.stdout), _markdown_rows(table)
        assert len(got) == len(want), f"{page}: `kvinject report {args}` printed {len(got)} rows, the page has {len(want)}"
        for row, (g, w) in enumerate(zip(got, want)):
            assert len(g) == len(w) and all(_same(a, b) for a, b in zip(g, w)), f"{page}, `{args}`, row {row}: {g} != {w}"
