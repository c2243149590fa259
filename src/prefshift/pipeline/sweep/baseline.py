"""The baseline a sweep's tasks start from: HEAD, plus what the workspace holds that HEAD does not.

On one machine the workspace's uncommitted state (tracked files changed since HEAD, dvc.lock and
every `cache: false` output, which no cache restores) is copied into the sweep's folder and laid
over each clone; the shared cache restores the rest, so a fresh clone after `make repro` sweeps as a
committed one does. A cluster's tasks clone from a remote: there the baseline must be committed.
"""

from __future__ import annotations

import shlex
import shutil
from collections.abc import Sequence
from pathlib import Path

from prefshift.pipeline.sweep.commands import SweepError, run_git


def pipeline_outputs(root: Path) -> list[tuple[Path, bool, bool]]:
    """(path relative to root, DVC-cached?, declared as metrics?) of every stage output."""
    from dvc.repo import Repo

    with Repo(str(root)) as repo:
        return [
            (Path(out.fs_path).resolve().relative_to(root.resolve()), out.use_cache, bool(out.metric))
            for stage in repo.index.stages
            for out in stage.outs
        ]


def uncommitted_baseline(root: Path) -> list[str]:
    """dvc.lock and the metrics files that HEAD does not hold as the workspace does: what
    `dvc exp show`'s baseline row and a plain `dvc exp diff` need committed."""
    paths = [p.as_posix() for p, _, metric in pipeline_outputs(root) if metric and (root / p).exists()]
    paths = ["dvc.lock", *paths] if (root / "dvc.lock").exists() else paths
    status = run_git(root, "status", "--porcelain", "--untracked-files=all", "--", *paths) if paths else ""
    changed = {line[3:].strip() for line in status.splitlines()}
    return [p for p in paths if p in changed]


def commit_command(paths: Sequence[str]) -> str:
    return f'git add {shlex.join(paths)} && git commit -m "Baseline results for the sweep"'


def _changed_tracked(root: Path) -> list[str]:
    return [p for p in run_git(root, "diff", "HEAD", "--name-only", "--no-renames", "-z").split("\0") if p]


def check_committed(root: Path) -> None:
    """Refuse a workspace that holds anything a task cloning HEAD from a remote would miss."""
    if missing := sorted(set(_changed_tracked(root)) | set(uncommitted_baseline(root))):
        raise SweepError(
            f"{root}: not committed: {', '.join(missing[:6])}{' ...' if len(missing) > 6 else ''}; "
            f"each point runs in a clone of the baseline commit, so commit first: {commit_command(missing)}"
        )


def snapshot(root: Path, overlay: Path) -> list[str]:
    """Copy the workspace's uncommitted state into `overlay`; return the tracked files it deleted."""
    changed = _changed_tracked(root)
    uncached = [p.as_posix() for p, cached, _ in pipeline_outputs(root) if not cached]
    for rel in dict.fromkeys([*changed, "dvc.lock", *uncached]):
        source, target = root / rel, overlay / rel
        if source.is_dir():
            shutil.copytree(source, target, symlinks=True, dirs_exist_ok=True)
        elif source.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target, follow_symlinks=False)
    return [rel for rel in changed if not (root / rel).exists()]
