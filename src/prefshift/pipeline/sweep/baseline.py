"""The baseline a sweep's tasks start from: HEAD, plus what the workspace holds that HEAD does not.

Every task clones HEAD. On one machine the workspace's uncommitted state comes along too, as an
overlay copied once into the sweep's folder when it starts: tracked files changed since HEAD
(params, code), dvc.lock, and every `cache: false` output (metrics, plots), which no cache can
restore. With dvc.lock and the shared DVC cache, a task's `dvc checkout` then restores the other
outputs, and only what a point's overrides invalidate reruns: a fresh clone after `make repro`
sweeps as a committed one does. A cluster's tasks clone from a remote, so there the baseline must
be committed and pushed (`check_committed`).
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
        base = root.resolve()
        return [
            (Path(out.fs_path).resolve().relative_to(base), out.use_cache, bool(out.metric))
            for stage in repo.index.stages
            for out in stage.outs
        ]


def uncommitted_baseline(root: Path, outputs: Sequence[tuple[Path, bool, bool]] | None = None) -> list[str]:
    """dvc.lock and the metrics files that HEAD does not hold as the workspace does: what
    `dvc exp show`'s baseline row and a plain `dvc exp diff` need committed."""
    outputs = pipeline_outputs(root) if outputs is None else outputs
    paths = [p.as_posix() for p, _, metric in outputs if metric and (root / p).exists()]
    if (root / "dvc.lock").exists():
        paths.insert(0, "dvc.lock")
    if not paths:
        return []
    status = run_git(root, "status", "--porcelain", "--untracked-files=all", "--", *paths)
    changed = {line[3:].strip() for line in status.splitlines() if line.strip()}
    return [p for p in paths if p in changed]


def commit_command(paths: Sequence[str]) -> str:
    quoted = " ".join(shlex.quote(p) for p in paths)
    return f'git add {quoted} && git commit -m "Baseline results for the sweep"'


def _changed_tracked(root: Path) -> list[str]:
    return [p for p in run_git(root, "diff", "HEAD", "--name-only", "--no-renames", "-z").split("\0") if p]


def check_committed(root: Path) -> None:
    """Refuse a workspace that holds anything a task cloning HEAD from a remote would miss."""
    missing = sorted(set(_changed_tracked(root)) | set(uncommitted_baseline(root)))
    if missing:
        raise SweepError(
            f"{root}: not committed: {', '.join(missing[:6])}{' ...' if len(missing) > 6 else ''}; "
            f"each point runs in a clone of the baseline commit, so commit first: {commit_command(missing)}"
        )


def snapshot(root: Path, overlay: Path) -> tuple[list[str], list[str]]:
    """Copy the workspace's uncommitted state into `overlay`; return (copied, deleted) paths."""
    outputs = pipeline_outputs(root)
    copied, deleted, changed = [], [], _changed_tracked(root)
    paths = [*changed, "dvc.lock", *(p.as_posix() for p, cached, _ in outputs if not cached)]
    for rel in dict.fromkeys(paths):
        source = root / rel
        if not source.exists():
            deleted += [rel] if rel in changed else []
            continue
        target = overlay / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, target, symlinks=True, dirs_exist_ok=True)
        else:
            shutil.copy2(source, target, follow_symlinks=False)
        copied.append(rel)
    return copied, deleted


def lay_overlay(overlay: Path, deleted: Sequence[str], clone: Path) -> None:
    """The workspace's state, snapshot at the sweep's start, over a clone of HEAD."""
    if overlay.is_dir():
        shutil.copytree(overlay, clone, symlinks=True, dirs_exist_ok=True)
    for rel in deleted:
        (clone / rel).unlink(missing_ok=True)
