"""The one base class for errors a user can fix, and the one wording of file-system failures.

The CLI prints a PrefshiftError without a traceback. An OSError that names a file is the
same kind of problem (a path that is missing, a directory, read-only, full) and is printed
the same way, through `file_error_message`, so every command says it in one line.
"""

from __future__ import annotations

import errno

JSON_TOO_DEEP = (
    "JSON nested too deeply to read (arrays or objects inside each other beyond Python's recursion "
    "limit); flatten it"
)

_WHAT_TO_DO = {
    errno.ENOENT: "check the path",
    errno.EISDIR: "name a file, not a directory",
    errno.ENOTDIR: "a part of the path is a file, not a directory",
    errno.EACCES: "check its permissions, or use another path",
    errno.EPERM: "check its permissions, or use another path",
    errno.EROFS: "the file system is mounted read-only: use a writable path",
    errno.ENOSPC: "the disk is full: free some space, then run again",
    errno.EDQUOT: "the disk quota is used up: free some space, then run again",
    errno.EFBIG: "the file grew past the file system's limit: use another file system",
}


class PrefshiftError(Exception):
    """An input, params or state problem; the message says what is wrong and what to do."""


def os_error_cause(err: OSError) -> str:
    """The cause of `err` in words and what to do: `no space left on device; the disk is full: …`."""
    cause = (err.strerror or str(err) or type(err).__name__).rstrip(".")
    cause = cause[:1].lower() + cause[1:]
    hint = _WHAT_TO_DO.get(err.errno)
    return f"{cause}; {hint}" if hint else cause


def file_error_message(err: OSError) -> str:
    """`<path>: <cause>` for an OSError that names its file (both paths for a failed rename)."""
    where = str(err.filename)
    if err.filename2 is not None:
        where = f"{where} -> {err.filename2}"
    return f"{where}: {os_error_cause(err)}"
