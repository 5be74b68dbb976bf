"""Running the `kvinject` command as a user does, in a subprocess."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

PNG = b"\x89PNG\r\n\x1a\n"  # what a PNG file starts with


def kvinject(*args: object, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kvinject", *map(str, args)], capture_output=True, text=True, timeout=timeout)


def swept(tmp_path: Path, grid_text: str) -> Path:
    """Write ``grid_text`` as a grid, run `kvinject sweep` on it and return its store."""
    grid = tmp_path / "grid.toml"
    grid.write_text(grid_text)
    out = kvinject("sweep", grid)
    assert out.returncode == 0, out.stderr
    return grid.with_suffix(".results.sqlite")
