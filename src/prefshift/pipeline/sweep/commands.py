"""The git and dvc commands a sweep runs, and its own output, which never stops it."""

from __future__ import annotations

import contextlib
import os
import shlex
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from prefshift.core.errors import PrefshiftError


class SweepError(PrefshiftError):
    """A grid that cannot be parsed, or an experiment that failed or left no result."""


def say(text: str) -> None:
    """A line to stderr. A reader that went away (`| head`, a closed terminal) silences the sweep
    instead of stopping it: its record and the points' logs keep everything it would say."""
    try:
        print(text.rstrip("\n"), file=sys.stderr, flush=True)
    except (OSError, ValueError):
        silence()


def silence() -> None:
    """Point stdout and stderr at /dev/null, so that no later write (nor the one at exit) fails."""
    null = os.open(os.devnull, os.O_WRONLY)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            os.dup2(null, stream.fileno())
    os.close(null)


def run(
    *command: str,
    cwd: Path | None = None,
    timeout: float | None = None,
    hint: str = "",
    env: Mapping[str, str] | None = None,
) -> str:
    """`command`'s output; a failure, a missing command or a timeout is a SweepError naming it."""
    shown = f"`{shlex.join(command)}`" + (f" (in {cwd})" if cwd else "")
    try:
        done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
    except (FileNotFoundError, subprocess.TimeoutExpired) as err:
        raise SweepError(f"{shown}: {err}{hint}") from None
    if done.returncode != 0:
        raise SweepError(f"{shown} failed (exit {done.returncode}): {done.stderr.strip()}")
    return done.stdout


def run_git(root: Path, *args: str) -> str:
    """git in `root`; a path given it is a name, never a pattern (`data[1]` also matched `data1`)."""
    return run("git", "--literal-pathspecs", *args, cwd=root)


def run_dvc(root: Path, args: Sequence[str], echo: bool = True, env: Mapping[str, str] | None = None) -> str:
    """Run the dvc installed with prefshift, its directory first on PATH (stages call plain `dvc`
    and `prefshift`), echoing its output as it comes unless told not to; return that output. `env`
    adds to this process's environment."""
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, **(env or {}), "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    command = [str(bin_dir / "dvc") if (bin_dir / "dvc").exists() else "dvc", *args]
    proc = subprocess.Popen(
        command, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if echo:
            say(line)
    if proc.wait() != 0:
        raise SweepError(f"`dvc {' '.join(args)}` failed (exit {proc.returncode}):\n{''.join(lines)[-3000:]}")
    return "".join(lines)
