"""A Ctrl-C that lands while C code is calling back into Python surfaces once the C call has
returned, through real C: libc's qsort, llama.cpp's log and the hook's Python side."""

from __future__ import annotations

import ctypes
import ctypes.util
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from kvinject import interrupts
from kvinject.engine.context import Context
from kvinject.engine.llama_log import _Log
from kvinject.engine.model import Model
from kvinject.engine.options import CacheOptions
from kvinject.error_models import ErrorModel

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


@pytest.fixture(params=["deferred", "default"])
def handler(request):
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    if request.param == "deferred":
        interrupts.install()
        assert signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    yield request.param
    signal.signal(signal.SIGINT, previous)


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
    with pytest.raises(KeyboardInterrupt):
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
    with pytest.raises(KeyboardInterrupt):
        Model(str(tiny_path))
        time.sleep(5)
    assert not lost and len(lines) > 10  # loading went on, logging, after the Ctrl-C


class _CtrlC(ErrorModel):
    name = "ctrl-c"
    syntax = summary = example = "ctrl-c"

    def apply(self, x, draws):
        signal.raise_signal(signal.SIGINT)


def test_ctrl_c_in_the_hook_s_python_side_is_a_keyboard_interrupt(handler, tiny):
    ctx = Context(tiny, CacheOptions("f32", "f32", "on"), _CtrlC())
    with pytest.raises(KeyboardInterrupt):  # not an InjectionError, with or without the handler
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
