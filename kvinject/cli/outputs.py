"""Every file a command will write, checked in one call before any work: a run must not end,
after its compute, in an output it cannot write. Files are then written by kvinject.files
(a temporary sibling renamed), so that an existing file is never left truncated."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Collection, Iterable, Mapping
from pathlib import Path

from ..exceptions import KvinjectError
from ..files import STDOUT, is_stdout

SYSTEM = (Path("/proc"), Path("/sys"), Path("/dev"))  # what is there is no file to keep results in
# What matplotlib's Agg backend writes (with Pillow, its dependency), by the file's suffix; none is PNG.
FIGURES = ("png", "pdf", "svg", "svgz", "eps", "ps", "jpg", "jpeg", "tif", "tiff", "webp")
Paths = Mapping[str, "Path | str | None"]


def check_writable(
    files: Paths | None = None,
    *,
    stores: Paths | None = None,
    figures: Paths | None = None,
    folders: Paths | None = None,
    inputs: Iterable[Path | str | None] = (),
    stdout: Collection[str] = (),
) -> None:
    """Fail now, naming the path, if a command could not write one of its outputs later; a
    command gives all its outputs at once, by flag (None: not asked). ``files``: files written
    whole (text, a figure), ``-`` standing for standard output where the flag is in ``stdout``;
    ``stores``: results stores (SQLite, kept and added to); ``figures``: files matplotlib writes,
    in the format their suffix names; ``folders``: folders the command writes files into, made
    if missing. No two outputs may be one file, nor an output one of
    the command's ``inputs``."""
    seen: dict[str, str] = {}
    read = {_identity(Path(p)): str(p) for p in inputs if p is not None and not is_stdout(p)}
    for kind, given in (("file", files), ("store", stores), ("figure", figures), ("folder", folders)):
        for flag, path in (given or {}).items():
            if path is None:
                continue
            if is_stdout(path):
                if kind != "file" or flag not in stdout:
                    raise KvinjectError(f"{flag} {STDOUT}: this output cannot go to standard output; give a file name")
                identity = STDOUT
            else:
                path = Path(path)
                _check(kind, path)
                identity = _identity(path)
                if identity in read:
                    raise KvinjectError(f"cannot write {path} ({flag}): it is also read by this command ({read[identity]}); give another file")
                if kind == "figure" and path.suffix and path.suffix.lower()[1:] not in FIGURES:
                    raise KvinjectError(f"cannot write {path} ({flag}): a figure is written as {', '.join(FIGURES)}, by its suffix; give one of these")
            if identity in seen:
                where = "standard output" if identity == STDOUT else f"the same file, {path}"
                raise KvinjectError(f"{seen[identity]} and {flag} name {where}: give each output its own file")
            seen[identity] = flag


def _identity(path: Path) -> str:
    return str(path.expanduser().resolve())


def _is_store(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(16) == b"SQLite format 3\x00"
    except OSError:
        return False


def _check(kind: str, path: Path) -> None:
    kind = "file" if kind == "figure" else kind
    resolved = path.resolve()
    if any(resolved == s or s in resolved.parents for s in SYSTEM) or (path.exists() and not (path.is_file() or path.is_dir())):
        raise KvinjectError(f"cannot write {path}: it is a device or system file, not a file to keep results in; give a file name")
    if path.is_dir() and kind != "folder":
        raise KvinjectError(
            f"cannot write {path}: it is a folder, not a results store" if kind == "store" else f"cannot write {path}: it is a folder; give a file name"
        )
    if kind == "file" and path.is_file() and _is_store(path):  # a typo's cost would be a study's results
        raise KvinjectError(f"cannot write {path}: it is a results store, which this output would replace; give another file")
    if path.exists() and kind != "folder" and not os.access(path, os.W_OK):
        raise KvinjectError(f"cannot write {path}: permission denied")
    folder = path if kind == "folder" else path.parent
    if kind == "file":  # stores and folders are made with the folders above them
        if folder.exists() and not folder.is_dir():
            raise KvinjectError(f"cannot write {path}: {folder} is a file, not a folder")
        if not folder.is_dir():
            raise KvinjectError(f"cannot write {path}: the folder {folder} does not exist")
    while not folder.exists():
        folder = folder.parent
    if not folder.is_dir():
        raise KvinjectError(f"cannot write {path}: {folder} is a file, not a folder")
    try:  # what a write needs there (permissions, a read-only or full filesystem), tried
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".kvinject-probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise KvinjectError(f"cannot write {path}: {folder} takes no new file ({e.strerror or e})") from None
