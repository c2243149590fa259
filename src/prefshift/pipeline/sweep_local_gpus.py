"""`--executor local-gpus --gpus 0,1,2,3`: every GPU of one machine, each experiment on its own.

DVC's queue starts N experiments that all see every GPU, so all of them train on the first. Here
each running point holds a device set of its own (`--gpus-per-task` devices, 1 by default) as its
CUDA_VISIBLE_DEVICES, taken from a pool when it starts and given back when it ends: two points
never share a device, and a device is never idle while a point waits. A point runs as the same
task a SLURM array runs (sweep_task: its own clone, `dvc exp run`, `dvc exp push`), with the
project itself as the git remote and its DVC cache shared, so one machine needs no remotes.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Sequence

from prefshift.core.errors import PrefshiftError
from prefshift.pipeline.sweep_record import SweepRecord

POLL_S = 2.0
STOP_GRACE_S = 30.0  # what a task gets after SIGTERM to record itself stopped, as SLURM's KillWait


class DeviceError(PrefshiftError):
    """A device list that cannot be split into the asked sets."""


def parse_devices(text: str) -> list[str]:
    """`0,1,2,3` → ['0', '1', '2', '3'], refusing empty or repeated entries."""
    devices = [d.strip() for d in text.split(",")]
    if not text.strip() or any(not d for d in devices):
        raise DeviceError(f"--gpus {text!r}: list device ids separated by commas, e.g. --gpus 0,1,2,3")
    if len(set(devices)) != len(devices):
        raise DeviceError(f"--gpus {text!r}: a device is listed twice; two experiments would share it")
    return devices


class DevicePool:
    """Disjoint device sets for concurrent tasks: `take` one when a task starts, `give` it back after."""

    def __init__(self, devices: Sequence[str], per_task: int):
        if per_task < 1 or per_task > len(devices):
            raise DeviceError(
                f"--gpus-per-task {per_task}: give 1 to {len(devices)} (the devices listed in --gpus)"
            )
        self.free = list(devices)
        self.per_task = per_task

    @property
    def slots(self) -> int:
        return len(self.free) // self.per_task

    def take(self) -> tuple[str, ...] | None:
        if len(self.free) < self.per_task:
            return None
        taken, self.free = tuple(self.free[: self.per_task]), self.free[self.per_task :]
        return taken

    def give(self, devices: Sequence[str]) -> None:
        self.free.extend(devices)


def _start(record: SweepRecord, index: int, devices: Sequence[str]) -> subprocess.Popen:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ",".join(devices)}
    command = [sys.executable, "-m", "prefshift", "sweep", "task", str(record.folder), str(index)]
    with open(record.log(index), "a", encoding="utf-8") as log:  # the child keeps its own handle
        return subprocess.Popen(
            command, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )


def run_points(record: SweepRecord, indices: Sequence[int], pool: DevicePool, poll_s: float = POLL_S) -> None:
    """Run grid points `indices`, as many at once as the pool has device sets; return when all ended.

    Stopped (Ctrl-C, SIGTERM), it passes SIGTERM on to the running tasks, which record themselves
    stopped, and waits for them before it lets the stop through.
    """
    pending = list(indices)
    running: dict[int, tuple[subprocess.Popen, tuple[str, ...]]] = {}
    try:
        while pending or running:
            while pending and (devices := pool.take()) is not None:
                index = pending.pop(0)
                running[index] = (_start(record, index, devices), devices)
                print(
                    f"sweep: point {index} ({record.names[index]}) started, "
                    f"CUDA_VISIBLE_DEVICES={','.join(devices)}",
                    file=sys.stderr,
                    flush=True,
                )
            time.sleep(poll_s)
            for index, (proc, devices) in list(running.items()):
                if proc.poll() is not None:
                    pool.give(devices)
                    del running[index]
                    print(
                        f"sweep: point {index} ({record.names[index]}) ended (exit {proc.returncode})",
                        file=sys.stderr,
                        flush=True,
                    )
    except BaseException:
        for proc, _ in running.values():
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
        for proc, _ in running.values():
            try:
                proc.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        raise


def _alive(pid: int) -> bool:
    if pid <= 0:  # 0 and below name process groups, not a task
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def live(record: SweepRecord) -> dict[int, str]:
    """Points whose task says it is running and whose process is still alive on this machine."""
    here = socket.gethostname()
    states = {}
    for index in range(len(record.points)):
        entry = record.read_state(index)
        if entry.get("state") == "running" and entry.get("host") == here and _alive(int(entry.get("pid", 0))):
            states[index] = "running"
    return states
