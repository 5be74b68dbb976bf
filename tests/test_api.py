"""The public Python API: every name it hands on resolves, importing it loads nothing heavy,
and the documented example runs end to end (on the tiny model) and resumes from its store."""

import subprocess
import sys
from pathlib import Path

import pytest

import kvinject

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "api.py"


@pytest.mark.parametrize("name", kvinject.__all__)
def test_every_api_name_resolves(name):
    assert getattr(kvinject, name) is not None


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        kvinject.nothing  # noqa: B018


def test_importing_kvinject_loads_neither_llama_cpp_nor_pandas():
    code = "import sys, kvinject; print(sorted(m for m in ('llama_cpp', 'pandas', 'numba') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_api_example_runs_and_resumes(tmp_path, tiny_path):
    store = tmp_path / "api.results.sqlite"
    first = subprocess.run([sys.executable, EXAMPLE, tiny_path, store], capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stderr
    lines = first.stdout.splitlines()
    assert [line.split()[0] for line in lines[:3]] == ["none", "normal:0,0.25", "none"]
    assert all(" accuracy " in line and line.endswith("of control") for line in lines[:3])
    assert "4 runs written" in first.stdout and store.exists()
    again = subprocess.run([sys.executable, EXAMPLE, tiny_path, store], capture_output=True, text=True, timeout=600)
    assert again.returncode == 0 and "0 runs written" in again.stdout
