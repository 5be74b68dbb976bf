"""Ctrl-C, and SIGTERM, while llama.cpp is calling back into Python.

llama.cpp calls Python from C: its log callback, the hook's Python side. A KeyboardInterrupt
raised there cannot cross into C: ctypes prints "Exception ignored on calling ctypes callback"
and drops the log callback's, and the hook could only report its own after the decode. The
user then pressed Ctrl-C again (a sweep's Ctrl-C test lost one this way). With
`install()`, an interrupt that lands inside a callback is put off until the callback has
returned, and surfaces in the Python code that called into llama.cpp. One that lands while a
module is being imported waits for the import to finish the same way: broken off, it left the
module's package half made (a stopped `run` then failed to import scipy.stats to write the runs
it kept: "module 'scipy' has no attribute '_lib'").

SIGTERM, what a scheduler (SLURM at a time limit) and `timeout` send, stops a command the same
way, as :class:`Terminated`: what is finished is kept, and the command exits with 143 as a
process the signal ended would, so that the scheduler records it.

A library may swallow a stop (lm-eval builds its tasks with `datasets`, whose fingerprinting
catches everything around a dill pickle): the command then ran on to its end and exited 0. A
stop that neither ends the process nor reaches code that says it was caught (`caught`,
`exit_code`) within a second is sent again, and a command that ends while one is `pending`, in
any way, ends as that stop.
"""

from __future__ import annotations

import _thread
import signal
import sys
import threading
import time
from types import CodeType, FrameType
from typing import Callable, TypeVar

F = TypeVar("F", bound=Callable)


class Terminated(KeyboardInterrupt):
    """A SIGTERM, raised where a Ctrl-C would be; every handler of Ctrl-C handles it."""


def exit_code(stop: KeyboardInterrupt) -> int:
    """A stopped command's exit status: 128 + the signal's number, as the shell reports it."""
    caught(stop)
    # CPython notes a KeyboardInterrupt that leaves code run from a string (dataclasses and typing
    # exec and eval text) as unhandled, caught or not, and `python -m` then ends with SIGINT in
    # place of this status; running a string resets that note.
    exec("")
    return 128 + (signal.SIGTERM if isinstance(stop, Terminated) else signal.SIGINT)


def ending() -> None:
    """The process's status is decided: from here to its end, SIGINT and SIGTERM are ignored. After
    a stop the Python handler ignored them already, but CPython's exit puts back their default
    action, and one arriving then ended the process with -2 or -15 after its work, or after its one
    line in place of 130. For the entry points (the process is theirs), and only over kvinject's own
    handlers, where `install` put them."""
    if threading.current_thread() is not threading.main_thread():
        return
    for signum in (signal.SIGINT, signal.SIGTERM):
        if signal.getsignal(signum) is _on_signal:
            signal.signal(signum, signal.SIG_IGN)


def stopped(stop: KeyboardInterrupt) -> str:
    """How a stop is named: a Ctrl-C interrupts, a scheduler's SIGTERM stops."""
    return "stopped by SIGTERM" if isinstance(stop, Terminated) else "interrupted"


def caught(stop: KeyboardInterrupt) -> None:
    """Say that `stop` reached the code that ends the command (keeping its work may take a while,
    outside the `except` block): it was not swallowed, and is not sent again."""
    global _raised
    if stop is _raised:
        _raised = None


def pending() -> KeyboardInterrupt | None:
    """The stop raised last that no command has caught. A command that ends while it is pending,
    with an error, an exit or its result, ends as that stop: it landed before the command ran
    (Typer makes it status 130 without a word, SIGTERM too); a library caught it and raised
    another error or none (CPython 3.11 to 3.13 turn one that lands on a failing
    ``from m import n`` into "TypeError: expected a message argument", with no trace of it); or
    the command finished before it was sent again, or before one put off came back."""
    if _raised is None and _waiting is not None:
        _take(_waiting)
    return _raised


def behind(exit: BaseException) -> KeyboardInterrupt | None:
    """The stop a command ended by ``exit`` ends as: ``exit`` itself, or the one `pending`."""
    return exit if isinstance(exit, KeyboardInterrupt) else pending()


_CALLBACKS: set[CodeType] = set()
_IMPORTING = "<frozen importlib._bootstrap>"  # the import system's frames, around a module's own code
_RESEND_S = 0.05
_resend: threading.Timer | None = None
_terminated = False  # a SIGTERM put off with a Ctrl-C: the stop raised is the SIGTERM
_waiting: int | None = None  # the signal put off (in a callback, an import), until its stop is raised
# A stop was raised: the command is keeping its work (writing its output, closing its store), and
# a second Ctrl-C, or the scheduler's SIGTERM after it, would break that off with a traceback.
# Further signals are ignored until the process ends; SIGKILL still ends it at once.
_stopped = False
_raised: KeyboardInterrupt | None = None  # the stop raised last, until it is caught
_resending: KeyboardInterrupt | None = None  # the swallowed stop a signal is on its way again for
_WATCH_S = 0.25  # how often a raised stop is looked for in the main thread
_UNSEEN = 4  # looks that do not find it, one after the other, before it is taken as swallowed


def callback(fn: F) -> F:
    """Mark `fn` as called from C: a Ctrl-C that lands while it runs waits until it returns."""
    _CALLBACKS.add(fn.__code__)
    return fn


def _put_off(frame: FrameType | None) -> bool:
    """Whether a stop landing at ``frame`` waits: in a callback from C, or in an import."""
    while frame is not None:
        if frame.f_code in _CALLBACKS or frame.f_code.co_filename == _IMPORTING:
            return True
        frame = frame.f_back
    return False


def _on_signal(signum: int, frame: FrameType | None) -> None:
    global _resend, _terminated, _waiting
    # Once stopped, signals are ignored but for the one sent again for a swallowed stop, and that
    # one only if the stop is still not caught: a slow unwinding can reach its `except` while the
    # signal is on its way, and the signal would then end the exiting command (status -2).
    if _stopped and (_resending is None or _raised is not _resending):
        return
    _terminated = _terminated or signum == signal.SIGTERM
    if _put_off(frame):
        # Sent again shortly from another thread (re-sent at once, it would land in this very
        # handler): it comes back here while the callback or import still runs, and once it has
        # returned it waits for Python's next check, outside it. Presses meanwhile are one.
        # A real signal to the main thread, as a press is: _thread.interrupt_main only sets
        # Python's flag, which a blocking call (a sleep) does not notice until it returns.
        _waiting = signum if _waiting is None else _waiting
        if _resend is None or not _resend.is_alive():
            _resend = threading.Timer(_RESEND_S, _send, (signum,))
            _resend.daemon = True
            _resend.start()
        return
    raise _take(signum)


def _take(signum: int) -> KeyboardInterrupt:
    """The stop the signals received make, watched until it is caught."""
    global _resend, _terminated, _stopped, _resending, _waiting
    if _resend is not None:  # this is the interrupt it would send: not a second one during the clean-up
        _resend.cancel()
        _resend = None
    stop, _terminated, _stopped, _resending, _waiting = (Terminated if _terminated else KeyboardInterrupt)(), False, True, None, None
    _watch(stop, signum)
    return stop


def _watch(stop: KeyboardInterrupt, signum: int) -> None:
    global _raised
    _raised = stop
    threading.Thread(target=_follow, args=(stop, signum), daemon=True).start()


def _follow(stop: KeyboardInterrupt, signum: int) -> None:
    """Send the signal again if `stop` is no longer on its way (raised, or handled by an `except`,
    `finally` or `with` block) and was not caught: unwinding between blocks takes microseconds."""
    unseen = 0
    while unseen < _UNSEEN:
        time.sleep(_WATCH_S)
        if _raised is not stop:
            return
        handled = sys._current_exceptions().get(threading.main_thread().ident)
        handled = handled[1] if isinstance(handled, tuple) else handled  # Python 3.11: exc_info
        unseen = 0 if handled is not None and _holds(handled, stop) else unseen + 1
    send_again(stop, signum)


def send_again(stop: KeyboardInterrupt, signum: int) -> None:
    """Send the signal again for ``stop``, which looks swallowed: it raises a new stop unless
    ``stop`` has been caught by the time it arrives."""
    global _resending
    _resending = stop
    _send(signum)


def _holds(exc: BaseException, stop: BaseException) -> bool:
    """Whether `stop` is `exc` or what it was raised from or during."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if exc is stop:
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return False


def _send(signum: int) -> None:
    if hasattr(signal, "pthread_kill"):
        signal.pthread_kill(threading.main_thread().ident, signum)
    else:  # Windows
        _thread.interrupt_main(signum)


def install() -> None:
    """Defer Ctrl-C and SIGTERM out of callbacks, and let only the first stop a command; only over
    Python's default handlers, in the main thread. A stop still pending is kept: the command
    installs this before its modules load, and again as it starts."""
    global _stopped, _resending
    if threading.current_thread() is not threading.main_thread():
        return
    if _raised is None:
        _stopped, _resending = False, None
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _on_signal)
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _on_signal)
