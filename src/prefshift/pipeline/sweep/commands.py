"""The git and dvc commands a sweep runs, and its own output, which never stops it."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from prefshift.core.errors import PrefshiftError


class SweepError(PrefshiftError):
    """A grid that cannot be parsed, or an experiment that failed or left no result."""


def say(text: str) -> None:
    """One line to stderr. A reader that went away (`| head`, a closed terminal) silences the sweep
    instead of stopping it: the sweep's record and the points' logs keep everything it would say."""
    try:
        sys.stderr.write(text.rstrip("\n") + "\n")
        sys.stderr.flush()
    except (BrokenPipeError, ValueError, OSError):
        silence()


def silence() -> None:
    """Point stdout and stderr at /dev/null, so no later write (nor the one at exit) fails."""
    null = os.open(os.devnull, os.O_WRONLY)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            os.dup2(null, stream.fileno())
    os.close(null)


def run_git(root: Path, *args: str) -> str:
    done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True)
    if done.returncode != 0:
        raise SweepError(f"git {' '.join(args)} (in {root}) failed: {done.stderr.strip()}")
    return done.stdout


def dvc_command(args: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    """The dvc installed with prefshift (else PATH's), its directory leading the child's PATH:
    stages call plain `dvc` and `prefshift`."""
    bin_dir = Path(sys.executable).parent
    sibling = bin_dir / "dvc"
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    return [str(sibling) if sibling.exists() else "dvc", *args], env


def run_dvc(root: Path, args: Sequence[str], echo: bool = True) -> str:
    """Run dvc, echoing its output as it comes (unless told not to); return that output."""
    command, env = dvc_command(args)
    proc = subprocess.Popen(
        command, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    lines = []
    for line in proc.stdout:
        if echo:
            say(line)
        lines.append(line)
    output = "".join(lines)
    if proc.wait() != 0:
        raise SweepError(f"`dvc {' '.join(args)}` failed (exit {proc.returncode}):\n{output[-3000:]}")
    return output
