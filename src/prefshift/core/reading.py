"""What prefshift reads from a path a user names: a regular file, and no more of it than a bound.

A device (`/dev/zero`), a FIFO or a socket has no end, and a directory no text: read as a file,
the first fills memory or the disk it is copied to, and a FIFO blocks until someone writes. So
every user-named input (a params file, `score --input`, `bench --pipeline-params`) is opened
here, checked on the open descriptor (so it cannot be swapped between the check and the read),
and refused in one line naming the path when it is not a regular file or is larger than the
bound for its kind, the bound given in the message.
"""

from __future__ import annotations

import fcntl
import os
import stat
from typing import BinaryIO

from prefshift.core.errors import PrefshiftError, os_error_cause

MIB = 2**20


class InputFileError(PrefshiftError):
    """An input path that is not a regular file prefshift can read; the message names it."""


def special_kind(mode: int) -> str:
    """What a non-regular file is, in words: a device, a FIFO (named pipe), a socket."""
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "device"
    if stat.S_ISFIFO(mode):
        return "FIFO (named pipe)"
    if stat.S_ISDIR(mode):
        return "directory"
    return "socket" if stat.S_ISSOCK(mode) else "special file"


def open_regular(path: str | os.PathLike[str], what: str) -> BinaryIO:
    """`path` opened for reading in binary, once it is known to be a regular file (a link to one is).

    Opened non-blocking, so a FIFO does not wait for a writer before it can be refused.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        raise InputFileError(f"{path}: {what} not found; check the path") from None
    except OSError as err:
        raise InputFileError(f"{path}: cannot read the {what} ({os_error_cause(err)})") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise InputFileError(
            f"{path}: is a {special_kind(mode)}, not a regular file; prefshift reads a {what} only from a "
            "regular file (a device or a pipe may never end). Name a file"
        )
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    return os.fdopen(fd, "rb")


def read_regular(path: str | os.PathLike[str], what: str, max_bytes: int) -> bytes:
    """The bytes of regular file `path`, refused (naming the bound) when it holds more than `max_bytes`."""
    with open_regular(path, what) as handle:
        data = handle.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise InputFileError(
            f"{path}: larger than {max_bytes:,} bytes, the bound on a {what}; is it the right file?"
        )
    return data
