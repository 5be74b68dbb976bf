"""A Ctrl-C that lands while C code is calling back into Python surfaces once the C call has
returned, through real C: libc's qsort, llama.cpp's log and the hook's Python side."""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import signal
import subprocess
import sys
import time
from contextlib import contextmanager

import numpy as np
import pytest

from kvinject import interrupts
from kvinject.engine.context import Context
from kvinject.engine.llama_log import _Log
from kvinject.engine.model import Model
from kvinject.engine.options import CacheOptions
from kvinject.error_models import EntryModel

_CMP = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int))
_pressed: list[bool] = []


@interrupts.callback
def _compare(a, b) -> int:
    if len(_pressed) < 2:  # pressed twice, the second once the first's resend has come back here
        if _pressed:
            time.sleep(1.5 * interrupts._RESEND_S)  # between two resends of the first
        _pressed.append(True)
        signal.raise_signal(signal.SIGINT)
    return a[0] - b[0]


@contextmanager
def _stop_caught(kind: type[KeyboardInterrupt] = KeyboardInterrupt):
    """pytest.raises for a stop, which the test then takes as a command does (`interrupts.caught`):
    one nobody takes is sent again."""
    with pytest.raises(kind) as stop:
        yield stop
    interrupts.caught(stop.value)


@pytest.fixture(params=["deferred", "default"])
def handler(request):
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if request.param == "deferred":
        interrupts.install()
        assert signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    yield request.param
    for s, handler in previous.items():
        signal.signal(s, handler)


@pytest.fixture
def lost(monkeypatch) -> list:
    """What ctypes could not raise from a callback ("Exception ignored on calling ctypes callback")."""
    seen: list = []
    monkeypatch.setattr(sys, "unraisablehook", seen.append)
    return seen


def test_ctrl_c_inside_a_c_callback_is_raised_after_the_c_call(handler, lost):
    values = (ctypes.c_int * 200)(*np.random.default_rng(0).permutation(200).tolist())
    _pressed.clear()
    qsort = ctypes.CDLL(ctypes.util.find_library("c")).qsort
    compare = _CMP(_compare)
    if handler == "default":
        qsort(values, 200, ctypes.sizeof(ctypes.c_int), compare)
        assert [u.exc_type for u in lost] == [KeyboardInterrupt] * 2
        return
    with _stop_caught():
        qsort(values, 200, ctypes.sizeof(ctypes.c_int), compare)
        time.sleep(5)  # it comes within interrupts._RESEND_S
    time.sleep(0.5)  # and once: the second press adds none (it would land in the clean-up)
    assert not lost and list(values) == list(range(200))  # qsort ran to its end, undisturbed


class _PressCtrlC(list):
    def append(self, line: str) -> None:
        if not self:
            signal.raise_signal(signal.SIGINT)
        super().append(line)


def test_ctrl_c_in_llama_cpp_s_log_callback_is_not_lost(handler, lost, tiny_path, monkeypatch):
    lines = _PressCtrlC()
    monkeypatch.setattr(_Log, "captures", [lines])
    if handler == "default":
        Model(str(tiny_path)).close()
        assert KeyboardInterrupt in [u.exc_type for u in lost]
        return
    with _stop_caught():
        Model(str(tiny_path))
        time.sleep(5)
    assert not lost and len(lines) > 10  # loading went on, logging, after the Ctrl-C


class _CtrlC(EntryModel):
    name = "ctrl-c"
    syntax = summary = example = "ctrl-c"

    def apply(self, x, draws):
        signal.raise_signal(signal.SIGINT)


def test_ctrl_c_in_the_hook_s_python_side_is_a_keyboard_interrupt(handler, tiny):
    ctx = Context(tiny, CacheOptions("f32", "f32", "on"), _CtrlC())
    with _stop_caught():  # not an InjectionError, with or without the handler
        ctx.prefill(tiny.tokenize("The quick brown fox jumps over the lazy dog."))
        time.sleep(5)
    ctx.close()


def test_ctrl_c_while_the_cli_loads_ends_it_without_a_traceback():
    # A real SIGINT sent while `kvinject` imports its modules: once the benchmarks have begun
    # loading, well before the CLI module has finished (about a second here).
    watcher = (
        "import os, signal, sys, threading, time\n"
        "def press():\n"
        "    while 'kvinject.benchmarks' not in sys.modules: time.sleep(0.001)\n"
        "    os.kill(os.getpid(), signal.SIGINT)\n"
        "threading.Thread(target=press, daemon=True).start()\n"
        "from kvinject.cli.launch import main\n"
        "sys.argv = ['kvinject', 'version']\n"
        "main()\n"
    )
    out = subprocess.run([sys.executable, "-c", watcher], capture_output=True, text=True, timeout=120)
    assert out.returncode == 130 and out.stderr.strip() == "interrupted", out.stderr


def _python_m(folder, lines: str, command: str = "press") -> tuple[int, str]:
    """``kvinject COMMAND`` run through the CLI's entry point with `python -m` (its exit status is
    what the SLURM scripts get), after ``lines`` (which may add the command): status and stderr."""
    (folder / "press.py").write_text(
        f"import sys\nfrom kvinject.cli import app, render\nfrom kvinject.cli.launch import main\n{lines}sys.argv = ['kvinject', '{command}']\nmain()\n"
    )
    out = subprocess.run([sys.executable, "-m", "press"], cwd=folder, capture_output=True, text=True, timeout=120)
    return out.returncode, out.stderr.strip()


def _press_under_python_m(folder, command: str) -> None:
    """Run ``kvinject press``, the command ``press`` defined by ``command``: one line and 130."""
    assert _python_m(folder, command) == (130, "interrupted")


def test_a_ctrl_c_that_lands_in_code_run_from_a_string_ends_python_m_kvinject_with_130(tmp_path):
    """CPython marks a KeyboardInterrupt that leaves code run from a string (exec and eval of
    text: dataclasses and typing build functions so while Typer parses) as unhandled even once it
    is caught, and `python -m` then ends with SIGINT (status -2) after kvinject's one line: a
    stop sent while Typer parsed failed so in one run of a full suite."""
    _press_under_python_m(tmp_path, "app.app.command(name='press')(lambda: exec('import signal; signal.raise_signal(signal.SIGINT)'))\n")


# What a library, or CPython, does with a stop it catches, each seen as lm-eval loaded.
_CATCHERS = {
    # dill's `__init__` catches everything around an import and then fails to import its fallback:
    # a ModuleNotFoundError traceback and status 1.
    "raises-another-error": "    try:\n        signal.raise_signal(signal.SIGINT)\n    except:  # noqa: E722\n        import version  # noqa: F401\n",
    # CPython 3.11 to 3.13 turn a KeyboardInterrupt that lands on a failing `from m import n` into
    # "TypeError: expected a message argument", with no trace of the stop (ssl's `from _ssl import
    # RAND_egd` did): a traceback and status 1. The loop spends its time on that import.
    "cpython-drops-it-for-a-type-error": (
        "    threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT)).start()\n"
        "    while True:\n"
        "        try:\n"
        "            from os import no_such_name  # noqa: F401\n"
        "        except ImportError:\n"
        "            pass\n"
    ),
    # Dropped, and the command ends before the stop is sent again: status 0.
    "drops-it-and-returns": "    try:\n        signal.raise_signal(signal.SIGINT)\n    except BaseException:\n        pass\n",
}


@pytest.mark.parametrize("catcher", _CATCHERS)
def test_a_stop_a_library_catches_ends_the_command_in_one_line(tmp_path, catcher):
    _press_under_python_m(tmp_path, f"import os, signal, threading\ndef press():\n{_CATCHERS[catcher]}app.app.command(name='press')(render.stoppable(press))\n")


@pytest.mark.parametrize("signum, code, word", [(signal.SIGTERM, 143, "stopped by SIGTERM"), (signal.SIGINT, 130, "interrupted")])
def test_a_scheduler_s_sigterm_keeps_finished_runs_as_ctrl_c_does(tmp_path, tiny_path, signum, code, word):
    """SLURM and `timeout` send SIGTERM at a time limit: the runs finished are written, and the
    exit status is the signal's, as for Ctrl-C."""
    output = tmp_path / "r.json"
    argv = [sys.executable, "-m", "kvinject", "run", "--model", tiny_path, "--bench", "nexttoken", "--limit", "40"]
    argv += ["--error", "normal:0,0.5", "--runs", "50", "--output", output]
    proc = subprocess.Popen(list(map(str, argv)), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = []
    for line in proc.stderr:  # not a terminal: a timed line per finished run
        lines.append(line)
        if " run 1: " in line:
            break
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == code, "".join(lines) + err
    assert f"{word}: " in err and "finished runs kept in" in err and "Traceback" not in err
    saved = json.loads(output.read_text())
    assert saved["meta"]["interrupted"] and len(saved["records"]) >= 3  # the control and two noisy runs at least


def _handles(pid: int, signum: int) -> bool:
    """Whether process ``pid`` has its own handler for ``signum`` (Linux: SigCgt in /proc)."""
    with open(f"/proc/{pid}/status") as status:
        caught = next(int(line.split()[1], 16) for line in status if line.startswith("SigCgt:"))
    return bool(caught >> (signum - 1) & 1)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("after_s", [0, 2], ids=["while-the-cli-loads", "in-the-command"])
@pytest.mark.parametrize("signum, code, word", [(signal.SIGTERM, 143, "stopped by SIGTERM"), (signal.SIGINT, 130, "interrupted")])
def test_a_command_without_work_to_keep_ends_in_one_line_with_the_signal_s_status(tiny_path, signum, code, word, after_s):
    """At once, the stop lands before the command runs, as its modules load (0.6 s) and Typer
    builds it (it made any stop there a silent 130); later, in lm-eval's task building."""
    pytest.importorskip("lm_eval")
    argv = [sys.executable, "-m", "kvinject", "lm-eval", "--model_args", f"model={tiny_path}", "--tasks", "kvinject_nextword"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while not _handles(proc.pid, signal.SIGTERM):  # kvinject's handlers are in: lm-eval builds its tasks for seconds more
        assert proc.poll() is None and time.time() < deadline
        time.sleep(0.01)
    time.sleep(after_s)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == code, err
    assert err.strip().splitlines()[-1] == word and "Traceback" not in err and "Aborted" not in err, err


@pytest.mark.parametrize("command", ["version", "interrupted"])
def test_a_signal_that_arrives_as_the_process_exits_leaves_its_status(tmp_path, command):
    """CPython's exit puts back the signals' default action: a SIGTERM or Ctrl-C arriving then (a
    scheduler's, a second press) ended a finished command with -15, or a stopped one with -2 after
    its line, in place of 0 or 130. Sent here as the interpreter exits (atexit)."""
    late = (
        "import atexit, os, signal, time\n"
        "def late():\n"
        "    for s in (signal.SIGTERM, signal.SIGINT):\n"
        "        os.kill(os.getpid(), s)\n"
        "    time.sleep(0.2)\n"
        "atexit.register(late)\n"
        "app.app.command(name='interrupted')(render.stoppable(lambda: signal.raise_signal(signal.SIGINT)))\n"
    )
    assert _python_m(tmp_path, late, command) == ((0, "") if command == "version" else (130, "interrupted"))


def test_a_second_ctrl_c_or_sigterm_does_not_break_off_the_clean_up():
    """After the first stop the command writes what it finished; a second press landed there as a
    traceback and a half-written file."""
    previous = {s: signal.signal(s, signal.default_int_handler if s == signal.SIGINT else signal.SIG_DFL) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        interrupts.install()
        saved = []
        with _stop_caught():
            try:
                signal.raise_signal(signal.SIGINT)
                time.sleep(5)
            finally:  # the clean-up, pressed again, then terminated by the scheduler
                signal.raise_signal(signal.SIGINT)
                signal.raise_signal(signal.SIGTERM)
                saved.append(True)
        assert saved
        interrupts.install()  # a new command: its first press stops it again
        with _stop_caught():
            signal.raise_signal(signal.SIGINT)
            time.sleep(5)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        interrupts._stopped = False


@pytest.fixture
def own_handlers(monkeypatch):
    monkeypatch.setattr(interrupts, "_WATCH_S", 0.05)
    previous = {s: signal.signal(s, signal.default_int_handler if s == signal.SIGINT else signal.SIG_DFL) for s in (signal.SIGINT, signal.SIGTERM)}
    interrupts.install()
    yield
    if (stop := interrupts.pending()) is not None:  # left by a failing test: not sent again into the next
        interrupts.caught(stop)
    for s, handler in previous.items():
        signal.signal(s, handler)
    interrupts._stopped = False


def test_a_stop_a_library_swallows_is_sent_again(own_handlers):
    """lm-eval's task building swallowed a SIGTERM in `datasets` (a bare except around dill) and
    ran to its end with status 0."""
    swallowed = []
    with _stop_caught(interrupts.Terminated):
        try:
            signal.raise_signal(signal.SIGTERM)
            time.sleep(5)
        except BaseException as e:  # noqa: BLE001 - the library's bare except
            swallowed.append(e)
        time.sleep(5)  # the command goes on; the stop comes again within _UNSEEN * _WATCH_S
    assert len(swallowed) == 1 and isinstance(swallowed[0], interrupts.Terminated)


def test_a_stop_that_lands_in_an_import_waits_for_it_to_finish(own_handlers, tmp_path, monkeypatch):
    """Broken off, an import left its package half made: a `run` stopped in the work then failed
    to import scipy.stats to write the runs it kept ("module 'scipy' has no attribute '_lib'")."""
    (tmp_path / "halfway.py").write_text("import signal, time\nsignal.raise_signal(signal.SIGINT)\ntime.sleep(0.3)\nDONE = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with _stop_caught():
        import halfway  # noqa: F401

        time.sleep(5)
    assert sys.modules["halfway"].DONE
    del sys.modules["halfway"]


def test_a_stop_on_its_way_or_caught_is_not_sent_again(own_handlers):
    """A slow clean-up (a `finally`, a `with` block's exit, the work a command keeps after it has
    caught the stop) is no swallowed stop: a second one would break it off."""
    wait = 3 * interrupts._UNSEEN * interrupts._WATCH_S
    kept = []
    with _stop_caught():
        try:
            signal.raise_signal(signal.SIGINT)
            time.sleep(5)
        finally:
            time.sleep(wait)
            kept.append("finally")
    time.sleep(wait)  # caught, outside its `except` block
    kept.append("after")
    assert kept == ["finally", "after"] and interrupts.pending() is None


def test_a_stop_sent_again_and_caught_before_it_came_is_not_raised_again(own_handlers):
    """The watcher took a stop as swallowed (it unwound for a second on a loaded machine) and sent
    it again, and the command caught the stop before the signal came: the signal then ended the
    exiting command, after its one line, with status -2 instead of 130."""
    with _stop_caught() as stop:
        signal.raise_signal(signal.SIGINT)
        time.sleep(5)
    try:
        interrupts.send_again(stop.value, signal.SIGINT)
        time.sleep(0.5)
    except KeyboardInterrupt:
        pytest.fail("the stop, caught, was raised again")
    interrupts.install()  # the next command
    with _stop_caught():  # not caught: it comes again
        try:
            signal.raise_signal(signal.SIGINT)
            time.sleep(5)
        except KeyboardInterrupt as swallowed:
            interrupts.send_again(swallowed, signal.SIGINT)
            time.sleep(5)
