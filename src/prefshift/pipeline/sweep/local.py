"""`--executor local` and `local-gpus`: a pool of tasks on this machine.

`local` runs `--jobs` tasks at once. `local-gpus --gpus 0,1,2,3` runs one per device set
(`--gpus-per-task` devices each) as the task's CUDA_VISIBLE_DEVICES, taken when it starts and given
back when it ends: two points never share a device. Each task runs in a process group of its own,
so a stop reaches everything it started (dvc, the stage, its workers) and nothing else, and a
Ctrl-C at the terminal reaches the sweep alone, which then ends the groups in order.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

from prefshift.core.signals import signals_ignored, stop_signal
from prefshift.pipeline.sweep.commands import SweepError, say
from prefshift.pipeline.sweep.record import SweepRecord

POLL_S = 1.0
STOP_GRACE_S = 30.0  # what a task gets after SIGTERM to record itself stopped (SLURM's KillWait)


def parse_devices(text: str) -> list[str]:
    """`0,1,2,3` → ['0', '1', '2', '3'], refusing empty or repeated entries."""
    devices = [d.strip() for d in text.split(",")]
    if not text.strip() or any(not d for d in devices):
        raise SweepError(f"--gpus {text!r}: list device ids separated by commas, e.g. --gpus 0,1,2,3")
    if len(set(devices)) != len(devices):
        raise SweepError(f"--gpus {text!r}: a device is listed twice; two experiments would share it")
    return devices


class Slots:
    """What may run at once: `jobs` plain slots, or disjoint device sets taken and given back."""

    def __init__(self, jobs: int, devices: Sequence[str] = (), per_task: int = 1):
        if devices and not 1 <= per_task <= len(devices):
            raise SweepError(f"--gpus-per-task {per_task}: give 1 to {len(devices)} (the devices in --gpus)")
        if not devices and jobs < 1:
            raise SweepError(f"--jobs {jobs}: run at least one point at a time")
        self.free: list[tuple[str, ...] | None] = (
            [tuple(devices[i : i + per_task]) for i in range(0, len(devices) - per_task + 1, per_task)]
            if devices
            else [None] * jobs
        )

    @property
    def count(self) -> int:
        return len(self.free)


@dataclass
class Running:
    index: int
    proc: subprocess.Popen
    slot: tuple[str, ...] | None


def _start(record: SweepRecord, index: int, slot: tuple[str, ...] | None) -> subprocess.Popen:
    env = {**os.environ, "MLFLOW_TRACKING_URI": record.data["tracking_uri"]}
    if slot is not None:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(slot)
    command = [sys.executable, "-m", "prefshift", "sweep", "task", str(record.folder), str(index)]
    with open(record.log(index), "a", encoding="utf-8") as log:  # the child keeps its own handle
        return subprocess.Popen(
            command,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )


def _adopt_orphans() -> None:
    """Make this process the reaper of its tasks' orphans (Linux's PR_SET_CHILD_SUBREAPER): a
    container's init may never reap them, and a group of zombies still answers `killpg(pgid, 0)`."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)


def _group_alive(pgid: int) -> bool:
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-pgid, os.WNOHANG)[0] > 0:
            pass
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stop(running: Sequence[Running], grace_s: float = STOP_GRACE_S) -> list[str]:
    """SIGTERM to each task's process group, SIGKILL to what outlives `grace_s`; what was done."""
    for task in running:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(task.proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    lines = []
    for task in running:
        with contextlib.suppress(subprocess.TimeoutExpired):
            task.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        while _group_alive(task.proc.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        forced = _group_alive(task.proc.pid)
        if forced:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(task.proc.pid, signal.SIGKILL)
            task.proc.wait()
        lines.append(
            f"point {task.index}: ended process group {task.proc.pid}"
            + (f" (SIGKILL after {grace_s:.0f} s)" if forced else "")
        )
    return lines


def run_points(record: SweepRecord, indices: Sequence[int], slots: Slots, poll_s: float = POLL_S) -> None:
    """Run points `indices`, as many at once as there are slots; return when all have ended.

    Stopped (Ctrl-C, SIGTERM), it ends the running tasks' groups, notes the stop in the record and
    lets the stop through; points not started yet stay `missing`, for resume to run."""
    pending, running = list(indices), []
    _adopt_orphans()
    try:
        while pending or running:
            while pending and slots.free:
                slot = slots.free.pop(0)
                running.append(Running(pending[0], _start(record, pending[0], slot), slot))
                devices = f", CUDA_VISIBLE_DEVICES={','.join(slot)}" if slot else ""
                say(
                    f"sweep {record.id}: point {pending[0]} ({record.names[pending.pop(0)]}) started{devices}"
                )
            time.sleep(poll_s)
            for task in [t for t in running if t.proc.poll() is not None]:
                running.remove(task)
                slots.free.append(task.slot)
                name, log = record.names[task.index], record.log(task.index)
                say(f"--- experiment {name}: exit {task.proc.returncode} (log {log}) ---")
                say(record.last_attempt(task.index))
    except BaseException as stopped:
        with signals_ignored():
            lines = stop(running)
            signum = stop_signal(stopped)
            name = signal.Signals(signum).name if signum else type(stopped).__name__
            record.note_stop(name, [t.index for t in running], lines)
            for line in lines:
                say(f"  {line}")
        raise


def live(record: SweepRecord) -> dict[int, str]:
    """Points whose task says it is running and whose process is still alive on this machine."""
    here, states = socket.gethostname(), {}
    for index in range(len(record.points)):
        entry = record.read_state(index)
        pid = int(entry.get("pid", 0))
        if entry.get("state") == "running" and entry.get("host") == here and pid > 0 and _alive(pid):
            states[index] = "running"
    return states


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
