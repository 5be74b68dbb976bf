"""Files kvinject writes whole (JSON, CSV, figures, job scripts), each written one way: to a
temporary sibling that is renamed over the file at the end, so that a failed write (a full
disk, an I/O error, a stop) never leaves an existing file truncated. A write that fails anyway
ends in one line naming the file and the reason; text that was computed is kept in a file of
the temporary folder, which the message names."""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from .exceptions import KvinjectError

STDOUT = "-"  # a text output given as - goes to standard output


def is_stdout(path: Path | str | None) -> bool:
    return path is not None and str(path) == STDOUT


def _mode(path: Path) -> int:
    """The mode the file would have if opened plainly: an existing file's, else 0o666 less the umask."""
    try:
        return path.stat().st_mode & 0o777
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


@contextmanager
def atomic(path: Path) -> Iterator[Path]:
    """A temporary sibling of ``path`` (with its suffix, so that writers that go by it pick the
    same format) to write in the block; renamed over ``path`` when the block ends without error."""
    path = Path(path)
    try:
        fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=path.suffix)
        os.close(fd)
    except OSError as e:
        raise KvinjectError(f"cannot write {path}: {e.strerror or e}") from None
    tmp = Path(name)
    try:
        yield tmp
        os.chmod(tmp, _mode(path))
        os.replace(tmp, path)
    except OSError as e:
        raise KvinjectError(f"cannot write {path}: {e.strerror or e}") from None
    finally:
        tmp.unlink(missing_ok=True)


def write_with(path: Path, write: Callable[[Path], object]) -> None:
    """``write(temporary)`` (a figure's savefig, a table's to_csv), renamed to ``path``."""
    with atomic(path) as tmp:
        write(tmp)


def write_text(path: Path | str, text: str, keep: bool = True) -> None:
    """``text`` into ``path`` (``-``: standard output). If that fails, ``keep`` saves the text in
    the temporary folder and the message says where, so that what was computed is not lost."""
    if is_stdout(path):
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    path = Path(path)
    try:
        with atomic(path) as tmp:
            tmp.write_text(text, encoding="utf-8")
    except KvinjectError as e:
        if not keep:
            raise
        try:
            fd, kept = tempfile.mkstemp(prefix=f"kvinject-{path.stem}-", suffix=path.suffix)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
        except OSError as also:
            raise KvinjectError(f"{e}; nor could it be kept in {tempfile.gettempdir()} ({also.strerror or also})") from None
        raise KvinjectError(f"{e}; what it would hold is in {kept}") from None
