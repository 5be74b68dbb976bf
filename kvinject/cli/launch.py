"""The `kvinject` command: the CLI's modules load here, where a Ctrl-C (pandas, numpy and
llama.cpp take about a second to load) ends the command as one later does, without a
traceback: kvinject's handlers go in first, so that a stop CPython turns into another error
while a module loads is still known as one."""

from __future__ import annotations

import sys

from .. import interrupts


def main() -> None:
    interrupts.install()
    try:
        from .app import main as cli
    except BaseException as e:  # a stop, or the error CPython or a library raised in its place
        stop = interrupts.behind(e)
        if stop is None:
            raise
        print(interrupts.stopped(stop), file=sys.stderr)
        code = interrupts.exit_code(stop)
        interrupts.ending()
        sys.exit(code)
    cli()
