"""What a wheel holds: every package of the source tree, so that an install from PyPI (not
editable) has every module the tests import from the checkout."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_wheel_lists_every_package_of_the_source_tree():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "kvinject").rglob("__init__.py")}
    assert found - listed == set(), "packages a wheel would leave out"
    assert listed - found == {"kvinject.bench_data"}, "listed packages that are no folder of the tree"
