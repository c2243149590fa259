"""Scratch directories prefshift can prove it made, and the only things it ever removes or renames.

Every output is written into a scratch directory beside it, then renamed into place, so a kill
never leaves half an output under the final name. What a kill leaves instead is the scratch
directory, and a later run may clean it up or finish its rename. A user's directory that only
looks like one (`.r.jsonl.ABCDEFGH.tmp/`, `.rm.old/`) must never be taken for it, so ownership
is proven by a record, never inferred from a name:

- A scratch directory is made by `mkdtemp` (an exclusive `mkdir`, mode 0700). The first thing
  written in it, with `O_EXCL`, is its record (`scratch.json`): the target it is for, and the
  directory's own device and inode numbers. Its writer holds an `flock` on the directory until
  it is done; the kernel drops it when the writer exits, however it exits.
- A later run treats a directory whose name looks like scratch only as a candidate. It is
  prefshift's when it is a real directory (not a link), owned by this user, holding a regular
  record file that names this target and this very directory: a copy, a restore from a backup,
  a renamed directory or a user's directory with a record copied in carry other numbers. A
  candidate that a live writer still locks is left to it. Anything else is never touched.
- Replacing a directory takes two renames. Before the first, a swap record (`swap.json`) in the
  scratch writes down the inode numbers of the directory being replaced and of the new one, and
  the old directory moves into the scratch (`old/`), never to a name beside the target that a
  user's directory could hold. A run that finds an interrupted swap finishes it only where every
  inode still matches the record; where anything differs, it leaves everything as it is.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import json
import os
import shutil
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RECORD = "scratch.json"
SWAP = "swap.json"
NEW = "new"
OLD = "old"
_MAX_RECORD_BYTES = 4096
_MARK = "prefshift scratch v1"


@dataclass
class Scratch:
    """A scratch directory this process made or has proven its own, locked while it is held."""

    root: Path
    target: Path
    directory: bool
    fd: int | None

    @property
    def staged(self) -> Path:
        """The new output: a directory output itself, or the folder that holds a file output."""
        return self.root / NEW

    @property
    def work(self) -> Path:
        """Where the writer writes: the staged directory, or the file under the target's own name
        (so a writer that picks a format by suffix, as matplotlib does, sees the real one)."""
        return self.staged if self.directory else self.staged / self.target.name

    def commit(self) -> None:
        """Put the staged output in place of the target (a file in one rename; a directory in two,
        recorded first); the scratch is removed after."""
        if self.directory:
            self._swap()
        else:
            replace_file(self.work, self.target)
        self.discard()

    def _swap(self) -> None:
        try:
            old = os.lstat(self.target)
        except FileNotFoundError:
            os.rename(self.staged, self.target)
            return
        new = os.lstat(self.staged)
        _write_new(self.root / SWAP, {"old": _identity(old), "new": _identity(new)})
        os.rename(self.target, self.root / OLD)
        os.rename(self.staged, self.target)

    def finish(self) -> bool:
        """Complete a swap that was recorded but interrupted; True once the target is the new
        directory. Every inode must match the record: otherwise nothing is touched."""
        swap = _read_json(self.root / SWAP)
        if not isinstance(swap, dict):
            return False
        at_target, staged, old = (_identity_at(p) for p in (self.target, self.staged, self.root / OLD))
        if at_target == swap.get("new"):
            return True
        if staged != swap.get("new"):
            return False
        if at_target == swap.get("old") and old is None:
            os.rename(self.target, self.root / OLD)
        elif not (at_target is None and old == swap.get("old")):
            return False
        os.rename(self.staged, self.target)
        return True

    def swap_begun(self) -> bool:
        return os.path.lexists(self.root / SWAP)

    def close(self) -> None:
        """Leave nothing behind: an interrupted swap is finished (the new directory was complete),
        anything else discarded. A swap that cannot be finished keeps its scratch for recovery."""
        if self.swap_begun() and not self.finish():
            self.release()
            return
        self.discard()

    def discard(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
        self.release()

    def release(self) -> None:
        """Unlock it (a later run may then claim it); the directory stays."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def create(target: Path, directory: bool) -> Scratch:
    """A new scratch directory beside `target`, recorded and locked."""
    root = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    scratch = Scratch(root, target, directory, None)
    try:
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
        scratch.fd = os.open(root / RECORD, flags, 0o600)
        with contextlib.suppress(OSError):  # no locks here (some network file systems): never claimed
            fcntl.flock(scratch.fd, fcntl.LOCK_EX)
        os.write(scratch.fd, json.dumps(_record(target, directory, os.lstat(root)), sort_keys=True).encode())
        os.mkdir(scratch.staged, 0o700)
    except BaseException:
        scratch.discard()
        raise
    return scratch


def claim(candidate: Path, target: Path) -> Scratch | None:
    """The scratch at `candidate` if its record proves prefshift made it for `target` and no live
    writer holds it; else None, and nothing was changed.

    The lock is on the record file, held open by its writer: an `flock` on a file opened for
    writing works on network file systems too, where one on a directory may not.
    """
    if os.path.abspath(candidate.parent) != os.path.abspath(target.parent):
        return None
    try:
        folder = os.open(candidate, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return None
    fd = None
    try:
        info = os.fstat(folder)
        if not stat.S_ISREG(os.stat(RECORD, dir_fd=folder, follow_symlinks=False).st_mode):
            raise OSError("its record is not a regular file")  # never opened: a device's open acts
        fd = os.open(RECORD, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=folder)
        record = _read_record(fd)
        if (
            info.st_uid != os.geteuid()
            or not isinstance(record, dict)
            or not isinstance(record.get("directory"), bool)
            or record != _record(target, record["directory"], info)
        ):
            raise OSError("not a scratch directory of prefshift's")
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a live writer holds it: its own to finish
    except OSError:
        if fd is not None:
            os.close(fd)
        return None
    finally:
        os.close(folder)
    return Scratch(candidate, target, record["directory"], fd)


def candidates(target: Path) -> list[Path]:
    """Names a scratch of `target` could have: only candidates, each still to be proven by `claim`."""
    return sorted(target.parent.glob(f".{glob.escape(target.name)}.{'?' * 8}.tmp"))


def leftovers(target: Path) -> list[Scratch]:
    """The scratch directories of `target` that a writer which is gone left behind."""
    return [s for s in map(lambda c: claim(c, target), candidates(target)) if s is not None]


def replace_file(source: Path, target: Path) -> None:
    """Rename `source` over `target`; a regular file replaced keeps its mode, and its owner where
    this process may set it (root), so replacing never widens who can read it."""
    try:
        old = os.lstat(target)
    except FileNotFoundError:
        old = None
    if old is not None and stat.S_ISREG(old.st_mode):
        os.chmod(source, old.st_mode & 0o777)  # permissions only: never a set-id bit on new content
        if os.geteuid() == 0 and (old.st_uid, old.st_gid) != (os.geteuid(), os.getegid()):
            os.chown(source, old.st_uid, old.st_gid)
    os.replace(source, target)


def _record(target: Path, directory: bool, info: os.stat_result) -> dict[str, Any]:
    return {"mark": _MARK, "target": target.name, "directory": directory, "at": _identity(info)}


def _identity(info: os.stat_result) -> list[int]:
    return [info.st_dev, info.st_ino]


def _identity_at(path: Path) -> list[int] | None:
    try:
        return _identity(os.lstat(path))
    except FileNotFoundError:
        return None


def _write_new(path: Path, payload: dict[str, Any]) -> None:
    """Write a record that did not exist before (`O_EXCL`: never over anything)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump(payload, handle, sort_keys=True)


def _read_json(path: Path) -> Any:
    """A small regular file's JSON (a link, a device or a large file reads as None)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        return _read_record(fd)
    finally:
        os.close(fd)


def _read_record(fd: int) -> Any:
    """The JSON of the small regular file open at `fd`, from its start; None if it is anything else."""
    with contextlib.suppress(OSError, ValueError, RecursionError):
        if stat.S_ISREG(os.fstat(fd).st_mode):
            data = os.pread(fd, _MAX_RECORD_BYTES + 1, 0)
            return json.loads(data) if len(data) <= _MAX_RECORD_BYTES else None
    return None
