"""SIGTERM and SIGHUP become exceptions inside `signals_as_exceptions`, unless the process was
started with them ignored (`nohup`), which they then stay (core.signals)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from prefshift.core.signals import Terminated, exit_code, signals_as_exceptions
from signal_support import default_stops

WORKER = """
import sys, time
from prefshift.core.signals import Terminated, exit_code, signals_as_exceptions
try:
    with signals_as_exceptions():
        print("ready", flush=True)
        time.sleep(float(sys.argv[1]))
except Terminated as stop:
    print("cleaned up", flush=True)
    sys.exit(exit_code(stop.signum))
print("finished", flush=True)
"""


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_a_terminating_signal_raises_in_the_body_and_the_handlers_come_back(signum):
    inherited = signal.signal(signum, signal.SIG_DFL)  # a test run under nohup ignores SIGHUP
    try:
        with pytest.raises(Terminated) as stopped, signals_as_exceptions():
            os.kill(os.getpid(), signum)
            time.sleep(30)  # the handler raises as soon as the signal is delivered
        assert stopped.value.signum == signum and exit_code(signum) == 128 + signum
        assert signal.getsignal(signum) == signal.SIG_DFL
    finally:
        signal.signal(signum, inherited)


def test_a_signal_ignored_at_entry_stays_ignored():
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        with signals_as_exceptions():
            assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
            os.kill(os.getpid(), signal.SIGHUP)
        assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, previous)


def _start(seconds: float, *prefix: str) -> subprocess.Popen:
    proc = subprocess.Popen(
        [*prefix, sys.executable, "-c", WORKER, str(seconds)],
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=default_stops,  # then `nohup`, where given, ignores SIGHUP itself
    )
    assert proc.stdout.readline() == "ready\n"
    return proc


def test_nohup_keeps_a_command_through_the_terminal_closing_and_sigterm_still_stops_it():
    """`nohup prefshift sweep ... &` and a closed terminal: the shell resends SIGHUP to its jobs.
    With a handler in place of nohup's SIG_IGN, the sweep stopped its points there and then."""
    proc = _start(2, "nohup")
    proc.send_signal(signal.SIGHUP)
    assert proc.communicate(timeout=60)[0] == "finished\n" and proc.returncode == 0

    proc = _start(60, "nohup")
    proc.send_signal(signal.SIGTERM)
    assert proc.communicate(timeout=60)[0] == "cleaned up\n" and proc.returncode == 128 + signal.SIGTERM

    proc = _start(60)  # without nohup, SIGHUP stops it the way SIGTERM does
    proc.send_signal(signal.SIGHUP)
    assert proc.communicate(timeout=60)[0] == "cleaned up\n" and proc.returncode == 128 + signal.SIGHUP
