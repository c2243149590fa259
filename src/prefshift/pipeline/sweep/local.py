"""`--executor local` and `local-gpus`: a pool of tasks on this machine.

`local` runs `--jobs` tasks at once; `local-gpus --gpus 0,1,2,3` one per device set
(`--gpus-per-task` devices), given to the task as its CUDA_VISIBLE_DEVICES, so two points never
share a device. Each task has a process group of its own: a stop reaches everything it started
(dvc, the stage, its workers) and nothing else, and Ctrl-C at the terminal reaches the sweep alone,
which then ends the groups.
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

from prefshift.core.signals import signals_ignored, stop_signal
from prefshift.pipeline.sweep.commands import SweepError, say
from prefshift.pipeline.sweep.record import SweepRecord

POLL_S = 1.0
STOP_GRACE_S = 30.0  # what a task gets after SIGTERM to record itself stopped (SLURM's KillWait)
PR_SET_CHILD_SUBREAPER = 36


def parse_devices(text: str) -> list[str]:
    """`0,1,2,3` → ['0', '1', '2', '3'], refusing empty or repeated entries."""
    devices = [d.strip() for d in text.split(",")]
    if not text.strip() or not all(devices):
        raise SweepError(f"--gpus {text!r}: list device ids separated by commas, e.g. --gpus 0,1,2,3")
    if len(set(devices)) != len(devices):
        raise SweepError(f"--gpus {text!r}: a device is listed twice; two experiments would share it")
    return devices


class Slots:
    """What may run at once: `jobs` plain slots, or disjoint device sets of `per_task` devices."""

    def __init__(self, jobs: int, devices: Sequence[str] = (), per_task: int = 1):
        if devices and not 1 <= per_task <= len(devices):
            raise SweepError(f"--gpus-per-task {per_task}: give 1 to {len(devices)} (the devices in --gpus)")
        if not devices and jobs < 1:
            raise SweepError(f"--jobs {jobs}: run at least one point at a time")
        sets = [tuple(devices[i : i + per_task]) for i in range(0, len(devices) - per_task + 1, per_task)]
        self.free: list[tuple[str, ...] | None] = sets if devices else [None] * jobs


def _start(record: SweepRecord, index: int, slot: tuple[str, ...] | None) -> subprocess.Popen:
    env = {**os.environ, "MLFLOW_TRACKING_URI": record.data["tracking_uri"]}
    if slot is not None:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(slot)
        say(f"sweep {record.id}: point {index} on CUDA_VISIBLE_DEVICES={env['CUDA_VISIBLE_DEVICES']}")
    command = [sys.executable, "-m", "prefshift", "sweep", "task", str(record.folder), str(index)]
    with open(record.log(index), "a", encoding="utf-8") as log:  # the child keeps its own handle
        return subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)  # fmt: skip


def _group_alive(pgid: int) -> bool:
    """Whether a process of the group still runs, once its zombies adopted by this one are reaped."""
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-pgid, os.WNOHANG)[0] > 0:
            pass
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def stop(running: dict[int, tuple[subprocess.Popen, object]]) -> list[str]:
    """SIGTERM to each task's process group, SIGKILL to what outlives `grace_s`; what was done."""
    for proc, _ in running.values():
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    while any(_group_alive(proc.pid) for proc, _ in running.values()) and time.monotonic() < deadline:
        time.sleep(0.1)
    lines = []
    for index, (proc, _) in running.items():
        if forced := _group_alive(proc.pid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        lines.append(f"point {index}: ended process group {proc.pid}{' (SIGKILL)' if forced else ''}")
    return lines


def run_points(record: SweepRecord, indices: Sequence[int], slots: Slots) -> None:
    """Run points `indices`, as many at once as there are slots; return when all have ended. Stopped,
    it ends the running tasks' groups, notes the stop in the record and lets the stop through."""
    pending, running = list(indices), {}
    with contextlib.suppress(OSError, AttributeError):  # a container's init may never reap orphans,
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)  # this process does
    say(f"sweep {record.id}: {len(slots.free)} point(s) at a time")
    try:
        while pending or running:
            while pending and slots.free:
                index, slot = pending.pop(0), slots.free.pop(0)
                running[index] = (_start(record, index, slot), slot)
            time.sleep(POLL_S)
            for index, (proc, _) in list(running.items()):
                if proc.poll() is not None:
                    slots.free.append(running.pop(index)[1])
                    head = f"--- experiment {record.names[index]}: exit {proc.returncode} ---"
                    say(f"{head}\n{record.last_attempt(index)}")
    except BaseException as stopped:
        with signals_ignored():
            signum = stop_signal(stopped)
            name = signal.Signals(signum).name if signum else type(stopped).__name__
            record.note_stop(name, list(running), stop(running))
        raise


def live(record: SweepRecord) -> dict[int, str]:
    """Points whose task says it is running and whose process is still alive on this machine."""
    states = {}
    for index in range(len(record.points)):
        entry = record.read_state(index)
        pid = int(entry.get("pid", 0))  # 0 and below would name process groups
        if entry.get("state") == "running" and entry.get("host") == socket.gethostname() and pid > 0:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 0)
                states[index] = "running"
    return states
