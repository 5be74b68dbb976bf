"""`kvinject report --html`: the page's figures place the numbers `report --format json` prints
(one source for both), and in a real browser (Debian's chromium, headless, through Selenium and
its chromedriver; skipped where they are absent) the page of two committed studies loads with
no console error and no network request, its table filters and sorts, each figure draws a mark
per configuration, hovering a point shows its values, clicking it filters the table, and a
generation bench's items open. A page with a broken figure or filter fails those checks."""

from __future__ import annotations

import json
import math
import re
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kvinject.analysis import page_figures
from kvinject.analysis.html_page import ADDRESS_SPACE, html_page
from kvinject.analysis.page_data import page_data
from kvinject.analysis.report import load_records, summarize

from .cli_runs import kvinject

DOCS = Path(__file__).resolve().parent.parent / "docs"
STORES = [DOCS / "k16-v8.results.sqlite", DOCS / "compressors.results.sqlite"]  # generation items, curves, frontier, heatmaps


def _close(a: float | None, b: float | None, rel: float = 1e-9) -> bool:
    return (a is None and b is None) or (a is not None and b is not None and math.isclose(a, b, rel_tol=rel, abs_tol=1e-12))


def _interval(text: str) -> tuple[float | None, float | None]:
    if not text:
        return None, None
    low, high = text.split("–")
    return float(low), float(high)


def _values(spec: dict) -> list[dict]:
    return spec["data"]["values"]


@pytest.fixture(scope="module")
def study():
    """The two stores' records, their summary, the page's data and figures."""
    records = load_records(STORES)
    df = summarize(records)
    data = page_data(records, df, STORES)
    return records, df, data, page_figures.figures(data)


def test_the_figures_place_the_numbers_report_json_prints(study):
    _, _, data, figures = study
    out = kvinject("report", *STORES, "--format", "json")
    assert out.returncode == 0, out.stderr
    printed = json.loads(out.stdout)
    assert [{k: v for k, v in row.items() if k != "_"} for row in data["rows"]] == printed
    curves, frontier = _values(figures["curves"]["spec"]), _values(figures["frontier"]["spec"])
    assert {p["id"] for p in curves if not p["control"]} == {i for i, r in enumerate(data["rows"]) if not r["_"]["control"] and r["_"]["realized_k"]}
    for point in curves + frontier:
        row = printed[point["id"]]
        assert (point["configuration"], point["score"], point["runs"]) == (row["configuration"], row["score"], row["runs"])
    for point in curves:  # the runs' interval, which json prints to 4 digits
        assert all(_close(a, b, 1e-3) for a, b in zip((point["ci_low"], point["ci_high"]), _interval(printed[point["id"]]["ci_runs"])))
    for point in frontier:
        row = printed[point["id"]]
        shown = row["% control"] if point["relative"] else row["score"]
        assert _close(point["frontier_y"], 100.0 if shown is None and point["relative"] else shown)
        if point["relative"] and row["% control CI"]:
            assert all(_close(a, b, 1e-2) for a, b in zip((point["frontier_low"], point["frontier_high"]), _interval(row["% control CI"])))


def test_the_board_and_the_fault_map_place_the_numbers_their_reports_print():
    for store, flags, name in (
        (DOCS / "ruler-board.results.sqlite", ["--board"], "board"),
        (DOCS / "fault-campaign-gemma.results.sqlite", ["--faults", "field,bit"], "faults"),
    ):
        records = load_records([store])
        data = page_data(records, summarize(records), [store])
        out = kvinject("report", store, *flags, "--format", "json")
        assert out.returncode == 0, out.stderr
        printed = json.loads(out.stdout)
        drawn = _values(page_figures.figures(data)[name]["spec"])
        assert data[name] == printed and printed
        if name == "board":
            assert [(c["configuration"], c["score"], c["low"], c["high"], c["items"]) for c in drawn] == [
                (r["configuration"], r["score"], r["low"], r["high"], r["items"]) for r in printed
            ]
        else:  # a panel for SDC and one for DUE
            rates = [(c["field"], c["bit"], c["outcome"], c["rate"], c["low"], c["high"], c["faults"]) for c in drawn]
            assert rates == [(r["field"], r["bit"], o, r[o], r[f"{o}_low"], r[f"{o}_high"], r["faults"]) for r in printed for o in ("sdc", "due")]


def test_a_page_that_cannot_be_written_or_beside_a_board_fails_before_any_work():
    out = kvinject("report", STORES[0], "--html", "/nonexistent/dir/study.html")
    assert out.returncode == 2 and "cannot write /nonexistent/dir/study.html: the folder /nonexistent/dir does not exist" in out.stderr
    out = kvinject("report", STORES[0], "--board", "--html", "study.html")
    assert out.returncode == 2 and "--board prints a board of its own: give --html in another report" in out.stderr
    assert "Traceback" not in out.stderr


def _address_space(limit: int):
    return lambda: resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def test_an_address_space_limit_too_small_for_vl_convert_is_refused_before_any_work(tmp_path):
    """Under `ulimit -v` of 16 GiB, vl-convert's engine aborted the report with a C stack trace."""
    page = tmp_path / "study.html"
    argv = [sys.executable, "-m", "kvinject", "report", str(STORES[0]), "--html", str(page)]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=300, preexec_fn=_address_space(16 << 30))
    assert out.returncode == 2 and out.stderr.startswith("error: --html runs vl-convert") and "limit of 16 GiB (ulimit -v)" in out.stderr, out.stderr
    assert not page.exists() and out.stdout == ""


def test_vl_convert_runs_in_the_address_space_the_check_asks_for():
    """ADDRESS_SPACE is measured: a vl-convert that reserves more makes the check too lenient."""
    code = "from kvinject.analysis.html_page import _bundle; print(len(_bundle()))"  # the page's own call
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, preexec_fn=_address_space(ADDRESS_SPACE))
    assert out.returncode == 0 and int(out.stdout) > 100_000, out.stderr[:500]


def _page_data(path: Path) -> dict:
    return json.loads(re.search(r'<script type="application/json" id="kv-data">(.*?)</script>', path.read_text(), re.S)[1])


def test_a_run_s_output_file_gets_its_page(tmp_path, tiny_path):
    output, page = tmp_path / "run.json", tmp_path / "run.html"
    out = kvinject("run", "--model", tiny_path, "--bench", "nexttoken", "--limit", "5", "--error", "normal:0,0.25", "--runs", "2", "--output", output)
    assert out.returncode == 0, out.stderr
    out = kvinject("report", output, "--html", page, "--format", "json")
    assert out.returncode == 0, out.stderr
    data = _page_data(page)
    assert [{k: v for k, v in row.items() if k != "_"} for row in data["rows"]] == json.loads(out.stdout)
    assert [r["configuration"] for r in data["rows"]] == ["none", "normal:0,0.25"]
    assert data["manifest"]["stores"] == [{"path": str(output)}] and data["manifest"]["records"] == 3  # the control, deterministic, runs once


# The browser's part: Debian's chromium and its driver, where installed (.ci/run installs them).
CHROMIUM, DRIVER = shutil.which("chromium"), shutil.which("chromedriver")
browser = pytest.mark.skipif(
    CHROMIUM is None or DRIVER is None, reason="needs Debian's chromium and chromium-driver (apt-get install chromium chromium-driver)"
)


@pytest.fixture(scope="module")
def driver():
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1400,1000"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    chrome = webdriver.Chrome(service=Service(DRIVER), options=options)
    yield chrome
    chrome.quit()


def _open(driver, path: Path) -> None:
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get_log("browser")  # what an earlier page logged
    driver.get_log("performance")
    driver.get(path.as_uri())
    WebDriverWait(driver, 60).until(lambda d: d.execute_script("return document.body.dataset.figures"))


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    """The page as `kvinject report --html` writes it."""
    path = tmp_path_factory.mktemp("page") / "study.html"
    out = kvinject("report", *STORES, "--html", path)
    assert out.returncode == 0, out.stderr
    assert f"page written to {path}" in out.stderr.replace("\n", "")
    return path


def _table(driver) -> list[list[str]]:
    """The table's cells as shown, in one call to the browser."""
    return driver.execute_script("return [...document.querySelectorAll('#kv-table tbody tr')].map(tr => [...tr.cells].map(td => td.innerText))")


def _column(driver, name: str) -> int:
    """The place of a column in the table, its sort mark left out."""
    return driver.execute_script("return [...document.querySelectorAll('#kv-table th')].map(th => th.innerText.replace(/ [▲▼]$/, ''))").index(name)


def check_loads_offline(driver) -> None:
    errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors, errors
    assert driver.execute_script("return document.body.dataset.figures") != "failed"
    assert driver.execute_script("return performance.getEntriesByType('resource').length") == 0
    requests = [json.loads(e["message"])["message"] for e in driver.get_log("performance")]
    urls = [m["params"]["request"]["url"] for m in requests if m["method"] == "Network.requestWillBeSent"]
    assert urls and all(u.startswith(("file:", "data:", "blob:")) for u in urls), urls


def check_marks(driver, figures: dict) -> None:
    """A mark per configuration (a cell of a heatmap) in each figure, as its data has them."""
    expected = {
        "curves": len([p for p in _values(figures["curves"]["spec"]) if not p["control"]]),
        "frontier": len(_values(figures["frontier"]["spec"])),
        "heatmap": len(_values(figures["heatmap"]["spec"])),
    }
    for name, n in expected.items():
        drawn = driver.find_elements("css selector", f"#kv-figure-{name} g.{name}_points_marks path, #kv-figure-{name} g.{name}_cells_marks path")
        assert len(drawn) == n, f"{name}: {len(drawn)} marks drawn, {n} configurations"


@browser
def test_the_page_loads_offline_and_draws_every_figure(driver, page, study):
    _open(driver, page)
    check_loads_offline(driver)
    check_marks(driver, study[3])
    assert set(driver.execute_script("return Object.keys(window.kvViews)")) == set(study[3])


def check_filter_and_sort(driver, rows: list[dict]) -> None:
    """Every row in report's order; bench=perplexity leaves its rows; the score's column sorts
    them up, then down; "show every row" brings the others back."""
    from selenium.webdriver.support.ui import Select

    configuration, bench, score = (_column(driver, name) for name in ("configuration", "bench", "score ± sd"))
    assert [r[configuration] for r in _table(driver)] == [r["_"]["cells"]["configuration"] for r in rows]
    Select(driver.find_element("id", "kv-filter-bench")).select_by_value("perplexity")
    perplexity = [r for r in rows if r["bench"] == "perplexity"]
    assert {r[bench] for r in _table(driver)} == {"perplexity"} and len(_table(driver)) == len(perplexity), "the bench's filter"
    driver.find_element("css selector", "#kv-table th[data-key='score']").click()
    scores = [float(r[score].split(" ±")[0]) for r in _table(driver)]
    assert scores == sorted(scores) and len(set(scores)) > 1
    driver.find_element("css selector", "#kv-table th[data-key='score']").click()
    assert [float(r[score].split(" ±")[0]) for r in _table(driver)] == sorted(scores, reverse=True)
    driver.find_element("id", "kv-clear").click()
    assert len(_table(driver)) == len(rows)


@browser
def test_the_table_filters_and_sorts(driver, page, study):
    _open(driver, page)
    check_filter_and_sort(driver, study[2]["rows"])


@browser
def test_hovering_a_point_shows_its_values_and_clicking_it_filters_the_table(driver, page, study):
    from selenium.webdriver.common.action_chains import ActionChains

    _open(driver, page)
    point = driver.find_elements("css selector", "#kv-figure-frontier g.frontier_points_marks path")[0]
    driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", point)
    ActionChains(driver).move_to_element(point).perform()
    tooltip = driver.find_element("id", "vg-tooltip-element")
    assert tooltip.is_displayed()
    datum = driver.execute_script("return arguments[0].__data__.datum", point)
    for shown in (datum["configuration"], "95% CI low", "runs (n)"):
        assert shown in tooltip.text, tooltip.text
    ActionChains(driver).click(point).perform()
    column = _column(driver, "configuration")
    configurations = {r[column].removesuffix(" †") for r in _table(driver)}
    assert configurations == {datum["configuration"]}


@browser
def test_a_generation_bench_s_items_open(driver, page, study):
    _open(driver, page)
    assert driver.find_element("id", "kv-drill").get_attribute("hidden")
    button = driver.find_elements("css selector", "button.kv-items")[0]
    driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", button)
    button.click()
    drill = driver.find_element("id", "kv-drill")
    assert drill.is_displayed() and "beside the control's" in drill.text
    row = driver.execute_script("return arguments[0].closest('tr').dataset.id", button)
    items = study[2]["items"][row]["items"]
    assert items and len(drill.find_elements("css selector", "tbody tr")) == len(items)
    first = driver.execute_script("return [...document.querySelector('#kv-drill tbody tr').cells].map(td => td.textContent)")
    assert first == [str(items[0]["item"]), items[0]["control"], _verdict(items[0]["control_verdict"]), items[0]["response"], _verdict(items[0]["verdict"])]


def _verdict(value: float | None) -> str:
    """A verdict as the page writes it (JavaScript's String of a number)."""
    return "-" if value is None else str(int(value)) if float(value).is_integer() else str(value)


@browser
def test_a_broken_figure_or_filter_fails_the_checks(driver, study, tmp_path, monkeypatch):
    records, df, data, figures = study
    # A curve whose points read a field the data lacks: Vega draws none and logs nothing.
    broken = {name: {**f, "spec": json.loads(json.dumps(f["spec"]).replace('"field": "score"', '"field": "scor"'))} for name, f in figures.items()}
    monkeypatch.setattr("kvinject.analysis.html_page.figures", lambda data: broken)
    text = html_page(records, df, STORES)
    path = tmp_path / "broken.html"
    filtering = "return !chosen || value(r) === chosen;"
    assert filtering in text
    path.write_text(text.replace(filtering, "return true;"))  # a filter that keeps every row
    _open(driver, path)
    with pytest.raises(AssertionError, match="marks drawn"):
        check_marks(driver, figures)
    with pytest.raises(AssertionError, match="the bench's filter"):
        check_filter_and_sort(driver, data["rows"])
