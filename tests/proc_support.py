"""What /proc says of the processes on this machine: a test may read it; prefshift does not."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path


def processes() -> Iterator[tuple[int, str, int, int]]:
    """(pid, state, parent pid, process group) of each process, read from /proc/<pid>/stat."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # ended meanwhile
            continue
        state, ppid, pgid = stat[stat.rindex(")") + 2 :].split()[:3]
        yield int(entry.name), state, int(ppid), int(pgid)
