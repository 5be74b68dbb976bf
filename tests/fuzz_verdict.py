"""What a generated command must do: exit 0 with outputs that parse, or exit 1 or 2 with one
error line on standard error and no traceback; and leave every file that was there before
as it was, but for the outputs it wrote and the stores it added to."""

from __future__ import annotations

import csv
import hashlib
import json
import shutil
import sqlite3
from collections.abc import Callable
from pathlib import Path

from tests.fuzz_exec import Outcome, execute

STORES = (".sqlite",)


def snapshot(folder: Path) -> dict[Path, str]:
    """Each regular file under ``folder`` (not links, not the child's own capture) and its hash."""
    return {p: snapshot_of(p) for p in folder.rglob("*") if p.is_file() and not p.is_symlink() and not p.name.startswith(".std")}


def snapshot_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def run_one(args: list[str], template: Path, folder: Path, seconds: float, prepare: Callable[[Path], None] | None = None) -> str | None:
    """Run ``args`` in a fresh copy of ``template`` (changed by ``prepare``, tests/fuzz_files.py);
    what went wrong, or None."""
    if folder.exists():
        shutil.rmtree(folder)
    shutil.copytree(template, folder, symlinks=True)
    if prepare:
        prepare(folder)
    before = snapshot(folder)
    outcome = execute(args, folder, seconds)
    return verdict(args, outcome, folder, before)


def verdict(args: list[str], outcome: Outcome, folder: Path, before: dict[Path, str]) -> str | None:
    if outcome.code is None:
        return f"still running after {outcome.seconds:.0f} s"
    if "Traceback (most recent call last)" in outcome.stderr:
        return "traceback: " + last_line(outcome.stderr)
    if outcome.code == 0:
        problem = outputs_parse(args, outcome, folder, before)
    elif outcome.code == 1 and args[0] == "replay" and "replayed DIFFERENTLY" in outcome.stdout and not outcome.stderr.strip():
        problem = None  # replay's answer that the item decodes otherwise than recorded (a record edited)
    elif outcome.code in (1, 2):
        problem = _one_line(outcome.stderr)
    else:
        problem = f"exit status {outcome.code}: {last_line(outcome.stderr)}"
    return problem or files_kept(args, outcome, folder, before)


def last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "(nothing on standard error)"


def _one_line(stderr: str) -> str | None:
    """kvinject's `error: ...` (a spec's valid form may follow), or click's usage error."""
    errors = [line for line in stderr.splitlines() if line.startswith(("error:", "Error:"))]
    if len(errors) != 1:
        return f"{len(errors)} error lines: {last_line(stderr)}"
    return None


def outputs_parse(args: list[str], outcome: Outcome, folder: Path, before: dict[Path, str]) -> str | None:
    """What the command printed as JSON, and the files it wrote (an input damaged on purpose,
    left as it was, is not its output)."""
    if "json" in args and "--format" in args and args[args.index("--format") + 1] == "json" and "lm-eval" not in args:
        try:
            json.loads(outcome.stdout)
        except ValueError as e:
            return f"--format json printed what is not JSON ({e})"
    for path in folder.rglob("*"):
        if not path.is_file() or path.is_symlink() or path.name.startswith(".std") or (path in before and snapshot_of(path) == before[path]):
            continue
        try:
            if path.suffix == ".json":
                json.loads(path.read_text())
            elif path.suffix == ".csv":
                list(csv.reader(path.read_text().splitlines()))
            elif path.suffix in STORES and path.stat().st_size:
                with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
                    db.execute("SELECT name FROM sqlite_master").fetchall()
        except (ValueError, sqlite3.Error, UnicodeDecodeError) as e:
            return f"{path.name} does not parse: {e}"
    return None


def files_kept(args: list[str], outcome: Outcome, folder: Path, before: dict[Path, str]) -> str | None:
    """Files that were there: unchanged, unless named as an output of a command that succeeded
    (or a store, which a failed run may have added to)."""
    named = {(folder / a).resolve() for a in args if not a.startswith("-")}
    named |= {(folder / a.partition("=")[2]).resolve() for a in args if a.startswith("--") and "=" in a}
    after = snapshot(folder)
    for path, digest in before.items():
        if after.get(path) == digest:
            continue
        written = path.resolve() in named and (outcome.code == 0 or path.suffix in STORES)
        if path not in after:
            return f"{path.name}, there before, is gone"
        if not written:
            return f"{path.name}, there before, was changed"
        if path.stat().st_size == 0:
            return f"{path.name} was left empty"
    return None
