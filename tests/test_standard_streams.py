"""A command started with its standard streams closed (`<&-`, `>&-`, `2>&-`, as some scripts and
supervisors start jobs) does its work and exits 0, and no file it opens lands on descriptor 0, 1
or 2, where what it starts would read it as stdin or write into it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

PREFSHIFT = str(Path(sys.executable).parent / "prefshift")


def _closed(command: str, closing: str, cwd) -> subprocess.CompletedProcess:
    """`command` run by bash with the streams `closing` names closed first."""
    script = f"exec {closing}; {command}"
    return subprocess.run(["bash", "-c", script], cwd=cwd, capture_output=True, timeout=120)


@pytest.mark.parametrize("closing", ["<&-", ">&-", "2>&-", "<&- >&- 2>&-"])
def test_a_command_with_closed_streams_writes_its_output_and_exits_0(tmp_path, closing):
    """Before, with stdout closed every command ended in an AttributeError traceback and exit 1,
    after doing its work (its exit flushes stdout, which Python had set to None)."""
    out = tmp_path / "params.yaml"
    done = _closed(f"{PREFSHIFT} preset laptop-harmless -o {out} --force", closing, tmp_path)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert "methods" in yaml.safe_load(out.read_text())


@pytest.mark.parametrize("closing", ["<&-", ">&-", "2>&-"])
def test_no_file_opened_after_start_takes_a_closed_standard_descriptor(tmp_path, closing):
    """What the next `open` gets once the CLI has reopened the standard streams: a descriptor above
    2, and a file that output meant for the closed stream never reaches."""
    probe = (
        "import os, sys; from prefshift.core.standard_streams import reopen_closed; reopen_closed(); "
        "fd = os.open('opened.txt', os.O_CREAT | os.O_WRONLY); "
        "print('meant for stdout'); print('meant for stderr', file=sys.stderr); sys.stdout.flush(); "
        "os.close(fd); open('fd.txt', 'w').write(str(fd))"
    )
    done = _closed(f'{sys.executable} -c "{probe}"', closing, tmp_path)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert int((tmp_path / "fd.txt").read_text()) > 2
    assert (tmp_path / "opened.txt").read_text() == ""
