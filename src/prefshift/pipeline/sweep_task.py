"""One grid point, run by its own task in its own clone of the baseline commit.

Both executors that leave DVC's queue run this, as `prefshift sweep task <folder> <index>`: a
SLURM array task on some node, or a local-gpus slot with its own CUDA_VISIBLE_DEVICES. Cluster
jobs that share one workspace block each other on DVC's lock (treeverse/dvc#7419), so each point
gets a clone in the sweep's folder and talks to the user's project only through remotes:

1. clone the sweep's git remote and check out the baseline commit (a later attempt reuses the
   clone, so the training checkpoint under models/checkpoints/, which is no DVC output, is there
   to resume from);
2. `dvc exp run --pull --name <name> -S ... report`: `--pull` fetches from the DVC remote what the
   unchanged stages hold, so shared stages are pulled, not recomputed (with a shared cache on one
   machine, `dvc checkout` links them instead);
3. `dvc exp push origin <name>` (the experiment's git ref) and `dvc push` (its outputs).

MLflow gets the runs from the stages themselves, through MLFLOW_TRACKING_URI in the task's
environment. The task writes where it stands to the sweep's folder (`points/<index>.json`) before
each step and at its end; a stop by SIGTERM (scancel, preemption, time limit) is written as
`stopped` when there is time to, and `sweep_record.point_state` reads silence as the same.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from pathlib import Path

from prefshift.core.signals import Terminated, exit_code, signals_as_exceptions
from prefshift.pipeline.sweep import TARGET, SweepError, experiment_ref, run_dvc, run_git
from prefshift.pipeline.sweep_record import FINISHED, STOPPED, SweepRecord, open_folder

TASK_HEADER = "=== sweep task"
"""Starts each attempt's part of a point's log, so the gatherer reads the last attempt alone."""


DVC_LOCKS = ("lock", "rwlock", "rwlock.lock")
"""DVC's lock files under .dvc/tmp: the repository lock and the stage read/write lock."""


def _clear_dead_locks(clone: Path, say: Callable[[str], None]) -> None:
    """A reused clone's DVC locks are the dead attempt's: one attempt of a point runs at a time.

    An attempt killed mid-write (scancel, preemption, a time limit) can leave .dvc/tmp/rwlock
    empty, and DVC then refuses every later run ("Unable to read RWLock-file ... JSON structure
    is corrupted"), so a resumed point would fail where it should have resumed.
    """
    for name in DVC_LOCKS:
        path = clone / ".dvc" / "tmp" / name
        if path.is_file():
            path.unlink()
            say(f"removed {path}, left by the attempt before")


def _clone(record: SweepRecord, index: int, say: Callable[[str], None]) -> Path:
    """The point's clone at the baseline commit: made once (atomically: a half-made clone is never
    mistaken for one), reused by every later attempt."""
    clone = record.clone(index)
    if (clone / ".git").is_dir():
        say(f"reusing {clone} (an earlier attempt's checkpoints stay)")
        _clear_dead_locks(clone, say)
        return clone
    staging = clone.with_name(f".{index}.{os.getpid()}.tmp")
    remote = record.data["git_remote"]
    say(f"cloning {remote} at {record.data['baseline'][:12]} into {clone}")
    run_git(clone.parent, "clone", "--quiet", "--no-checkout", remote, str(staging))
    run_git(staging, "checkout", "--quiet", "--detach", record.data["baseline"])
    cache = record.data.get("dvc_cache")
    if cache:  # one machine: the project's own cache, so nothing is copied or pushed
        # What `dvc cache dir --local` writes, without a DVC process's seconds; the clone is new.
        (staging / ".dvc" / "config.local").write_text(f"[cache]\n    dir = {cache}\n", encoding="utf-8")
    os.replace(staging, clone)
    return clone


def _run_experiment(record: SweepRecord, index: int, clone: Path, say: Callable[[str], None]) -> None:
    name = record.names[index]
    if experiment_ref(clone, name):
        say(f"experiment {name} was committed by an earlier attempt; pushing it")
        return
    args = ["exp", "run", "--name", name]
    for key, value in record.points[index].items():
        args += ["-S", f"{key}={value}"]
    if record.data.get("dvc_cache"):
        run_dvc(clone, ["checkout", "--allow-missing"])
    else:
        args.append("--pull")
    say(f"dvc {' '.join(args)} {TARGET}")
    run_dvc(clone, [*args, TARGET])


def _push(record: SweepRecord, index: int, clone: Path, say: Callable[[str], None]) -> str:
    name = record.names[index]
    say(f"dvc exp push origin {name}")
    run_dvc(clone, ["exp", "push", "--no-cache", "origin", name])
    if not record.data.get("dvc_cache"):
        say("dvc push (the experiment's outputs, to the project's DVC remote)")
        run_dvc(clone, ["push"])
    ref = experiment_ref(clone, name)
    if ref is None:
        raise SweepError(f"{clone}: `dvc exp run` left no experiment named {name}")
    return run_git(clone, "rev-parse", ref).strip()


def run_point(folder: Path, index: int) -> int:
    """Run grid point `index` of the sweep in `folder`; return the task's exit status."""
    record = open_folder(folder)
    if not 0 <= index < len(record.points):
        raise SweepError(f"{folder}: no grid point {index} (the sweep has {len(record.points)})")
    name = record.names[index]

    def say(message: str) -> None:
        print(f"{time.strftime('%H:%M:%S')} [{name}] {message}", flush=True)

    before = record.read_state(index)
    attempt = int(before.get("attempt", 0)) + 1
    devices = os.environ.get("CUDA_VISIBLE_DEVICES", "(unset)")
    print(
        f"{TASK_HEADER} {record.id} point {index} ({name}) attempt {attempt} on {socket.gethostname()}, "
        f"CUDA_VISIBLE_DEVICES={devices} ===",
        flush=True,
    )
    if before.get("state") == FINISHED:
        say("finished by an earlier attempt; nothing to do")
        return 0
    step = "clone"
    record.write_state(
        index, "running", attempt=attempt, step=step, log=str(record.log(index)), devices=devices
    )
    try:
        with signals_as_exceptions():
            clone = _clone(record, index, say)
            step = "run"
            record.write_state(index, "running", step=step)
            _run_experiment(record, index, clone, say)
            step = "push"
            record.write_state(index, "running", step=step)
            commit = _push(record, index, clone, say)
    except Terminated as stop:
        record.write_state(index, STOPPED, step=step, error=f"{stop} during {step}")
        say(f"stopped by a signal during {step}")
        return exit_code(stop.signum)
    except SweepError as err:
        record.write_state(index, "failed", step=step, error=str(err)[-2000:])
        say(f"failed during {step}: {err}")
        return 1
    record.write_state(index, FINISHED, step="done", commit=commit)
    say(f"done: experiment {name} at {commit[:12]}")
    return 0
