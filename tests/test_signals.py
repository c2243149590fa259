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


DISCARDED = """
import os, signal, sys, time
from prefshift.core.signals import Terminated, discarded_stop, heed_discarded_stops, signals_as_exceptions
signum = int(sys.argv[1])
heed_discarded_stops()


class Cleanup:
    def __del__(self):  # the stop comes while a finalizer runs: Python discards what it raises here
        os.kill(os.getpid(), signum)
        time.sleep(5)


start = time.monotonic()
try:
    with signals_as_exceptions():
        Cleanup()  # no reference kept: its finalizer runs at once
        while time.monotonic() - start < 60:
            time.sleep(0.01)
    print("ran on")
except (KeyboardInterrupt, Terminated) as stop:
    print(f"stopped by {type(stop).__name__} after {time.monotonic() - start:.1f} s, kept {discarded_stop()}")
"""


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_stop_python_discards_in_a_finalizer_is_raised_once_the_finalizer_ends(signum):
    """Without the hook the discarded stop is lost: the body runs on for its 60 s, then 'ran on'."""
    done = subprocess.run(
        [sys.executable, "-c", DISCARDED, str(int(signum))],
        capture_output=True, text=True, timeout=120, preexec_fn=default_stops,
    )  # fmt: skip
    kind = "KeyboardInterrupt" if signum == signal.SIGINT else "Terminated"
    assert done.stdout.startswith(f"stopped by {kind} after "), done.stdout + done.stderr
    assert float(done.stdout.split()[4]) < 30 and done.stdout.split()[-1] == str(int(signum))
    assert "Exception ignored" not in done.stderr, done.stderr
    assert f"{signal.Signals(signum).name} came during a cleanup" in done.stderr


AT_EXIT = """
import atexit, os, signal, sys, time
from prefshift.cli import main

def flush_something():  # an exit handler that Ctrl-C reaches
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(5)

atexit.register(flush_something)
sys.argv = ["prefshift", "--help"]
main()
"""


def test_a_command_stopped_in_an_exit_handler_exits_with_the_stop_s_status_not_0():
    """`prefshift` ends through its exit handlers; Python discards a Ctrl-C there, and the command
    exited 0 with a traceback. Now: one line, and 130."""
    done = subprocess.run(
        [sys.executable, "-c", AT_EXIT], capture_output=True, text=True, timeout=120, preexec_fn=default_stops
    )
    assert done.returncode == exit_code(signal.SIGINT), (done.returncode, done.stderr)
    assert "Usage" in done.stdout and "Traceback" not in done.stderr, done.stderr
    assert "SIGINT came during a cleanup" in done.stderr
