"""What the commands share in rendering: the console, results tables at a width that keeps
their numbers whole, progress bars, and the message of an interrupted run."""

from __future__ import annotations

import functools
import math
import os
import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path

import typer
from rich.console import Console

from ..interrupts import behind, exit_code, pending, stopped


def _width_given() -> bool:
    """Whether COLUMNS gives a width. One that gives none (0, text) is dropped: at COLUMNS=0
    rich printed nothing at all, a command's one-line error included."""
    columns = os.environ.get("COLUMNS")
    if columns is not None and not (columns.strip().isdigit() and int(columns) > 0):
        del os.environ["COLUMNS"]
    return "COLUMNS" in os.environ


# Piped or redirected output has no width to fit: give the tables room rather than cut
# their cells short (COLUMNS still decides where it is set); they are made to fit 100.
console = Console(width=None if sys.stdout.isatty() or _width_given() else 200)


def print_table(table) -> None:
    """A results table at the terminal's width, or wider where its numbers would not fit whole
    with the names folded (tables.print_width)."""
    from ..analysis.tables import print_width

    width = print_width(table, console.width)
    (console if width == console.width else Console(width=width)).print(table)


def fmt(value: float, spec: str = ".3f") -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, spec)


def progress_bars():
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    return Progress(
        TextColumn("{task.description:<11}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        transient=False,
    )


def count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def interrupted(stop: KeyboardInterrupt, store: Path, resume: str) -> typer.Exit:
    """Say what a stopped sweep kept and how to go on; the exit with the signal's status."""
    # Perplexity scores a batch of runs (up to 16) together, chunk by chunk: none of them is
    # finished until the last chunk, and an interrupt loses them all.
    Console(stderr=True).print(
        f"{stopped(stop)}: every finished run is in {store}; the runs under way (a run being decoded, or perplexity's "
        f"batch of runs scored together) start again with: {resume}",
        style="yellow",
        markup=False,  # a path may hold [brackets]
        soft_wrap=True,
    )
    return typer.Exit(exit_code(stop))


def run_sweep(sw) -> int:
    """Run a sweep with a progress bar per cell group and its notices above them; where stderr
    is no terminal (a cluster job's log), bars do not show: a timed line per stored run does."""
    with progress_bars() as progress:
        log = (
            None
            if progress.console.is_terminal
            else lambda line: progress.console.print(f"{time.strftime('%H:%M:%S')} {line}", markup=False, highlight=False, soft_wrap=True)
        )
        return sw.run(
            lambda name, total: (lambda task: lambda n: progress.advance(task, n))(progress.add_task(name, total=total)),
            lambda message: progress.console.print(message, markup=False, highlight=False, soft_wrap=True),
            log,
        )


def shell_words(*words: object) -> str:
    """A command to paste into a shell: each path quoted where it needs it (spaces, non-ASCII)."""
    return " ".join(shlex.quote(str(w)) for w in words)


def stoppable(command: Callable) -> Callable:
    """``command``, ended by Ctrl-C or SIGTERM in one line and the signal's exit status (Click
    would print "Aborted!" and exit 1). Commands that keep finished work catch the stop first."""

    @functools.wraps(command)
    def run(*args: object, **kwargs: object) -> object:
        try:
            result = command(*args, **kwargs)
        except BaseException as e:  # a stop, or another error raised in its place (dill's import catches all)
            stop = behind(e)
            if stop is None:
                raise
        else:
            stop = pending()  # dropped by a library, the command ended before it was sent again
            if stop is None:
                return result
        Console(stderr=True).print(stopped(stop), style="yellow", highlight=False)
        raise typer.Exit(exit_code(stop)) from None

    return run
