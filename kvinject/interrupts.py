"""Ctrl-C, and SIGTERM, while llama.cpp is calling back into Python.

llama.cpp calls Python from C: its log callback, the hook's Python side. A KeyboardInterrupt
raised there cannot cross into C: ctypes prints "Exception ignored on calling ctypes callback"
and drops the log callback's, and the hook could only report its own after the decode. The
user then pressed Ctrl-C again (a sweep's Ctrl-C test lost one this way). With
`install()`, an interrupt that lands inside a callback is put off until the callback has
returned, and surfaces in the Python code that called into llama.cpp.

SIGTERM, what a scheduler (SLURM at a time limit) and `timeout` send, stops a command the same
way, as :class:`Terminated`: what is finished is kept, and the command exits with 143 as a
process the signal ended would, so that the scheduler records it.
"""

from __future__ import annotations

import _thread
import signal
import threading
from types import CodeType, FrameType
from typing import Callable, TypeVar

F = TypeVar("F", bound=Callable)


class Terminated(KeyboardInterrupt):
    """A SIGTERM, raised where a Ctrl-C would be; every handler of Ctrl-C handles it."""


def exit_code(stop: KeyboardInterrupt) -> int:
    """A stopped command's exit status: 128 + the signal's number, as the shell reports it."""
    return 128 + (signal.SIGTERM if isinstance(stop, Terminated) else signal.SIGINT)


_CALLBACKS: set[CodeType] = set()
_RESEND_S = 0.05
_resend: threading.Timer | None = None
_terminated = False  # a SIGTERM put off with a Ctrl-C: the stop raised is the SIGTERM
# A stop was raised: the command is keeping its work (writing its output, closing its store), and
# a second Ctrl-C, or the scheduler's SIGTERM after it, would break that off with a traceback.
# Further signals are ignored until the process ends; SIGKILL still ends it at once.
_stopped = False


def callback(fn: F) -> F:
    """Mark `fn` as called from C: a Ctrl-C that lands while it runs waits until it returns."""
    _CALLBACKS.add(fn.__code__)
    return fn


def _in_callback(frame: FrameType | None) -> bool:
    while frame is not None:
        if frame.f_code in _CALLBACKS:
            return True
        frame = frame.f_back
    return False


def _on_signal(signum: int, frame: FrameType | None) -> None:
    global _resend, _terminated, _stopped
    if _stopped:
        return
    _terminated = _terminated or signum == signal.SIGTERM
    if _in_callback(frame):
        # Sent again shortly from another thread (re-sent at once, it would land in this very
        # handler): it comes back here while the callback still runs, and once C has returned
        # it waits for Python's next check, outside the callback. Presses meanwhile are one.
        # A real signal to the main thread, as a press is: _thread.interrupt_main only sets
        # Python's flag, which a blocking call (a sleep) does not notice until it returns.
        if _resend is None or not _resend.is_alive():
            _resend = threading.Timer(_RESEND_S, _send, (signum,))
            _resend.daemon = True
            _resend.start()
        return
    if _resend is not None:  # this is the interrupt it would send: not a second one during the clean-up
        _resend.cancel()
        _resend = None
    stop, _terminated, _stopped = (Terminated if _terminated else KeyboardInterrupt), False, True
    raise stop


def _send(signum: int) -> None:
    if hasattr(signal, "pthread_kill"):
        signal.pthread_kill(threading.main_thread().ident, signum)
    else:  # Windows
        _thread.interrupt_main(signum)


def install() -> None:
    """Defer Ctrl-C and SIGTERM out of callbacks, and let only the first stop a command; only over
    Python's default handlers, in the main thread."""
    global _stopped
    if threading.current_thread() is not threading.main_thread():
        return
    _stopped = False
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _on_signal)
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _on_signal)
