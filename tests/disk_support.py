"""Real small file systems for tests of full and read-only disks: a 64 KiB tmpfs, mounted per test.

Mounting needs root with CAP_SYS_ADMIN (as in the project's Docker image); elsewhere the
tests that need it are skipped with the reason.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def small_disk(tmp_path) -> Iterator[Path]:
    """A real 64 KiB file system, so a full disk and a read-only one need no mocks."""
    if shutil.which("mount") is None:
        pytest.skip("no mount command")
    where = tmp_path / "disk"
    where.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(where)], capture_output=True, text=True
    )
    if done.returncode != 0:
        pytest.skip(f"mounting a tmpfs is not permitted here ({done.stderr.strip() or 'mount failed'})")
    try:
        yield where
    finally:
        unmounted = subprocess.run(["umount", str(where)], capture_output=True, text=True)
        if unmounted.returncode != 0:  # something on it is still open: a leaked descriptor
            still_open = _open_under(where)
            subprocess.run(["umount", "--lazy", str(where)], check=False)
            pytest.fail(f"{where} could not be unmounted ({unmounted.stderr.strip()}); open: {still_open}")


def _open_under(where: Path) -> list[str]:
    """The files under `where` that this process holds open (its descriptors' targets)."""
    found = []
    for fd in Path("/proc/self/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith(f"{where}/"):
            found.append(target)
    return sorted(found)


def fill(disk: Path, leave: int = 0) -> None:
    """Write until the disk is full, then give back `leave` bytes."""
    filler = disk / "filler"
    with filler.open("wb", buffering=0) as handle:
        try:
            while True:
                handle.write(b"\0" * 4096)
        except OSError as err:
            assert err.errno == errno.ENOSPC
    if leave:
        os.truncate(filler, max(0, filler.stat().st_size - leave))


def read_only(disk: Path) -> None:
    done = subprocess.run(["mount", "-o", "remount,ro", str(disk)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"remounting read-only is not permitted here ({done.stderr.strip()})")
