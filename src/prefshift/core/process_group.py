"""Ending a process group, and knowing it has ended.

A process sent SIGKILL still finishes the system call it is in (a mkdir, a rename, a write) before
it dies, and a loaded machine may not run it for a while. So a directory its group was working in
is removed only once no process of the group is left: removed at the moment of the signal, it can
gain an entry after, and the removal then leaves it behind (a bench clone survived a SIGTERM'd
`prefshift bench --pipeline-only` that way, under the test suite's load).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import time
from collections.abc import Collection

PR_SET_CHILD_SUBREAPER = 36


def adopt_orphans() -> None:
    """Make this process the reaper of its descendants' orphans (Linux; elsewhere a no-op).

    An orphan goes to the nearest subreaper, else to PID 1; a container's init may never reap it,
    and a zombie still counts as a member of its group, so `group_alive` would wait on it forever.
    """
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def reap_adopted(children: Collection[int]) -> None:
    """Reap every ended child but `children` (whose exit status their Popen reads): the orphans an
    adopting process inherits from outside the groups it ends, such as the daemons each dvc command
    leaves. Unreaped, each stays a zombie until the adopter exits (two or more per sweep point)."""
    while True:
        try:
            ended = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return
        if ended is None or ended.si_pid in children:
            return  # a child of `children` first in line: the rest wait for the next call
        with contextlib.suppress(ChildProcessError):
            os.waitpid(ended.si_pid, 0)


def group_alive(pgid: int) -> bool:
    """Whether a process of the group still runs, once the zombies this process may reap are reaped."""
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-pgid, os.WNOHANG)[0] > 0:
            pass
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def kill_group(pgid: int, timeout_s: float = 10.0) -> bool:
    """SIGKILL every process of the group, then wait (at most `timeout_s`) until none is left.
    Whether the group ended in time."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
    deadline = time.monotonic() + timeout_s
    while group_alive(pgid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True
