"""Atomic outputs: write beside the target, rename on success; and the one rule for what may be replaced.

A stage killed half-way must never leave a file or directory that the next
stage or DVC would accept as complete, so every output goes through here.

The rename replaces whatever the target path names, so before it happens the target
must be something prefshift may replace: nothing yet, a regular file (a directory, for
directory outputs). A symlink, a device, a FIFO or a socket is never replaced, nor is a
directory where a file belongs: renaming over `/dev/stdout` as root, or over a link to
the user's data, would destroy what prefshift does not own. Nor is another user's file, unless
the user said `--force`. The scratch beside the target is removed or renamed only where
prefshift's own record proves it made it (`prefshift.core.scratch`). Commands call
`check_output` before their work starts, so an output that cannot be written (its own
input, read-only, full, a directory) fails in a second, not after an hour of scoring;
`atomic_path` applies the same rule again at the moment of writing, and turns a write
that fails (no space, read-only) into one line naming the output.
"""

from __future__ import annotations

import errno
import json
import os
import pwd
import stat
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from prefshift.core import scratch
from prefshift.core.errors import PrefshiftError, os_error_cause
from prefshift.core.reading import special_kind

STDOUT = "-"
# Write failures that carry no file name: the write() itself failed, so they are about the output.
_WRITE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO, errno.EFBIG, errno.EACCES, errno.EPERM}


class OutputError(PrefshiftError):
    """An output path that prefshift must not or cannot write; the message names it and says why."""


@contextmanager
def atomic_path(target: str | Path, directory: bool = False, force: bool = False) -> Iterator[Path]:
    """Yield a path in a new scratch directory beside `target`; on success it replaces `target`.

    `force`: the caller's user said `--force`, so another user's file may be replaced (see
    `refuse_unowned`). Scratch that a killed writer of `target` left is cleaned up first, but only
    scratch that prefshift's own record proves it made (`prefshift.core.scratch`).
    """
    target = Path(target)
    refuse_unowned(target, directory, force)
    with output_errors([target]):
        target.parent.mkdir(parents=True, exist_ok=True)
        clear_stale(target)
        made = scratch.create(target, directory)
        try:
            yield made.work
            refuse_unowned(target, directory, force)  # again: the path may have changed while the work ran
            made.commit()
        finally:
            made.close()


class WriteFailed(OutputError):
    """Writing an output failed (no space, read-only, ...); names the output, never a scratch path."""

    def __init__(self, targets: Sequence[Path], cause: str):
        super().__init__(f"{', '.join(map(str, targets))}: cannot write the output ({cause})")
        self.targets, self.cause = list(targets), cause


@contextmanager
def output_errors(targets: Sequence[Path]) -> Iterator[None]:
    """An OSError in writing `targets` becomes a WriteFailed naming the output, not a scratch path.

    An error is about an output when it names the output, a folder above it or the hidden
    scratch copy beside it, or when it names no file and is a write failure (no space,
    read-only): `write()` reports those without a path. Errors about other files (an input
    read while writing) pass through unchanged, and the CLI names their own path. A
    WriteFailed from a file written inside a scratch copy (a stage's output set) is named
    after the final output too.
    """
    try:
        yield
    except WriteFailed as err:
        about = [target for target in targets if any(_concerns(inner, target) for inner in err.targets)]
        if not about:
            raise
        raise WriteFailed(about, err.cause) from None
    except OSError as err:
        if err.filename is None:
            about = list(targets) if err.errno in _WRITE_ERRNOS else []
        else:  # a failed copy or rename names two paths: the output may be either
            named = [Path(os.fsdecode(name)) for name in (err.filename, err.filename2) if name is not None]
            about = [target for target in targets if any(_concerns(path, target) for path in named)]
        if not about:
            raise
        raise WriteFailed(about, os_error_cause(err)) from None


def _concerns(path: Path, target: Path) -> bool:
    """`path` is `target`, a folder above it, or inside the hidden scratch copy beside it."""
    named, mine = path.absolute(), target.absolute()
    scratch_prefix = f".{mine.name}."
    return mine.is_relative_to(named) or any(
        part.parent == mine.parent and part.name.startswith(scratch_prefix)
        for part in (named, *named.parents)
    )


def refuse_unowned(target: str | Path, directory: bool = False, force: bool = False) -> None:
    """Raise unless `target` is absent or is what prefshift may replace: a regular file (or a
    directory) of this user's, or, with `force`, of another user's.

    `lstat`, not `stat`: a symlink is judged as the link, never as what it points to. Another
    user's file is theirs: replacing it (root can) would hand it to this user with this user's
    mode, so it takes `--force`, and then the file keeps its mode and owner (`scratch.replace_file`).
    """
    target = Path(target)
    try:
        info = target.lstat()
    except FileNotFoundError:
        return
    except OSError as err:
        raise OutputError(f"{target}: cannot use this output path ({os_error_cause(err)})") from None
    mode = info.st_mode
    if stat.S_ISLNK(mode):
        raise OutputError(
            f"{target}: is a symbolic link (to {os.readlink(target)}); prefshift replaces only files it "
            "writes, never a link or what it points to. Remove the link or choose another path (for a DVC "
            f"output checked out as a link, `dvc unprotect {target}` turns it into a copy; for standard "
            "output, `--out -` where a command offers it)"
        )
    if stat.S_ISDIR(mode) and not directory:
        raise OutputError(f"{target}: is a directory; name a file to write, e.g. {target / 'out.jsonl'}")
    if stat.S_ISREG(mode) and directory:
        raise OutputError(
            f"{target}: is a file, and a directory is written here; remove it or choose another path"
        )
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        raise OutputError(
            f"{target}: is a {special_kind(mode)}, not a regular file; prefshift never writes over one. "
            "Choose a file path (for standard output, `--out -` where a command offers it)"
        )
    if info.st_uid != os.geteuid() and not force:
        kind = "directory" if stat.S_ISDIR(mode) else "file"
        raise OutputError(
            f"{target}: belongs to {_user(info.st_uid)}, not to you; prefshift replaces another user's "
            f"{kind} only with --force (it then keeps its mode and, run as root, its owner). Pass --force "
            "where the command offers it, or choose another path"
        )


def _user(uid: int) -> str:
    try:
        return f"user {pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def check_output(
    target: str | Path, directory: bool = False, inputs: Iterable[str | Path] = (), force: bool = False
) -> Path:
    """What every command does with an output path before its work starts; returns the path.

    Refused: what `refuse_unowned` refuses; a path that is one of `inputs` (the same path,
    the same file under another name, or a path inside an input directory), which the
    rename would destroy; and a place that cannot be written now (read-only, no permission,
    no free space).
    """
    target = Path(target).expanduser()
    refuse_unowned(target, directory, force)
    for source in inputs:
        if _same_place(target, Path(source).expanduser()):
            raise OutputError(
                f"{target}: is also an input of this command ({source}); writing there would replace it. "
                "Choose another output path"
            )
    _check_writable(target, directory)
    return target


def _same_place(target: Path, source: Path) -> bool:
    if not source.exists():
        return False
    if target.exists() and os.path.samefile(target, source):
        return True
    resolved, origin = target.resolve(), source.resolve()
    return resolved == origin or (origin.is_dir() and resolved.is_relative_to(origin))


def _check_writable(target: Path, directory: bool) -> None:
    """The nearest existing folder of `target` takes a new file: writable, on a writable, non-full disk."""
    place = target if directory and target.is_dir() else target.parent
    place = place.absolute()
    while not place.exists():
        place = place.parent
    if not place.is_dir():
        raise OutputError(f"{target}: {place} is a file, not a directory; choose another output path")
    status = os.statvfs(place)
    if status.f_flag & os.ST_RDONLY:
        problem = f"{place} is on a read-only file system; use a writable path"
    elif not os.access(place, os.W_OK | os.X_OK):
        problem = f"no permission to write in {place}; check its permissions, or use another path"
    elif (status.f_bfree if os.geteuid() == 0 else status.f_bavail) == 0:
        problem = f"no space left on the file system holding {place}; free some space, then run again"
    else:
        return
    raise OutputError(f"{target}: cannot write the output ({problem})")


def recover_interrupted_swap(target: str | Path) -> None:
    """Finish a directory swap of `target` that a kill interrupted between its two renames.

    Readers such as a resumed run call this before looking for `target`. Only a swap that
    prefshift recorded, in scratch it proves it made, is finished (`prefshift.core.scratch`);
    a directory that merely has a name like a backup's is never touched.
    """
    target = Path(target)
    for left in scratch.leftovers(target):
        if left.swap_begun():
            left.close()
        else:
            left.release()


def clear_stale(target: Path) -> None:
    """Finish or remove the scratch a killed writer of `target` left, and nothing else.

    Inside a directory output it would otherwise be committed with it by a later `dvc
    commit`. A scratch that a live writer still holds is its own; a directory that only has a
    scratch-like name is the user's.
    """
    for left in scratch.leftovers(target):
        left.close()


def write_json(target: str | Path, payload: Any) -> None:
    """Stable JSON (sorted keys, fixed float repr) so identical runs give identical bytes."""
    with atomic_path(target) as tmp:
        tmp.write_text(
            json.dumps(payload, indent=2, sort_keys=True, allow_nan=False) + "\n", encoding="utf-8"
        )


def write_text(target: str | Path, text: str, force: bool = False) -> None:
    with atomic_path(target, force=force) as tmp:
        tmp.write_text(text, encoding="utf-8")
