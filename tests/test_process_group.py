"""A process group is ended whole before the directory it works in is removed (core.process_group)."""

from __future__ import annotations

import os
import shutil
import subprocess
import time

from prefshift.core.process_group import adopt_orphans, group_alive, kill_group


def test_a_killed_group_is_gone_before_its_directory_is_removed(tmp_path):
    """Three writers, two of them orphaned by their parent's death, keep creating entries; once
    kill_group returns, none of them is left, orphans included, and the directory goes whole."""
    adopt_orphans()
    work = tmp_path / "work"
    work.mkdir()
    writer = "while :; do mkdir -p d$RANDOM; touch f$RANDOM; done"
    proc = subprocess.Popen(
        ["bash", "-c", f"({writer}) & ({writer}) & {writer}"], cwd=work, start_new_session=True
    )
    deadline = time.monotonic() + 30
    while len(os.listdir(work)) < 20 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert group_alive(proc.pid)
    assert kill_group(proc.pid)
    proc.wait()
    assert not group_alive(proc.pid)
    shutil.rmtree(work)  # raises if a writer adds an entry while it removes
    assert not work.exists()


def test_kill_group_of_an_ended_group_returns_at_once():
    proc = subprocess.Popen(["true"], start_new_session=True)
    proc.wait()
    start = time.monotonic()
    assert kill_group(proc.pid)
    assert time.monotonic() - start < 1
