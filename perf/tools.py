"""Finding and running llama.cpp's own tools for the speed comparisons."""

from __future__ import annotations

import os
import queue
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Callable, TypeVar

T = TypeVar("T")

BUILD_HINT = """\
build them from the llama.cpp inside the llama-cpp-python sdist (about 15 minutes on 2 cores):
  pip download --no-binary :all: --no-deps llama-cpp-python==$(pip show llama-cpp-python | sed -n 's/^Version: //p') -d /tmp/sdist
  tar xzf /tmp/sdist/llama_cpp_python-*.tar.gz -C /tmp/sdist
  cmake -S /tmp/sdist/llama_cpp_python-*/vendor/llama.cpp -B /tmp/llama-tools/build -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF
  cmake --build /tmp/llama-tools/build -j --target llama-perplexity llama-batched-bench
then pass --tools /tmp/llama-tools/build/bin (or set LLAMA_TOOLS)"""


def find_tool(name: str, tools: str | None) -> Path:
    """A llama.cpp tool from --tools, $LLAMA_TOOLS or PATH; exits with build instructions."""
    for folder in (tools, os.environ.get("LLAMA_TOOLS")):
        if folder and (Path(folder) / name).is_file():
            return Path(folder) / name
    found = shutil.which(name)
    if found:
        return Path(found)
    sys.exit(f"{name} not found; {BUILD_HINT}")


def stamp_before(out: str, marker: str) -> float:
    """Seconds since start of the log line holding ``marker``. llama.cpp prefixes its log lines
    with m.ss.mmm.uuu; a line may follow another without a newline (progress lines do not
    end one when the output is not a terminal), so the stamp is the one right before it."""
    m = re.search(r"(\d+)\.(\d+)\.(\d+)\.(\d+) \w " + re.escape(marker), out)
    if m is None:
        sys.exit(f"no timestamped log line with {marker!r} in the tool's output")
    minutes, seconds, ms, us = map(int, m.groups())
    return minutes * 60 + seconds + ms / 1e3 + us / 1e6


def run_tool(argv: list[str | Path]) -> str:
    """Run a tool, returning stdout and stderr together; fail loudly with its tail."""
    proc = subprocess.run([str(a) for a in argv], capture_output=True, text=True)
    out = proc.stdout + proc.stderr
    if proc.returncode != 0:
        sys.exit(f"{argv[0]} failed ({proc.returncode}):\n{out[-2000:]}")
    return out


class TakeTurns:
    """Runs that take turns decode by decode, each timed only while it holds the turn: on a
    machine whose speed drifts within minutes, the drift then weighs on every run alike,
    which whole runs one after the other cannot promise.

    Each run is a thread, but everything that calls into llama.cpp goes through :meth:`call`
    and runs on the thread that called :meth:`run`, as the rest of a script does: llama.cpp's
    OpenMP keeps a team of worker threads per calling thread, and with more of them than
    cores their spinning turns into sleeping and waking, which cost a third of the speed."""

    def __init__(self, n: int):
        self._cond = threading.Condition()
        self._active = list(range(n))
        self._turn = 0
        self._since = [0.0] * n
        self._calls: queue.Queue[tuple[Callable[..., object], tuple, Future] | None] = queue.Queue()
        self.seconds = [0.0] * n

    def call(self, fn: Callable[..., T], *args: object) -> T:
        """``fn(*args)`` on the thread that runs :meth:`run`."""
        future: Future = Future()
        self._calls.put((fn, args, future))
        return future.result()

    def wrap(self, i: int, decode: Callable[..., object]) -> Callable[..., object]:
        """``decode`` for run ``i``: hands the turn to the next run, waits for its own, calls."""

        def decode_in_turn(*args: object) -> object:
            self.seconds[i] += time.perf_counter() - self._since[i]
            with self._cond:
                self._pass(i)
                self._cond.wait_for(lambda: self._turn == i)
            self._since[i] = time.perf_counter()
            return self.call(decode, *args)

        return decode_in_turn

    def run(self, jobs: list[Callable[[], object]]) -> list[object]:
        """Run ``jobs[i]`` as run ``i``; their results."""
        results: list[object] = [None] * len(jobs)
        errors: list[BaseException] = []

        def job(i: int) -> None:
            with self._cond:
                self._cond.wait_for(lambda: self._turn == i)
            self._since[i] = time.perf_counter()
            try:
                results[i] = jobs[i]()
            except BaseException as e:
                errors.append(e)
            finally:
                self.seconds[i] += time.perf_counter() - self._since[i]
                with self._cond:
                    self._pass(i)
                    self._active.remove(i)
                self._calls.put(None)

        threads = [threading.Thread(target=job, args=(i,)) for i in range(len(jobs))]
        for t in threads:
            t.start()
        finished = 0
        while finished < len(jobs):
            request = self._calls.get()
            if request is None:
                finished += 1
                continue
            fn, args, future = request
            try:
                future.set_result(fn(*args))
            except BaseException as e:
                future.set_exception(e)
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        return results

    def _pass(self, i: int) -> None:
        """Hand the turn from run ``i`` to the next active one (lock held)."""
        at = self._active.index(i)
        self._turn = self._active[(at + 1) % len(self._active)]
        self._cond.notify_all()


def spread(ratios: list[float]) -> str:
    """A ratio measured several times, with its spread: one figure says little on a machine
    whose speed drifts by several percent within minutes."""
    ordered = sorted(ratios)
    return f"{statistics.median(ordered):.3f} (min {ordered[0]:.3f}, max {ordered[-1]:.3f}, n={len(ordered)})"
