"""A trial clone of the baseline, made before a sweep starts, to see each stage's inputs as every
point's clone will see them.

The baseline checks name the known ways a clone of HEAD differs from the workspace (a file git
does not hold, a link, a submodule). Whatever they miss shows here, as DVC sees it: a stage whose
inputs hash otherwise in the clone than dvc.lock recorded would rerun in every point, on inputs
that are not the workspace's. A git filter that only the workspace's own config sets up is one
such way (nbstripout keeps a notebook's outputs in the workspace and strips them in git: a stage
reading the notebook hashed the first and ran on the second).
"""

from __future__ import annotations

import os
import shlex
import tempfile
from pathlib import Path
from typing import Any

from prefshift.pipeline.sweep.baseline import (
    cache_config,
    checked_out_submodules,
    filed_records,
    git_place,
    open_pipeline,
    project_of,
    upstream_stages,
)
from prefshift.pipeline.sweep.commands import SweepError, run_git
from prefshift.pipeline.sweep.task import clone_baseline


def check_clone_reads(repo: Any, ours: dict[tuple[str, str], str]) -> None:
    """Refuse a baseline whose inputs a clone of HEAD reads otherwise than the workspace (`repo`,
    whose `changed_inputs` are `ours`) does: a stage input (a dep no stage makes) that is current in
    the workspace and changed in the clone."""
    root = project_of(repo)
    top, subdir = git_place(root)
    with tempfile.TemporaryDirectory(prefix="prefshift-trial-") as scratch:
        clone, head = Path(scratch) / "clone", run_git(root, "rev-parse", "HEAD").strip()
        own = cache_config(str(Path(scratch) / "cache"), root)  # whatever DVC writes stays in the trial
        # shared: the temporary folder may lie on another filesystem, where a plain local clone
        # copies every object
        clone_baseline(top, clone, head, checked_out_submodules(top), subdir, own, shared=True)
        with open_pipeline(clone / subdir) as cloned:
            theirs = changed_inputs(cloned)
    if differ := sorted(set(theirs) - set(ours)):
        stage, dep = differ[0]
        raise SweepError(
            f"{root}: stage {stage}'s input {dep} is {theirs[differ[0]]} in a clone of the baseline commit, "
            f"current here{f' (and {len(differ) - 1} more)' if len(differ) > 1 else ''}: each point would "
            "rerun the stage on other inputs than this workspace's, or fail on it. A symbolic link in it "
            "that leads out of the repository, or a git filter or attribute set up only here (`git config "
            "--get-regexp ^filter`, .git/info/attributes), does this: make the link absolute, or commit the "
            "file as this workspace holds it"
        )


def stale_notes(repo: Any, changed: dict[tuple[str, str], str]) -> list[str]:
    """Where dvc.lock is behind the workspace's inputs of a stage a point may skip (`changed`: the
    workspace's `changed_inputs`): every point would rerun that stage (a shared one: the cost a
    sweep exists to save) and all that follows it, where one run of it now lets each point restore
    it. Said, not refused: the points are right."""
    upstream = {stage.addressing for stage in upstream_stages(repo)}
    if not (stale := sorted(key for key in changed if key[0] in upstream)):
        return []
    stages = sorted({stage for stage, _ in stale})
    shown = ", ".join(stages[:4]) + (" ..." if len(stages) > 4 else "")
    return [
        f"{shown}: inputs changed since dvc.lock ({stale[0][0]}'s {stale[0][1]}), so every point reruns "
        f"them and the stages that follow; to run them once, first `dvc repro {shlex.join(stages)}`, then "
        "commit dvc.lock"
    ]


def changed_inputs(repo: Any) -> dict[tuple[str, str], str]:
    """(stage, input named from the project) → how DVC finds it changed against dvc.lock, for each
    stage's input in `repo` (open_pipeline): a dep that holds nothing a stage makes (which a point
    restores from the cache), nor the sweeps' records (baseline.filed_records)."""
    from dvc.exceptions import DvcException

    project, changed = project_of(repo), {}
    stages = list(repo.index.stages)
    outputs = {Path(out.fs_path) for stage in stages for out in stage.outs} | {filed_records(project)}
    holding = {folder for output in outputs for folder in output.parents}
    for stage in stages:
        for dep in stage.deps:
            path = Path(dep.fs_path)
            if not dep.is_in_repo or path in holding or not outputs.isdisjoint([path, *path.parents]):
                continue
            try:
                status = next(iter(dep.workspace_status().values()), None)
            except (OSError, DvcException) as err:  # a dangling link in a folder: what dvc would meet
                status = f"unreadable ({str(err).replace(f'{project}{os.sep}', '')})"
            if status:
                changed[stage.addressing, os.path.relpath(path, project)] = status
    return changed
