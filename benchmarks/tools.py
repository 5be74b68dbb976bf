"""Finding and running llama.cpp's own tools for the speed comparisons."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

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
