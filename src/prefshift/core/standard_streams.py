"""Standard streams a process was started without (`<&-`, `>&-`, `2>&-`) are opened on /dev/null.

A closed descriptor 0, 1 or 2 is the lowest free number, so the next file prefshift opened (an
output it writes, a lock) would take it, and every process it started would read that file as its
stdin or write its output into it. And Python sets `sys.stdout` (or stdin, stderr) to None for a
stream closed at start: every command then did its work and ended in a traceback, exit 1, as it
flushed stdout on its way out.
"""

from __future__ import annotations

import os
import sys

_STREAMS = ((0, "stdin", os.O_RDONLY, "r"), (1, "stdout", os.O_WRONLY, "w"), (2, "stderr", os.O_WRONLY, "w"))


def reopen_closed() -> None:
    """Open /dev/null on each of descriptors 0-2 that is closed, and give Python a stream for each
    it has none of. In order, so that the lowest free number is the one being filled."""
    for fd, name, flags, mode in _STREAMS:
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, flags)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
        if getattr(sys, name) is None:  # the stream lives as long as the process, as Python's own
            setattr(sys, name, open(fd, mode, encoding="utf-8", closefd=False))  # noqa: SIM115
