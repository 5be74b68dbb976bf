"""The `kvinject` command: the CLI's modules load here, where a Ctrl-C (pandas, numpy and
llama.cpp take about a second to load) ends the command as one later does, without a
traceback."""

from __future__ import annotations

import sys

from .. import interrupts


def main() -> None:
    try:
        from .app import main as cli
    except KeyboardInterrupt as stop:
        print(interrupts.stopped(stop), file=sys.stderr)
        sys.exit(interrupts.exit_code(stop))
    cli()
