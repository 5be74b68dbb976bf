"""Every command's ``--help`` at a fixed width, and the listings of error models and
benchmarks, to hold the command line unchanged across refactors (test_help.py).

``python -m tests.help_texts`` records them with the code at hand into tests/fixtures/help/.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "help"
COMMANDS = ["", "errors", "benchmarks", "generate", "run", "sweep", "profile", "tune", "divergence", "report", "replay", "score", "info", "version"]
# Rich reads the width from the environment; a fixed one makes the texts comparable anywhere.
ENV = {"COLUMNS": "100", "TERMINAL_WIDTH": "100", "NO_COLOR": "1", "TERM": "dumb"}
# Listings whose order and wording users read (the registries' order among them).
LISTINGS = {"errors.listing.txt": ["errors"], "benchmarks.listing.json": ["benchmarks", "--format", "json"]}


def help_text(command: str) -> str:
    from kvinject.cli.app import app

    result = CliRunner().invoke(app, [*filter(None, [command]), "--help"], env=ENV, prog_name="kvinject")
    assert result.exit_code == 0, result.output
    return result.output


def fixture(command: str) -> Path:
    return FIXTURES / f"{command or 'kvinject'}.txt"


def listing(args: list[str]) -> str:
    """What the command prints, run as a user runs it, at the fixed width."""
    out = subprocess.run([sys.executable, "-m", "kvinject", *args], capture_output=True, text=True, env={**os.environ, **ENV}, check=True)
    return out.stdout


if __name__ == "__main__":
    FIXTURES.mkdir(parents=True, exist_ok=True)
    for command in COMMANDS:
        fixture(command).write_text(help_text(command))
    for name, args in LISTINGS.items():
        (FIXTURES / name).write_text(listing(args))
    print(f"{len(COMMANDS)} help texts written to {FIXTURES}", file=sys.stderr)
