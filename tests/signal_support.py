"""Children that a test stops with a signal start with the signal's default action.

A process inherits ignored signals: a test run started under `nohup` (as a CI script may be)
ignores SIGHUP in every child, and prefshift leaves a signal ignored that it starts with ignored
(core.signals). A test that expects SIGHUP or SIGTERM to stop its child restores the defaults first.
"""

from __future__ import annotations

import signal

STOPS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def default_stops() -> None:
    """`preexec_fn` for such a child: SIGINT, SIGTERM and SIGHUP at their default actions."""
    for signum in STOPS:
        signal.signal(signum, signal.SIG_DFL)
