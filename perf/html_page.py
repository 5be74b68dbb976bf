"""The size and open time of `kvinject report --html` pages (docs/report-html.md).

    python perf/html_page.py PAGE.html ...            # each page opened 3 times
    python perf/html_page.py --store big.results.sqlite  # first writes a store of 50,000 records

``--store`` copies docs/k16-v8.results.sqlite's two perplexity experiments (f16 caches) into a
store of 50,000 records: 100 runs of each control and of 249 configurations of each experiment
(each of its 3 configurations copied 83 times as normal:0,STD, with their realized error and
scores), 500 rows of the study table; then
``kvinject report STORE --html PAGE`` writes its page. Opens each page in Debian's chromium,
headless, through Selenium and its chromedriver, and prints its size and the milliseconds from
navigation to every figure drawn (the page's ``document.body.dataset.drawnMs``).
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import os
from pathlib import Path

from kvinject.analysis.report import load_records
from kvinject.experiments.store import Store

SOURCE = Path(__file__).resolve().parent.parent / "docs" / "k16-v8.results.sqlite"


def big_store(path: Path, copies: int = 83, runs: int = 100) -> int:
    """Write the store; the number of its records."""
    records = [r for r in load_records([SOURCE]) if r["settings"]["bench"] == "perplexity" and r["settings"]["cache"]["type_k"] == "f16"]
    records = [r for r in records if r["settings"]["cache"]["type_v"] == "f16"]
    path.unlink(missing_ok=True)
    n = 0
    with Store(path) as store, store.transaction():
        for j, record in enumerate(records):
            for c in range(1 if record["settings"]["control"] else copies):
                for run in range(runs):
                    rec = copy.deepcopy(record)
                    settings, cell = rec.pop("settings"), rec.pop("cell")
                    rec.pop("run")
                    if not settings["control"]:
                        settings["label"] = settings["error"] = rec["label"] = f"normal:0,{(j * 1000 + c + 1) / 100000:g}"
                        settings["target"] = "kv"
                    store.add(hashlib.sha1(repr((cell, c)).encode()).hexdigest()[:20], run, settings, rec)
                    n += 1
    return n


def open_times(pages: list[Path], loads: int = 3) -> None:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.support.ui import WebDriverWait

    options = webdriver.ChromeOptions()
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1400,1000"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
    for page in pages:
        times = []
        for _ in range(loads):
            driver.get("about:blank")
            driver.get(page.resolve().as_uri())
            WebDriverWait(driver, 120).until(lambda d: d.execute_script("return document.body.dataset.drawnMs"))
            times.append(int(driver.execute_script("return document.body.dataset.drawnMs")))
        rows = driver.execute_script("return document.querySelectorAll('#kv-table tbody tr').length")
        print(f"{page}: {os.path.getsize(page) / 1e6:.2f} MB, {rows} rows, drawn in {times} ms")
    driver.quit()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pages", nargs="*", type=Path)
    parser.add_argument("--store", type=Path, help="write a store of 50,000 records here and its page beside it")
    args = parser.parse_args()
    pages = list(args.pages)
    if args.store:
        import subprocess
        import sys
        import time

        print(f"{big_store(args.store)} records in {args.store}")
        page = args.store.with_suffix(".html")
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "kvinject", "report", str(args.store), "--html", str(page)], check=True, stdout=subprocess.DEVNULL)
        print(f"page written in {time.perf_counter() - start:.1f} s")
        pages.append(page)
    open_times(pages)


if __name__ == "__main__":
    main()
