"""How the `prefshift` process ends (cli.main): exit handlers run, streams flushed, the exit status
kept, a running thread waited for; then no interpreter teardown (a second per stage process)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120
    )


def _prefshift(*args: str) -> str:
    return f"import sys; sys.argv = ['prefshift', *{list(args)!r}]; from prefshift.cli import main; main()"


def test_exit_handlers_run_and_buffered_output_is_kept():
    done = _run(
        "import atexit, sys\n"
        "atexit.register(lambda: print('handler ran'))\n"
        "print('x' * 100_000, end='')  # a pipe's buffer full: lost if not flushed\n" + _prefshift("--help")
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("x" * 100_000)
    assert "Usage: prefshift" in done.stdout and done.stdout.rstrip().endswith("handler ran")


@pytest.mark.parametrize(
    ("args", "status", "says"),
    [
        (("train", "--method", "nope"), 2, "unknown method 'nope'"),
        (("no-such-command",), 2, "No such command"),
    ],
)
def test_the_exit_status_is_the_commands(args, status, says):
    done = _run(_prefshift(*args))
    assert done.returncode == status
    assert says in done.stderr


def test_a_message_exit_prints_it_and_fails():
    done = _run(
        "import sys\nimport prefshift.cli as cli\ncli.app = lambda: sys.exit('stopped: why')\ncli.main()"
    )
    assert done.returncode == 1
    assert done.stderr.strip() == "stopped: why"


def test_a_running_thread_is_waited_for():
    done = _run(
        "import threading, time\n"
        "threading.Thread(target=lambda: (time.sleep(0.5), print('thread finished', flush=True))).start()\n"
        + _prefshift("--help")
    )
    assert done.returncode == 0, done.stderr
    assert "thread finished" in done.stdout
