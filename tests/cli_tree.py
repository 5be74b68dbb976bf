"""The `kvinject` command tree as Click holds it, for tests that go through every command and
option: a new command or option is tested the day it is added, or the test says what it lacks.

``invoke`` runs a command in-process, with the points where a command's work starts (a model
loads, stores are read, a sweep plans, data loads) replaced by :class:`WorkStarted`, so that a
user's mistake must be found before any of them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from typer.main import get_command
from typer.testing import CliRunner

from kvinject.cli.app import app
from kvinject.exceptions import KvinjectError

ROOT = get_command(app)


class WorkStarted(Exception):
    """A command began its work (loading a model, reading stores, planning a sweep)."""


def commands() -> dict[str, Any]:
    return dict(ROOT.commands)


def annotation(param: Any) -> Any:
    return param.type_descriptor.annotation


def flag(param: Any) -> str:
    """The option's long flag (its first), or the argument's name."""
    return next((o for o in param.opts if o.startswith("--")), param.opts[0])


def is_option(param: Any) -> bool:
    return type(param).__name__ == "TyperOption"


@pytest.fixture
def no_work(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every command's first step of work raises WorkStarted."""
    from kvinject.analysis import report
    from kvinject.benchmarks.ifeval import bench
    from kvinject.cli import flags
    from kvinject.engine.model import Model
    from kvinject.experiments.sweep import Sweep

    def started(*args: object, **kwargs: object) -> None:
        raise WorkStarted

    monkeypatch.setattr(flags, "load", started)
    monkeypatch.setattr(Model, "__init__", started)
    monkeypatch.setattr(report, "load_records", started)
    monkeypatch.setattr(Sweep, "plan", started)
    monkeypatch.setattr(bench, "load_items", started)


def invoke(args: list[object]) -> tuple[int, str]:
    """The exit status and the message of ``kvinject ARGS`` run in-process (a KvinjectError: 2
    and its line, as the `kvinject` command prints it); WorkStarted propagates."""
    result = CliRunner().invoke(app, [str(a) for a in args], catch_exceptions=True)
    if isinstance(result.exception, WorkStarted):
        raise result.exception
    if isinstance(result.exception, KvinjectError):
        return 2, str(result.exception)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.output


def empty_store(tmp_path: Path) -> Path:
    """A file standing for a results store where its content is never read (no_work)."""
    path = tmp_path / "in.results.sqlite"
    path.write_bytes(b"")
    return path
