"""Commands stopped part way: each command's smallest valid run (tests/fuzz_cli.py's BASES, and
each again with ``--error`` where the command takes one), started as ``python -m kvinject`` in a
fresh workspace and sent a Ctrl-C or a scheduler's SIGTERM, sometimes a second signal after it,
at a drawn time once kvinject's handlers are in: as its modules load, as Typer parses, as the
command loads what it needs, in its work, at its end.

A stopped command must end within STOP_SECONDS with a signal's status (130, 143; the first's
unless both came while a callback put them off) and its word ("interrupted", "stopped by SIGTERM") opening the last line on standard error, with no
traceback and no "Exception ignored"; what it wrote must parse, and every file there before be as it
was. A command the signal reached as it finished may exit 0 with its outputs whole; one that
went on for LOST_SECONDS after the signal and then exited 0 lost the stop."""

from __future__ import annotations

import random
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tests.cli_tree import flag, is_option
from tests.fuzz_cli import BASES, SPEC, options
from tests.fuzz_exec import Outcome
from tests.fuzz_verdict import files_kept, last_line, outputs_parse, snapshot, verdict

SIGNALS = [(signal.SIGINT,), (signal.SIGTERM,), (signal.SIGINT, signal.SIGINT), (signal.SIGINT, signal.SIGTERM), (signal.SIGTERM, signal.SIGINT)]
WORDS = {signal.SIGINT: "interrupted", signal.SIGTERM: "stopped by SIGTERM"}
# Seconds after the handlers are in, drawn up to one of these: the CLI's modules load in about
# 0.6 s and Typer parses after them; a command's own imports (lm-eval, pandas) take a few more.
SCALES = (0.05, 0.8, 6.0)
STOP_SECONDS = 60  # to end once stopped: the finished work is written first
LOST_SECONDS = 5.0  # a swallowed stop is sent again within 1.5 s; one after the status is decided ends in under a second


@dataclass(frozen=True)
class Stop:
    args: list[str]
    signals: tuple[int, ...]
    after_s: float  # from the handlers being in to the first signal
    again_s: float  # from the first signal to the second, where there is one

    def __str__(self) -> str:
        sent = " then ".join(signal.Signals(s).name for s in self.signals)
        return f"{sent} at {self.after_s:.3f} s (+{self.again_s:.2f} s): kvinject {' '.join(self.args)}"


def commands() -> list[list[str]]:
    """Each command's smallest runs, and those of the commands that take ``--error`` with one (and
    run's with the finished runs it keeps written to ``--output``)."""
    out = []
    for command, bases in BASES.items():
        takes_error = command != "lm-eval" and any(is_option(p) and flag(p) == "--error" for p in options(command))
        for base in bases:
            out.append([command, *base])
            if takes_error and "--error" not in base:
                out.append([command, *base, *SPEC, *(["--output", "out.json"] if command == "run" else [])])
    return out


def sample(count: int, seed: int = 0) -> list[Stop]:
    """``count`` stops: the commands in a fixed shuffled order, over and over, each with its signals
    and times drawn."""
    rng = random.Random(seed)
    order = commands()
    rng.shuffle(order)
    return [Stop(order[i % len(order)], rng.choice(SIGNALS), rng.uniform(0, rng.choice(SCALES)), rng.uniform(0, 0.5)) for i in range(count)]


def run_stopped(stop: Stop, template: Path, folder: Path) -> str | None:
    """Run ``stop`` in a fresh copy of ``template``; what went wrong, or None."""
    if folder.exists():
        shutil.rmtree(folder)
    shutil.copytree(template, folder, symlinks=True)
    before = snapshot(folder)
    start = time.monotonic()
    with open(folder / ".stdout", "w") as out, open(folder / ".stderr", "w") as err:
        # Ctrl-C's default action, as a terminal's foreground command has it (a background job's is to ignore it)
        proc = subprocess.Popen([sys.executable, "-m", "kvinject", *stop.args], cwd=folder, stdout=out, stderr=err, preexec_fn=_default_ctrl_c)
        sent = _send(proc, stop)
        try:
            proc.wait(STOP_SECONDS if sent else 300)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            return f"still running {STOP_SECONDS} s after the signal" if sent else "still running after 300 s"
    ended = time.monotonic()
    outcome = Outcome(proc.returncode, (folder / ".stdout").read_text(errors="replace"), (folder / ".stderr").read_text(errors="replace"), ended - start)
    if sent is None:  # it finished before the signal: a command like any other
        return verdict(stop.args, outcome, folder, before)
    return _stopped(stop, outcome, folder, before, ended - sent)


def _default_ctrl_c() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _send(proc: subprocess.Popen, stop: Stop) -> float | None:
    """Send the stop's signals once kvinject's handlers are in; when the first went, or None if the
    command ended before it."""
    deadline = time.monotonic() + 60
    while not _handles(proc.pid, signal.SIGTERM):
        if proc.poll() is not None or time.monotonic() > deadline:
            return None
        time.sleep(0.002)
    time.sleep(stop.after_s)
    if proc.poll() is not None:
        return None
    proc.send_signal(stop.signals[0])
    sent = time.monotonic()
    for signum in stop.signals[1:]:
        time.sleep(stop.again_s)
        if proc.poll() is None:
            proc.send_signal(signum)
    return sent


def _handles(pid: int, signum: int) -> bool:
    """Whether process ``pid`` has a handler of its own for ``signum`` (Linux: SigCgt in /proc)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            caught = next(int(line.split()[1], 16) for line in status if line.startswith("SigCgt:"))
    except (FileNotFoundError, ProcessLookupError, StopIteration):  # ended, or a zombie without the line
        return False
    return bool(caught >> (signum - 1) & 1)


def _stopped(stop: Stop, outcome: Outcome, folder: Path, before: dict[Path, str], after_signal_s: float) -> str | None:
    first = stop.signals[0]
    if outcome.code == 0:
        if after_signal_s > LOST_SECONDS:
            return f"exited 0 {after_signal_s:.1f} s after {signal.Signals(first).name}: the stop was lost"
        return verdict(stop.args, outcome, folder, before)  # it came as the command finished
    if "Traceback (most recent call last)" in outcome.stderr or "Exception ignored" in outcome.stderr:  # ctypes drops what a callback raised
        return f"{'traceback' if 'Traceback' in outcome.stderr else 'exception ignored'}: {last_line(outcome.stderr)}"
    # A Ctrl-C put off in a callback, and a SIGTERM meanwhile: the scheduler's is the stop raised.
    if outcome.code not in [128 + s for s in stop.signals]:
        return f"exit status {outcome.code} after {signal.Signals(first).name}: {last_line(outcome.stderr)}"
    if not last_line(outcome.stderr).startswith(WORDS[outcome.code - 128]):
        return f"its last line does not say {WORDS[outcome.code - 128]!r}: {last_line(outcome.stderr)}"
    # what a stopped command keeps (run's --output, a sweep's store) is written whole
    return outputs_parse(stop.args, outcome, folder, before) or files_kept(stop.args, Outcome(0, "", "", 0), folder, before)
