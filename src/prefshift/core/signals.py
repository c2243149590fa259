"""Signals that end a command, turned into exceptions so that its cleanups run.

SIGTERM's and SIGHUP's default action ends a process at once: no `finally`, no `except`, so an
MLflow run stays RUNNING for good and a sweep leaves its tasks' process groups running. Inside
`signals_as_exceptions` they raise `Terminated` in the main thread instead, as Ctrl-C raises
KeyboardInterrupt; the code that catches it ends what it started and then exits with
`exit_code`, the status the signal's default action would have given (128 + its number).

A signal the process was started with ignored stays ignored: `nohup prefshift sweep ... &` asks
that closing the terminal (SIGHUP) not stop it, and a handler would undo that, as Python itself
leaves an ignored SIGINT alone.

A stop that lands in a finalizer (`__del__`, a weakref callback) or an exit handler is discarded
by Python, which prints "Exception ignored" and runs on. `heed_discarded_stops` sends it again
once that cleanup is over, and keeps it for the exit status.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

TERMINATING = (signal.SIGTERM, signal.SIGHUP)


class Terminated(BaseException):
    """SIGTERM or SIGHUP delivered to the main thread; a BaseException, so no `except Exception`
    swallows it."""

    def __init__(self, signum: int):
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum


def stop_signal(error: BaseException) -> int | None:
    """The signal number behind a stop from outside (Terminated, Ctrl-C), else None."""
    if isinstance(error, Terminated):
        return error.signum
    return signal.SIGINT if isinstance(error, KeyboardInterrupt) else None


def exit_code(signum: int) -> int:
    return 128 + signum


REDELIVERY_DELAY_S = 0.05
"""How long a discarded stop waits before it is sent again: the discarding cleanup has ended by then."""
_latches: list[list[int]] = []  # each open signals_as_exceptions' signals raised, innermost last
_discarded: list[int] = []


def heed_discarded_stops() -> None:
    """Make a stop that Python discards take effect (the CLI installs this first).

    Python runs signal handlers between bytecodes, so Ctrl-C can raise KeyboardInterrupt inside a
    finalizer or an exit handler, where Python discards any exception. The command then ran on
    and exited 0 (once in nine Ctrl-Cs of `prefshift sweep collect`, 2026-12-06). This hook prints one
    line in place of the discarded traceback, sends the signal again from a helper thread (the main
    thread raises it once the cleanup is over), and keeps it for `discarded_stop`.
    """
    if getattr(sys.unraisablehook, "heeds_stops", False):
        return
    previous = sys.unraisablehook

    def hook(unraisable: Any) -> None:
        if unraisable.exc_value is None or (signum := stop_signal(unraisable.exc_value)) is None:
            return previous(unraisable)
        _discarded.append(signum)
        if _latches:  # the innermost body never saw its stop: the one sent again must raise
            _latches[-1].clear()
        name = signal.Signals(signum).name
        with contextlib.suppress(OSError, ValueError):  # no reader left: the stop matters, not the line
            print(f"prefshift: {name} came during a cleanup, which Python does not interrupt; it stops "
                  "the command once that cleanup ends", file=sys.stderr)  # fmt: skip
        again = threading.Timer(REDELIVERY_DELAY_S, signal.raise_signal, (signum,))
        again.daemon = True
        with contextlib.suppress(RuntimeError):  # the interpreter is shutting down: it is ending anyway
            again.start()

    hook.heeds_stops = True  # type: ignore[attr-defined]
    sys.unraisablehook = hook


def discarded_stop() -> int | None:
    """The first stop Python discarded, if any: a command that then ran on to its end does not
    exit 0, since it was asked to stop."""
    return _discarded[0] if _discarded else None


@contextmanager
def signals_as_exceptions() -> Iterator[None]:
    """While the body runs, SIGTERM/SIGHUP raise `Terminated` in the main thread, unless ignored.

    A second signal during the cleanup is ignored, so the cleanup itself is not cut short.
    Outside the main thread Python cannot install handlers and the defaults stay.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    raised: list[int] = []

    def handler(signum: int, _frame: Any) -> None:
        if not raised:
            raised.append(signum)
            raise Terminated(signum)

    heeded = [signum for signum in TERMINATING if signal.getsignal(signum) != signal.SIG_IGN]
    previous = {signum: signal.signal(signum, handler) for signum in heeded}
    _latches.append(raised)
    try:
        yield
    finally:
        _latches[:] = [latch for latch in _latches if latch is not raised]
        for signum, action in previous.items():
            signal.signal(signum, action)


@contextmanager
def signals_ignored() -> Iterator[None]:
    """Ctrl-C, SIGTERM and SIGHUP ignored while the body cleans up after one of them."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    stops = (signal.SIGINT, *TERMINATING)
    previous = {signum: signal.signal(signum, signal.SIG_IGN) for signum in stops}
    try:
        yield
    finally:
        for signum, action in previous.items():
            signal.signal(signum, action)
