"""The embedded default end to end: a full `dvc repro` in a fresh clone, then a no-op one.

The repository's tracked files are copied into a temporary git repository (nothing of
the working tree's data/, models/ or caches comes along), so the first repro runs every
stage. `dvc repro` runs under a small wrapper that reports RUSAGE_CHILDREN's peak RSS:
the largest resident set of any process it waited for, i.e. of the hungriest stage.
Stage durations come from the time each "Running stage" line appeared.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from prefshift.bench.common import BenchError

TARGETS = {"noop_repro_s": 5.0, "full_repro_s": 600.0, "max_stage_peak_rss_mb": 2048.0}
_WRAPPER = (
    "import resource, subprocess, sys\n"
    "rc = subprocess.call(sys.argv[1:])\n"
    "print('PEAK_RSS_KB', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, flush=True)\n"
    "sys.exit(rc)\n"
)


def copy_tracked(repo: Path, root: Path) -> None:
    """The files git tracks in `repo`, as they are in its working tree, copied under `root`:
    a clone without the working tree's data, models and caches (so every stage runs)."""
    tracked = subprocess.run(
        ["git", "ls-files", "-z"], cwd=repo, capture_output=True, text=True, check=True
    ).stdout.split("\0")
    for rel in filter(None, tracked):
        source = repo / rel
        if source.is_file():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, root / rel)


def _environment(root: Path) -> dict[str, str]:
    bin_dir = str(Path(sys.executable).parent)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        "HF_HUB_OFFLINE": "1",
        "MLFLOW_TRACKING_URI": f"sqlite:///{root / 'mlflow.db'}",
    }
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
    )
    stages: dict[str, float] = {}
    current, since, peak_kb, tail = None, start, 0, []
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
    rc = proc.wait()
    wall = time.perf_counter() - start
    if current is not None:
        stages[current] = time.perf_counter() - since
    if rc != 0:
        raise BenchError(f"dvc repro failed in {root} (exit {rc}):\n{''.join(tail)}")
    return {"wall_s": wall, "stages_s": stages, "peak_rss_mb": peak_kb / 1024}


def bench_pipeline(repo: Path, log: Callable[[str], None], keep: bool = False) -> dict:
    """Full and no-op `dvc repro` of the embedded default in a temporary clone of `repo`."""
    tmp = Path(tempfile.mkdtemp(prefix="prefshift-bench-pipeline-"))
    root = tmp / "project"
    try:
        root.mkdir()
        copy_tracked(repo, root)
        env = _environment(root)
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
        "stages_s": full["stages_s"],
        "noop_ran_stages": sorted(noop["stages_s"]),
        "targets": {key: {"max": limit, "met": measured[key] <= limit} for key, limit in TARGETS.items()},
    }
