"""Seconds the process ran: a monotonic clock that stands still while the process is stopped.

A fault campaign's watchdog gives each item a time (the golden run's per item, times a factor)
and calls an item still generating past it a DUE, "timeout". On the wall clock, a campaign
suspended for a while (Ctrl-Z, `kill -STOP`, a scheduler suspending a job) found every item in
flight past its time when it went on, and recorded harmless faults as DUEs. A stop cannot be
caught (SIGSTOP) and the process cannot tell when it began, but the SIGCONT that ends it can be:
the time since this clock was last read, until the SIGCONT, is not counted. What the process
computed in that gap since the last reading (a decoding step: generation reads the clock at
every token) is dropped with it, which only makes the watchdog more lenient.

The SIGCONT handler is installed on the first reading in the main thread, over the default
action only; until then (a program that reads it only from other threads) it is the wall clock.
"""

from __future__ import annotations

import signal
import threading
import time

_last = time.perf_counter()  # when the clock was last read
_stopped = 0.0  # seconds not counted: each stop, from the last reading before it to its SIGCONT
_installed = False


def now() -> float:
    """Seconds on a monotonic clock that does not advance while the process is stopped (only
    differences mean anything, as with time.perf_counter)."""
    global _last
    if not _installed:
        _install()
    _last = time.perf_counter()
    return _last - _stopped


def _continued(signum: int, frame: object) -> None:
    global _last, _stopped
    t = time.perf_counter()
    _stopped += t - _last
    _last = t


def _install() -> None:
    global _installed
    if threading.current_thread() is not threading.main_thread():
        return
    _installed = True
    if signal.getsignal(signal.SIGCONT) is signal.SIG_DFL:
        signal.signal(signal.SIGCONT, _continued)
