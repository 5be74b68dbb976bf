"""The tables a results page generates from its store: ``<!-- kvinject report ARGS -->`` (or
``kvinject tune ARGS``, which reads a finished tune's store), the tables that command prints,
``<!-- end -->`` (paths in ARGS from the repository's root); and
the web page of its study, ``<!-- web page: kvinject report STORE... --html PAGE -->``.

``python -m tests.page_tables`` writes every such table of docs/results-*.md, and every such
web page, anew from the stores; tests/test_committed_stores.py checks that they are what the
command gives.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GENERATED = re.compile(r"(<!-- kvinject (report|tune) ([^\n]+) -->\n)(.*?)(<!-- end -->)", re.S)
WEB_PAGE = re.compile(r"<!-- web page: kvinject report ([^\n]+ --html (\S+)) -->")


def pages() -> list[Path]:
    return sorted(p for p in (ROOT / "docs").glob("results-*.md") if GENERATED.search(p.read_text()))


def web_pages() -> list[tuple[str, Path]]:
    """Each web page a results page links, with the arguments that write it."""
    return [(m[1], ROOT / m[2]) for p in sorted((ROOT / "docs").glob("results-*.md")) for m in WEB_PAGE.finditer(p.read_text())]


def report(args: str, command: str = "report") -> subprocess.CompletedProcess:
    """`kvinject report ARGS` (or another command) as a user runs it from the repository's root."""
    return subprocess.run([sys.executable, "-m", "kvinject", command, *shlex.split(args)], capture_output=True, text=True, cwd=ROOT, timeout=300)


def main() -> None:
    for page in pages():
        text = GENERATED.sub(lambda m: m[1] + report(m[3], m[2]).stdout.strip() + "\n" + m[5], page.read_text())
        page.write_text(text)
        print(f"tables of {page.relative_to(ROOT)} written")
    for args, web_page in web_pages():
        out = report(args)
        if out.returncode:
            raise SystemExit(f"kvinject report {args}: {out.stderr}")
        print(f"{web_page.relative_to(ROOT)} written")


if __name__ == "__main__":
    main()
