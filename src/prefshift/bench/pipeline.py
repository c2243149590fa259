"""The embedded default end to end: a full `dvc repro` in a fresh clone, then a no-op one.

The repository's committed sources are copied into a temporary git repository (nothing of
the working tree's data/, models/, caches or earlier results comes along), so the first repro
runs every stage. `dvc repro` runs under a small wrapper that reports RUSAGE_CHILDREN's peak RSS:
the largest resident set of any process it waited for, i.e. of the hungriest stage.
Stage durations come from the time each "Running stage" line appeared.

With a params file (e.g. one `prefshift preset robust-ft` wrote), the clone runs that pipeline
instead of the embedded default, and each method's training cost is read off the same run:
its `train@<method>` stage (every seed, one process) against naive's (`method_costs`). Every
stage is a fresh process on the same machine, data and sizes, so the ratio is what the method
costs a user of the pipeline, process start-up included.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path, PurePosixPath

from prefshift.bench.common import BenchError
from prefshift.config.params import MAX_PARAMS_BYTES
from prefshift.core.host import core_share
from prefshift.core.process_group import adopt_orphans, kill_group
from prefshift.core.reading import read_regular
from prefshift.core.signals import signals_as_exceptions

DEFAULT_PARAMS = "params.yaml (embedded default)"
"""A pipeline section's `params` when it timed the embedded default, not a `--pipeline-params` file."""

TARGETS = {"noop_repro_s": 5.0, "full_repro_s": 600.0, "max_stage_peak_rss_mb": 2048.0}
_WRAPPER = (
    "import resource, subprocess, sys\n"
    "rc = subprocess.call(sys.argv[1:])\n"
    "print('PEAK_RSS_KB', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, flush=True)\n"
    "sys.exit(rc)\n"
)


def copy_project_sources(repo: Path, root: Path) -> list[str]:
    """Copy the project's sources from the checkout `repo` under `root`, as a fresh clone has them;
    return their paths.

    Which files: those of the last commit (`git ls-tree HEAD`), never git's index, so what a
    `dvc repro` staged there (core.autostage stages dvc.lock and DVC's .gitignore files) does not
    come along. Minus what the pipeline writes even where it was committed: dvc.lock, every
    declared stage output, and the .gitignore DVC keeps beside each cached output. A copy that
    held those would start as an already reproduced project, not a fresh clone.
    Their contents: the working tree's, so an uncommitted edit of a committed source is what the
    copy runs (a developer testing a change before committing it); a committed file deleted in
    the working tree is left out. A new file needs a commit before the copy holds it.
    """
    owned = pipeline_owned(repo)
    copied = []
    for rel in committed_files(repo):
        source = repo / rel
        if source.is_file() and not _owned(rel, owned):
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, root / rel)
            copied.append(rel)
    return copied


def committed_files(repo: Path) -> list[str]:
    """Paths of the files in the checkout's last commit."""
    done = subprocess.run(
        ["git", "ls-tree", "-r", "-z", "--name-only", "HEAD"], cwd=repo, capture_output=True, text=True
    )
    if done.returncode != 0:
        raise BenchError(f"cannot list the last commit of {repo} (git ls-tree HEAD): {done.stderr.strip()}")
    return [rel for rel in done.stdout.split("\0") if rel]


def pipeline_owned(repo: Path) -> set[PurePosixPath]:
    """What `dvc repro` writes in `repo`: dvc.lock, every stage output and DVC's .gitignore files
    (one beside each cached output, none at the root, whose .gitignore is the project's own)."""
    from prefshift.pipeline.sweep.baseline import open_pipeline, pipeline_outputs

    with open_pipeline(repo) as project:
        outputs = pipeline_outputs(project)
    owned = {PurePosixPath("dvc.lock")} | {PurePosixPath(path.as_posix()) for path, _, _ in outputs}
    owned |= {
        PurePosixPath(path.parent.as_posix()) / ".gitignore"
        for path, cached, _ in outputs
        if cached and path.parent != Path(".")
    }
    return owned


def _owned(rel: str, owned: set[PurePosixPath]) -> bool:
    path = PurePosixPath(rel)
    return any(path == out or out in path.parents for out in owned)


def _environment(root: Path, threads: int | None = None) -> dict[str, str]:
    """The environment `dvc repro` runs in for the project at `root`. Each stage's torch takes
    `threads` threads (OMP_NUM_THREADS); with None, torch's default of one per core, as a user's
    `dvc repro` gets, whatever the caller's shell exports."""
    bin_dir = str(Path(sys.executable).parent)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        "HF_HUB_OFFLINE": "1",
        "MLFLOW_TRACKING_URI": f"sqlite:///{root / 'mlflow.db'}",
    }
    env.pop("OMP_NUM_THREADS", None)
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    for who in ("AUTHOR", "COMMITTER"):
        env[f"GIT_{who}_NAME"], env[f"GIT_{who}_EMAIL"] = "prefshift bench", "bench@localhost"
    env.pop("PREFSHIFT_PIPELINE_RUN_ID", None)
    return env


def _repro(root: Path, env: dict[str, str], log: Callable[[str], None]) -> dict:
    """One `dvc repro`: wall time, stages with durations, peak RSS of the largest stage."""
    start = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-c", _WRAPPER, "dvc", "repro"],
        cwd=root,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group: stopped whole, stages included
    )
    stages: dict[str, float] = {}
    current, since, peak_kb, tail = None, start, 0, []
    try:
        for line in proc.stdout:
            now = time.perf_counter()
            tail = [*tail[-40:], line]
            if line.startswith("Running stage '"):
                if current is not None:
                    stages[current] = now - since
                current, since = line.split("'")[1], now
                log(f"  {current}")
            elif line.startswith("PEAK_RSS_KB"):
                peak_kb = int(line.split()[1])
    except BaseException:  # Ctrl-C or SIGTERM: the repro stops too, all of it, before its clone is removed
        kill_group(proc.pid)
        proc.wait()
        raise
    rc = proc.wait()
    wall = time.perf_counter() - start
    if current is not None:
        stages[current] = time.perf_counter() - since
    if rc != 0:
        raise BenchError(f"dvc repro failed in {root} (exit {rc}):\n{''.join(tail)}")
    return {"wall_s": wall, "stages_s": stages, "peak_rss_mb": peak_kb / 1024}


def method_costs(stages_s: dict[str, float]) -> dict[str, dict]:
    """method → its train stage's wall time (every seed, one process) and that ÷ naive's."""
    walls = {stage.removeprefix("train@"): s for stage, s in stages_s.items() if stage.startswith("train@")}
    naive = walls.get("naive")
    return {m: {"stage_s": v, "vs_naive": v / naive if naive else None} for m, v in walls.items()}


def bench_pipeline(
    repo: Path,
    log: Callable[[str], None],
    keep: bool = False,
    params_file: Path | None = None,
    threads: int | None = None,
) -> dict:
    """Full and no-op `dvc repro` of the embedded default (or of `params_file`) in a temporary
    clone of `repo`. Each stage's torch runs on `threads` threads, by default torch's own (one per
    core), because that is what `dvc repro` costs a user: pinned to one thread, the default's
    repro took 809 s against 655 s on a 2-core Intel Xeon (2026-12-06, one run after the other)."""
    # A regular file of params size, read before anything is made: never a device's endless bytes.
    params = None if params_file is None else read_regular(params_file, "params file", MAX_PARAMS_BYTES)
    adopt_orphans()  # so that kill_group sees the end of a stage whose dvc parent died first
    with signals_as_exceptions():  # SIGTERM, like Ctrl-C, removes the clone on the way out
        tmp = Path(tempfile.mkdtemp(prefix="prefshift-bench-pipeline-"))
        root = tmp / "project"
        try:
            root.mkdir()
            copy_project_sources(repo, root)
            if params is not None:
                (root / "params.yaml").write_bytes(params)
            env = _environment(root, threads)
            for args in (["git", "init", "-q"], ["git", "add", "-A"], ["git", "commit", "-qm", "bench"]):
                subprocess.run(args, cwd=root, env=env, check=True, capture_output=True)
            log("pipeline: full dvc repro (minutes)")
            full = _repro(root, env, log)
            log("pipeline: no-op dvc repro")
            noop = _repro(root, env, log)
        finally:
            if keep:
                log(f"pipeline: clone kept at {root}")
            else:
                shutil.rmtree(tmp, ignore_errors=True)
    measured = {
        "noop_repro_s": noop["wall_s"],
        "full_repro_s": full["wall_s"],
        "max_stage_peak_rss_mb": full["peak_rss_mb"],
    }
    return {
        **measured,
        "params": str(params_file) if params_file else DEFAULT_PARAMS,
        "threads": threads,  # None: torch's default, one per core
        "cores": core_share(1),
        "method_costs": method_costs(full["stages_s"]),
        "stages_s": full["stages_s"],
        "noop_ran_stages": sorted(noop["stages_s"]),
        "targets": {key: {"max": limit, "met": measured[key] <= limit} for key, limit in TARGETS.items()},
    }
