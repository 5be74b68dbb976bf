"""Output paths, checked before any compute: a run must not end in an unwritable --output."""

from __future__ import annotations

import os
from pathlib import Path

from ..exceptions import KvinjectError


def check_writable(*paths: Path | None) -> None:
    """Fail now, with the path, if a file could not be written there later (None: not asked)."""
    for path in paths:
        if path is None:
            continue
        folder = path.parent
        if path.is_dir():
            raise KvinjectError(f"cannot write {path}: it is a folder; give a file name")
        if folder.exists() and not folder.is_dir():
            raise KvinjectError(f"cannot write {path}: {folder} is a file, not a folder")
        if not folder.is_dir():
            raise KvinjectError(f"cannot write {path}: the folder {folder} does not exist")
        if not os.access(path if path.exists() else folder, os.W_OK):
            raise KvinjectError(f"cannot write {path}: permission denied")
