"""Atomic outputs: write beside the target, rename on success.

A stage killed half-way must never leave a file or directory that the next
stage or DVC would accept as complete, so every output goes through here.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


@contextmanager
def atomic_path(target: str | Path, directory: bool = False) -> Iterator[Path]:
    """Yield a temporary sibling path; on success it replaces `target` in one rename."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    clear_stale(target)
    if directory:
        recover_interrupted_swap(target)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    work = tmp if directory else tmp / target.name
    try:
        yield work
        if directory:
            swap_directory(tmp, target)
        else:
            os.replace(work, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def swap_directory(staged: Path, target: Path) -> None:
    """Replace directory `target` by `staged`: two renames, and `recover_interrupted_swap` covers the gap."""
    old = _swapped_out(target)
    if target.exists():
        shutil.rmtree(old, ignore_errors=True)
        target.rename(old)
    staged.rename(target)
    shutil.rmtree(old, ignore_errors=True)


def _swapped_out(target: Path) -> Path:
    return target.with_name(f".{target.name}.old")


def recover_interrupted_swap(target: str | Path) -> None:
    """Put back the previous complete directory if a kill landed between the two renames.

    Replacing a directory takes two renames (target → old, new → target); in between,
    only the old copy exists. It was complete, so restoring it loses nothing, and readers
    such as a resumed run call this before looking for `target`.
    """
    target = Path(target)
    old = _swapped_out(target)
    if old.is_dir() and not target.exists():
        old.rename(target)


def clear_stale(target: Path) -> None:
    """Remove temporaries that a killed writer of `target` left (mkdtemp names: 8 random characters).

    Inside a directory output they would otherwise be committed with it by a later
    `dvc commit`; one writer per target at a time is assumed, as for the rename itself.
    """
    for stale in target.parent.glob(f".{glob.escape(target.name)}.{'?' * 8}.tmp"):
        shutil.rmtree(stale, ignore_errors=True)


def write_json(target: str | Path, payload: Any) -> None:
    """Stable JSON (sorted keys, fixed float repr) so identical runs give identical bytes."""
    with atomic_path(target) as tmp:
        tmp.write_text(
            json.dumps(payload, indent=2, sort_keys=True, allow_nan=False) + "\n", encoding="utf-8"
        )


def write_text(target: str | Path, text: str) -> None:
    with atomic_path(target) as tmp:
        tmp.write_text(text, encoding="utf-8")
