"""llama.cpp's log, kept rather than printed, and the backend's one-time set-up.

llama.cpp logs to stderr by default; kvinject keeps the lines (``info`` parses the KV cache
size from them, errors quote the tail) and shows them only with --verbose.
"""

from __future__ import annotations

import ctypes
import sys
from collections import deque
from contextlib import contextmanager
from typing import Iterator

from llama_cpp import llama_cpp as ll

from .. import interrupts

_DEBUG, _CONT = 4, 5


class _Log:
    tail: deque[str] = deque(maxlen=50)
    captures: list[list[str]] = []
    echo = False
    last_level = 0


@ll.llama_log_callback
@interrupts.callback
def _log_callback(level: int, text: bytes, _user_data: int) -> None:
    level = _Log.last_level if level == _CONT else level
    _Log.last_level = level
    if level == _DEBUG:  # llama.cpp logs every graph input at debug level: too much to keep
        return
    line = text.decode("utf-8", "replace")
    _Log.tail.append(line)
    for lines in _Log.captures:
        lines.append(line)
    if _Log.echo:
        print(line, end="", file=sys.stderr, flush=True)  # standard output is the results (--format json, --csv -)


ll.llama_log_set(_log_callback, ctypes.c_void_p(0))
ll.llama_backend_init()


def set_verbose(verbose: bool) -> None:
    _Log.echo = verbose


def log_tail(n: int = 5) -> str:
    return "".join(list(_Log.tail)[-n:]).strip()


@contextmanager
def captured_log() -> Iterator[list[str]]:
    """Collect llama.cpp's log lines while the block runs."""
    lines: list[str] = []
    _Log.captures.append(lines)
    try:
        yield lines
    finally:
        _Log.captures.remove(lines)
