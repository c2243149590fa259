"""Signals that end a command, turned into exceptions so that its cleanups run.

SIGTERM's and SIGHUP's default action ends a process at once: no `finally`, no `except`, so an
MLflow run stays RUNNING for good and a sweep leaves its DVC queue running. Inside
`signals_as_exceptions` they raise `Terminated` in the main thread instead, as Ctrl-C raises
KeyboardInterrupt; the code that catches it ends what it started and then exits with
`exit_code`, the status the signal's default action would have given (128 + its number).

A signal the process was started with ignored stays ignored: `nohup prefshift sweep ... &` asks
that closing the terminal (SIGHUP) not stop it, and a handler would undo that, as Python itself
leaves an ignored SIGINT alone.
"""

from __future__ import annotations

import signal
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
    try:
        yield
    finally:
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
