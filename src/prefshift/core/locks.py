"""Writer locks on output paths: one process at a time writes a model, a score set, a metrics file.

Two writers of one output (two `prefshift train --method naive` started at once) would share
its checkpoint directory and interleave their renames; one such run left a checkpoint holding
only the weights and the optimizer. A writer takes an exclusive lock per output path and a
second one fails at once, naming the path and the process that holds it, so it can wait for it
or stop it.

The lock files live in `<root>/.prefshift/locks/`, mirroring the output's path: never inside an
output, because DVC deletes and restores outputs whole and `dvc status` would see a stray file.
They are `flock` locks, which the kernel drops when their holder exits however it exits (even
SIGKILL), so a crash never leaves a stale lock to clean up. A process may take a lock it already
holds (a stage's lock, then its output set's); it is released when the outermost holder leaves.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import stat
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from pathlib import Path

from prefshift.core.atomic import WriteFailed
from prefshift.core.errors import PrefshiftError, os_error_cause
from prefshift.core.reading import special_kind

PRIVATE = ".prefshift"
LOCKS = Path(PRIVATE) / "locks"
PROBE_GRACE_S = 2.0
"""How long a `take` that others may probe (`held`) waits out a probe's shared lock: a probe holds it
for microseconds, a probe descheduled on a loaded machine for longer."""
UNLOCKABLE = (errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP)
"""What `take` raises where the filesystem takes no flock (a cluster's NFS mounted without locks)."""
_HELD: dict[Path, list[int]] = {}
"""Lock file → [its descriptor, how many nested holders in this process] (flock is per open file)."""


class LockedError(PrefshiftError):
    """An output that another process is writing."""


def private_dir(root: str | Path) -> Path:
    """`<root>/.prefshift`, created with a `.gitignore` of its own: prefshift's bookkeeping
    (commit journals, locks, the offline tracking database) is never versioned."""
    directory = Path(root) / PRIVATE
    if os.path.lexists(directory) and not directory.is_dir():
        raise PrefshiftError(
            f"{directory}: not a folder; prefshift keeps its bookkeeping there (locks, sweeps, the "
            "offline tracking database): move it away"
        )
    directory.mkdir(parents=True, exist_ok=True)
    ignore = directory / ".gitignore"
    if not os.path.lexists(ignore):  # a link there, even a dangling one, is the user's
        ignore.write_text("*\n", encoding="utf-8")
    return directory


def lock_file(root: str | Path, output: str | Path) -> Path:
    """Where the lock of `output` lives: its path below the root, or its absolute path outside it."""
    root, output = Path(root).resolve(), Path(output).resolve()
    relative = output.relative_to(root) if output.is_relative_to(root) else Path("abs", *output.parts[1:])
    return root / LOCKS / relative.parent / f"{relative.name}.lock"


def holder(path: Path) -> str:
    """Who holds lock file `path`, as its holder wrote itself into it."""
    try:
        entry = json.loads(path.read_text(encoding="utf-8"))
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(entry["since"]))
        return f"process {entry['pid']} (`{entry['command']}`, since {started})"
    except (OSError, ValueError, KeyError, TypeError):  # written just after the lock is taken
        return "another process"


def take(path: Path, command: str, refusal: Callable[[str], str], patience_s: float = 0.0) -> int:
    """An open descriptor of lock file `path` holding its exclusive flock, with this process (running
    `command`) written into it; closing it releases the lock. A lock another process keeps past
    `patience_s` raises LockedError(refusal(who holds it))."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = _open_lock_file(path)
    deadline = time.monotonic() + patience_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() >= deadline:
                os.close(fd)
                raise LockedError(refusal(holder(path))) from None
            time.sleep(0.05)
    try:  # a full disk fails the write: the descriptor, and with it the lock, goes too
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps({"pid": os.getpid(), "command": command, "since": time.time()}).encode())
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_lock_file(path: Path) -> int:
    """Lock file `path` opened for `take` to lock and rewrite, never through a link (a link there had
    a stage rewrite the file it named) nor into anything but a regular file (non-blocking: a FIFO
    does not wait for a reader before it is refused)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
    except OSError as err:
        if err.errno != errno.ELOOP:
            raise
        kind = "link"
    else:
        if stat.S_ISREG(mode := os.fstat(fd).st_mode):
            return fd
        os.close(fd)
        kind = special_kind(mode)
    raise PrefshiftError(f"{path}: a {kind}, where prefshift keeps a lock file it rewrites; move it away")


def held(path: Path) -> bool:
    """Whether a process (this one included) holds lock file `path`: a process's liveness that
    neither a reused pid nor a changed clock can fake. Probed with a shared lock released at once,
    so a `take` with a little patience never fails for a probe."""
    try:  # a link is no lock of prefshift's (`take` refuses one), and a FIFO is not waited on
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as err:
        if err.errno in (errno.ENOENT, errno.ELOOP):
            return False
        raise
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # releases the probe's shared lock
    return False


@contextmanager
def handed_down(fd: int) -> Iterator[None]:
    """Make lock descriptor `fd` this process's standard input while inside, so that every process
    started meanwhile inherits it, and their children theirs: the lock is then held until the last
    of them ends, however the first one ends. Subprocesses close every other inherited descriptor
    by default (DVC's stage runner does), but stdin they hand on. The old stdin comes back after."""
    saved = os.dup(0)
    try:
        os.dup2(fd, 0)  # dup2 leaves fd 0 inheritable, where `fd` itself is close-on-exec
        yield
    finally:
        os.dup2(saved, 0)
        os.close(saved)


@contextmanager
def _hold_one(root: Path, output: Path, command: str) -> Iterator[None]:
    path = lock_file(root, output)
    if path not in _HELD:
        _HELD[path] = [_acquire(root, path, output, command), 0]
    _HELD[path][1] += 1
    try:
        yield
    finally:
        _HELD[path][1] -= 1
        if not _HELD[path][1]:
            os.close(_HELD.pop(path)[0])  # closing the only descriptor releases the flock


def _acquire(root: Path, path: Path, output: Path, command: str) -> int:
    """An open descriptor of `path` holding its exclusive flock, with this writer recorded in it.

    The lock lives on the output's own disk, so a full or read-only disk fails here first: that is
    reported as a failure to write the output, which is what it will be."""
    try:
        return _locked_descriptor(root, path, output, command)
    except OSError as err:
        raise WriteFailed([output], os_error_cause(err)) from None


def _locked_descriptor(root: Path, path: Path, output: Path, command: str) -> int:
    private_dir(root)
    return take(
        path,
        command,
        lambda holder: (
            f"{output} is being written by {holder}; wait for it to finish (or stop it), "
            f"then run `{command}` again. The lock ({path}) goes away with its process."
        ),
    )


@contextmanager
def hold(root: str | Path, outputs: Sequence[str | Path], command: str | None = None) -> Iterator[None]:
    """Hold the writer lock of every path in `outputs` for the body; fail at once if one is taken.

    `command` names the writer in the message a second writer gets (default: this command line).
    """
    command = command or " ".join(Path(a).name if i == 0 else a for i, a in enumerate(sys.argv))
    with ExitStack() as stack:
        for output in sorted({Path(o).resolve() for o in outputs}):  # one order: no deadlock
            stack.enter_context(_hold_one(Path(root).resolve(), output, command))
        yield


def hold_in_main_process(
    root: str | Path, outputs: Sequence[str | Path], command: str
) -> AbstractContextManager[None]:
    """`hold`, taken by the main process of a multi-process launch only: the other processes write
    nothing (see prefshift.pipeline.fit.fit), and would otherwise find the main one's lock taken."""
    from prefshift.core.host import process_state

    return hold(root, outputs, command) if process_state().is_main_process else nullcontext()
