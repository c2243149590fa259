"""`--executor local` and `local-gpus`: a pool of tasks on this machine.

Each task has a process group of its own: a stop reaches everything it started (dvc, the stage,
its workers) and nothing else, and Ctrl-C at the terminal reaches the sweep alone, which then
ends the groups.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence

from prefshift.core import host, locks
from prefshift.core.process_group import adopt_orphans, group_alive, kill_group, reap_adopted
from prefshift.pipeline.sweep.commands import SweepError, say
from prefshift.pipeline.sweep.record import FINISHED, SweepRecord, now, open_folder

POLL_S = 1.0
STOP_GRACE_S = 30.0  # what a task gets after SIGTERM to record itself stopped (SLURM's KillWait)


DEVICE = re.compile(r"\d+|(GPU|MIG)-[0-9A-Za-z/-]+")
"""A device as CUDA_VISIBLE_DEVICES takes it: an index, or a UUID as `nvidia-smi -L` prints it."""


def parse_devices(text: str) -> list[str]:
    """`0,1,2,3` → ['0', '1', '2', '3'], each a device this machine has and this shell was given.
    CUDA reads CUDA_VISIBLE_DEVICES up to its first entry that is no device and hides the rest, so a
    task given `0-3`, or index 5 of four GPUs, trained on the CPU without a word; a task's own
    setting also replaces this shell's, so a device outside a CUDA_VISIBLE_DEVICES set here (a
    scheduler's allocation) would be another job's. Each is refused by name, as is a repeat."""
    devices = [d.strip() for d in text.split(",")]
    if not text.strip() or not all(devices):
        raise SweepError(f"--gpus {text!r}: list device ids separated by commas, e.g. --gpus 0,1,2,3")
    if bad := [d for d in devices if not DEVICE.fullmatch(d)]:
        raise SweepError(
            f"--gpus {text!r}: {bad[0]!r} is no device index or GPU-/MIG- UUID (nvidia-smi -L); CUDA would "
            "hide it and every device after it, and the point would train on the CPU: list each, e.g. 0,1,2,3"
        )
    devices = [_canonical(d) for d in devices]
    if len(set(devices)) != len(devices):
        raise SweepError(f"--gpus {text!r}: a device is listed twice; two experiments would share it")
    if given := os.environ.get("CUDA_VISIBLE_DEVICES", "").strip():
        allowed = {_canonical(d.strip()) for d in given.split(",")}
        if outside := [d for d in devices if d not in allowed]:
            raise SweepError(
                f"--gpus {text!r}: device {outside[0]} is not among those this shell was given "
                f"(CUDA_VISIBLE_DEVICES={given}), and a point's own setting would replace that: choose "
                "from them"
            )
    elif (count := _device_count()) and (past := [d for d in devices if d.isdigit() and int(d) >= count]):
        raise SweepError(
            f"--gpus {text!r}: device {past[0]}: this machine has {count} (0 to {count - 1}); CUDA would "
            "hide it, and the point would train on the CPU"
        )
    return devices


def _canonical(device: str) -> str:
    """A device as CUDA reads it: `00` is device 0."""
    return str(int(device)) if device.isdigit() else device


def _device_count() -> int:
    """CUDA devices here; with none, a list is taken as given (the executor's tests run one on a
    machine without a GPU)."""
    import torch

    return torch.cuda.device_count()


class Slots:
    """What may run at once: `jobs` plain slots, or disjoint device sets of `per_task` devices."""

    def __init__(self, jobs: int, devices: Sequence[str] = (), per_task: int = 1):
        if devices and not 1 <= per_task <= len(devices):
            raise SweepError(f"--gpus-per-task {per_task}: give 1 to {len(devices)} (the devices in --gpus)")
        if not devices and jobs < 1:
            raise SweepError(f"--jobs {jobs}: run at least one point at a time")
        sets = [tuple(devices[i : i + per_task]) for i in range(0, len(devices) - per_task + 1, per_task)]
        self.free: list[tuple[str, ...] | None] = sets if devices else [None] * jobs
        self.idle = list(devices[len(sets) * per_task :])  # too few left to make a set
        self.shared = _device_count() if not devices and jobs > 1 else 0  # GPUs every task sees


class Pool:
    """The tasks this command runs, as many at once as there are slots, started as slots free up."""

    def __init__(self, record: SweepRecord, slots: Slots):
        """A pool for the process that holds the sweep (`driving`)."""
        self.record, self.free, self.queued, self.idle = record, slots.free, [], slots.idle
        self.shared = slots.shared
        self.awaited: dict[int, list[tuple[str, ...] | None]] = {}
        self.threads = str(host.core_share(len(slots.free)))
        self.running: dict[int, tuple[subprocess.Popen, tuple[str, ...] | None]] = {}
        adopt_orphans()  # a container's init may never reap a task's orphans: this process does

    def launch(self, indices: Sequence[int], awaited: Sequence[int] = ()) -> None:
        """Queue points `indices`, noted in the record so that other processes show them as pending
        (not as never started) while this one lives. Points `awaited` still run the work of a task
        that ended (a resume found them so): each holds a slot (its devices, where it recorded them)
        until that work ends, and is queued then if it left no result."""
        self.record.data["driver"] = {"points": [*indices, *awaited], "since": now()}
        self.record.save()
        self.queued += indices
        idle = f"; device {','.join(self.idle)} left idle, short of a set" if self.idle else ""
        if self.shared:  # --jobs on a GPU machine: each task trains on the first device it sees
            idle = (f"; each sees this machine's {self.shared} GPU(s) and trains on the first, beside the "
                    f"others: --executor local-gpus --gpus gives each its own")  # fmt: skip
        say(f"sweep {self.record.id}: {len(self.free)} point(s) at a time{idle}")
        for index in awaited:  # the slot each holds: its recorded devices', or any; none if none is free
            used = self.record.read_state(index).get("devices")
            held = [s for s in self.free if s is not None and ",".join(s) == used][:1] or self.free[:1]
            self.awaited[index] = held
            for slot in held:
                self.free.remove(slot)

    def _start(self, index: int, slot: tuple[str, ...] | None) -> subprocess.Popen:
        """A task in a process group of its own. Unless OMP_NUM_THREADS is set, its torch threads are
        its slot's share of the cores: by default each takes them all, and tasks side by side spin."""
        env = {"OMP_NUM_THREADS": self.threads, **os.environ}
        env["MLFLOW_TRACKING_URI"] = self.record.data["tracking_uri"]
        if slot is not None:
            env["CUDA_VISIBLE_DEVICES"] = devices = ",".join(slot)
            say(f"sweep {self.record.id}: point {index} on CUDA_VISIBLE_DEVICES={devices}")
        command = [sys.executable, "-m", "prefshift", "sweep", "task", str(self.record.folder), str(index)]
        self.record.check_log(index)  # then opened through no link that appeared since
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW
        with open(os.open(self.record.log(index), flags, 0o600), "w") as log:  # the child keeps its own
            return subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)  # fmt: skip

    def live(self) -> dict[int, str]:
        """Reap the tasks that ended (printing their log), start queued points on the free slots;
        point → pending/running, this pool's and any other live task's on this machine."""
        for index, (proc, slot) in list(self.running.items()):
            if proc.poll() is not None:
                del self.running[index]
                head = f"--- experiment {self.record.names[index]}: exit {proc.returncode} ---"
                say(f"{head}\n{self.record.last_attempt(index)}")
                if group_alive(proc.pid):  # killed alone (`kill -9 <pid>`): its dvc and stage run on
                    forced = end_groups([proc.pid])[proc.pid]
                    say(f"point {index}: its task ended and left processes of its group; ended them{forced}")
                self.free.append(slot)  # only now: the slot's device is free of the point's work
        reap_adopted({proc.pid for proc, _ in self.running.values()})
        for index in [i for i in self.awaited if not locks.held(self.record.task_lock(i))]:
            self.free += self.awaited.pop(index)
            if self.record.read_state(index).get("state") != FINISHED:
                say(f"point {index}: the work left by its earlier task ended without a result; rerunning it")
                self.queued.append(index)
        while self.queued and self.free:
            index, slot = self.queued.pop(0), self.free.pop(0)
            self.running[index] = (self._start(index, slot), slot)
        return {
            **tasks_alive(self.record),
            **dict.fromkeys(self.queued, "pending"),
            **dict.fromkeys(self.running, "running"),
        }

    def stop(self) -> tuple[list[int], list[str]]:
        """End each running task's process group, and the group of each awaited point's dead task
        (its work, still running): (the points it ended, what was done)."""
        groups = {index: proc.pid for index, (proc, _) in self.running.items()}
        groups |= {index: pgid for index in self.awaited if (pgid := left_group(self.record, index))}
        forced = end_groups(list(groups.values()))
        for proc, _ in self.running.values():
            proc.wait()
        lines = [f"point {index}: ended process group {pgid}{forced[pgid]}" for index, pgid in groups.items()]
        return list(groups), lines


def end_groups(pgids: Sequence[int]) -> dict[int, str]:
    """SIGTERM to each process group (a stage records its run stopped), SIGKILL to what outlives the
    grace period; group → ' (SIGKILL)' where it took that, else ''."""
    for pgid in pgids:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    while any(map(group_alive, pgids)) and time.monotonic() < deadline:
        time.sleep(0.1)
    forced = {pgid: group_alive(pgid) for pgid in pgids}
    for pgid in (pgid for pgid, alive in forced.items() if alive):
        kill_group(pgid)
    return {pgid: " (SIGKILL)" if alive else "" for pgid, alive in forced.items()}


def left_group(record: SweepRecord, index: int) -> int | None:
    """The process group that a point's dead task left working, or None. The task led its own group
    (the pool starts it so) and recorded its pid, which is that group's id; the group counts only
    while it has members on this host and the point's lock is held, which its members hold."""
    state = record.read_state(index)
    pgid, here = state.get("pid"), state.get("host") == socket.gethostname()
    if here and isinstance(pgid, int) and locks.held(record.task_lock(index)) and group_alive(pgid):
        return pgid
    return None


@contextlib.contextmanager
def driving(record: SweepRecord, required: bool = True) -> Iterator[SweepRecord]:
    """Hold the sweep's `sweep.lock` inside: the one process that starts or submits its tasks and
    records them. A second one (a resume from another shell, or beside a waiting sweep) is refused,
    since it would start a point twice (two tasks in one clone) and write over the record. Yields
    the record as it stands once the lock is held. Where the sweep's folder cannot be locked (a
    cluster filesystem mounted without flock), a SLURM sweep goes on unlocked and says so."""
    lock = _take_driver(record, required)
    try:
        yield open_folder(record.folder)
    finally:
        if lock is not None:
            os.close(lock)


def _take_driver(record: SweepRecord, required: bool) -> int | None:
    """The sweep lock's descriptor; None where the folder cannot be locked and that is `required` not."""

    def refusal(holder: str) -> str:
        return (f"sweep {record.id} is being run by {holder}; stop it (Ctrl-C) or let it finish, "
                f"then `prefshift sweep resume {record.id}`")  # fmt: skip

    try:
        return locks.take(record.driver_lock, "prefshift sweep", refusal, locks.PROBE_GRACE_S)
    except OSError as err:
        if err.errno not in locks.UNLOCKABLE:
            raise
        if required:
            raise SweepError(
                f"{record.folder}: cannot be locked here ({err}); pass a --scratch on a local disk"
            ) from None
        say(f"sweep {record.id}: its folder cannot be locked ({err}); run one resume of it at a time")
        return None


def tasks_alive(record: SweepRecord) -> dict[int, str]:
    """Points whose lock is held, by their task or what it started: alive, whatever became of its pid."""
    return {i: "running" for i in range(len(record.points)) if locks.held(record.task_lock(i))}


def live(record: SweepRecord) -> dict[int, str]:
    """As another process sees the sweep: the running points, and those that a live sweep process
    has yet to start (queued by it, with no word from a task since it took them)."""
    driver = record.data.get("driver") or {}
    queued = driver.get("points", []) if locks.held(record.driver_lock) else []
    pending = [i for i in queued if record.read_state(i).get("time", "") < driver["since"]]
    return {**dict.fromkeys(pending, "pending"), **tasks_alive(record)}
