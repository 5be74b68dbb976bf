"""One `kvinject` command line run as the `kvinject` entry point runs it, in a forked child of a
fork server: the modules are loaded once, and a command that leaks, hangs or crashes the
interpreter takes only its child with it. The server is a fresh interpreter, not the test
process: a child forked from a process whose llama.cpp and OpenMP threads ran (any test before
these in the suite) can wait forever on a lock one of those threads held. The child runs under a
memory limit (RLIMIT_DATA) and a time limit; its standard output and error go to files the
parent reads."""

from __future__ import annotations

import multiprocessing
import os
import pkgutil
import resource
import signal
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import kvinject

# memory written to (private writable mappings), not address space: V8 in vl-convert (`report
# --html`) reserves more than 8 GiB it never touches and aborts when it cannot
MEMORY_BYTES = 8 << 30
CRASHED = 99  # the child's status for an exception that escaped main()
_SERVER = multiprocessing.get_context("forkserver")
# every module: the commands import theirs (scipy, pandas, lm-eval, matplotlib) when they start, and
# that import took 3.8 s of a 4.1 s `divergence` on the tiny model; loaded once, it takes none
_SERVER.set_forkserver_preload([m.name for m in pkgutil.walk_packages(kvinject.__path__, "kvinject.") if m.name != "kvinject.__main__"])


@dataclass(frozen=True)
class Outcome:
    code: int | None  # None: killed at the time limit
    stdout: str
    stderr: str
    seconds: float


def execute(args: list[str], folder: Path, seconds: float) -> Outcome:
    """``kvinject ARGS`` in ``folder`` (its working directory), killed after ``seconds``."""
    out, err = folder / ".stdout", folder / ".stderr"
    start = time.monotonic()
    child = _SERVER.Process(target=_child, args=(args, folder, out, err))
    child.start()
    child.join(seconds)
    code = child.exitcode
    if code is None:  # past the time limit
        child.kill()
        child.join()
    return Outcome(code, _read(out), _read(err), time.monotonic() - start)


def _child(args: list[str], folder: Path, out: Path, err: Path) -> None:
    code = CRASHED
    try:
        os.chdir(folder)
        for fd, path in ((1, out), (2, err)):
            os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), fd)
        sys.stdout = open(1, "w", closefd=False)
        sys.stderr = open(2, "w", closefd=False)
        resource.setrlimit(resource.RLIMIT_DATA, (MEMORY_BYTES, MEMORY_BYTES))
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        from kvinject.cli.app import main

        sys.argv = ["kvinject", *args]
        try:
            main()
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except FileNotFoundError:
        return ""
