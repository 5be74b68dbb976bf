"""The ``kvinject`` application: its commands, in the order ``--help`` lists them, and the
entry point that prints a user's mistake as one line."""

from __future__ import annotations

import sys
from typing import Annotated

import typer
from rich.console import Console
from rich.text import Text

from .. import __version__, interrupts
from ..exceptions import KvinjectError
from . import benchmarks, divergence, errors, generate, harness, info, profile, replay, report, run, score, sweep, tune
from .numbers import strict
from .render import stoppable

app = typer.Typer(
    help=(
        "Inject controlled error into the K and V vectors of a llama.cpp model as they enter "
        "the KV cache, and measure what it does.\n\n"
        "Start with `kvinject errors` (the error models), `kvinject info` (model, backend and "
        'cache sizes) and `kvinject generate "The capital of France is" --error normal:0,0.5`.'
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # help texts show spec syntax such as ERROR[@K[/V]] literally
)


def _print_version(given: bool) -> None:
    if given:
        print(__version__)
        raise typer.Exit()


@app.callback()
def _options(
    ctx: typer.Context,
    version: Annotated[bool, typer.Option("--version", help="Print kvinject's version and exit.", callback=_print_version, is_eager=True)] = False,
) -> None:
    """--version; the app's help is Typer(help=...) above. Runs before the command's options are
    read: its integer and real options are then read as every number is (numbers.py)."""
    strict(ctx.command)


def version() -> None:
    """Print kvinject's version."""
    print(__version__)


app.command()(stoppable(errors.errors))
app.command()(stoppable(benchmarks.benchmarks))
app.command()(stoppable(generate.generate))
app.command(name="run")(stoppable(run.run_command))
app.command()(stoppable(sweep.sweep))
app.command(name="profile")(stoppable(profile.profile))
app.command(name="tune")(stoppable(tune.tune))
app.command(name="divergence")(stoppable(divergence.divergence_command))
app.command()(stoppable(report.report))
app.command()(stoppable(replay.replay))
app.command()(stoppable(score.score))
app.command()(stoppable(info.info))
# lm-eval's options pass through untouched, --help included.
app.command(name="lm-eval", context_settings={"allow_extra_args": True, "ignore_unknown_options": True}, add_help_option=False)(stoppable(harness.lm_eval))
app.command()(stoppable(version))


def main() -> None:
    interrupts.install()
    try:
        try:
            app()
        finally:  # a signal from here on would end the exiting process by its default action
            interrupts.ending()
    except BaseException as e:  # Typer ends with SystemExit, a command's status
        stop = interrupts.pending()  # one before a command ran (Typer's own handling is silent, and 130 for SIGTERM too)
        if stop is not None:
            Console(stderr=True).print(interrupts.stopped(stop), style="yellow", highlight=False)
            sys.exit(interrupts.exit_code(stop))
        if not isinstance(e, KvinjectError):
            raise
        Console(stderr=True, soft_wrap=True).print("[bold red]error:[/]", Text(str(e)), highlight=False)  # one line, however long
        sys.exit(2)
