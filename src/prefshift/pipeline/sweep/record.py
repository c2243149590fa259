"""A sweep's folder: what was asked, where each point stands, what stopped it.

Everything about a sweep lives in one folder named by its id, so a stop, a cancelled task, `--no-wait`
or a later shell lose nothing:

    <scratch>/<id>/sweep.json          points, baseline commit, executor, and each stop (`stops`)
    <scratch>/<id>/overlay/            the workspace's uncommitted state each task lays on its clone
    <scratch>/<id>/job-<n>.sbatch      each SLURM script, written before `sbatch` reads it
    <scratch>/<id>/logs/<index>.log    one log per point, every attempt appended
    <scratch>/<id>/points/<index>.json where the point's own task says it stands
    <scratch>/<id>/clones/<index>/     the point's clone, kept until it succeeds (a resumed task
                                       finds its training checkpoint there)
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prefshift.core.atomic import write_json
from prefshift.core.errors import PrefshiftError

SWEEP_FILE = "sweep.json"
SCRATCH_ENV = "PREFSHIFT_SWEEP_SCRATCH"
FINISHED = "success"
STOPPED = "stopped"
"""A task that started and ended without writing its end: cancelled, preempted, out of time or killed."""
MISSING = "missing"
"""A task that never started (cancelled while pending, or never launched)."""
LIVE = ("pending", "running")
TASK_HEADER = "=== sweep task"
"""Starts each attempt's part of a point's log, so the gatherer reads the last attempt alone."""


class SweepRecordError(PrefshiftError):
    """A sweep id with no folder, or a folder whose record cannot be read."""


def default_scratch(root: Path) -> Path:
    """`$PREFSHIFT_SWEEP_SCRATCH`, else the project's private `.prefshift/sweeps` (never versioned)."""
    configured = os.environ.get(SCRATCH_ENV, "").strip()
    return Path(configured) if configured else Path(root) / ".prefshift" / "sweeps"


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


@dataclass
class SweepRecord:
    folder: Path
    data: dict[str, Any]

    @property
    def id(self) -> str:
        return self.data["id"]

    @property
    def points(self) -> list[dict[str, str]]:
        return self.data["points"]

    @property
    def names(self) -> list[str]:
        return self.data["names"]

    def log(self, index: int) -> Path:
        return self.folder / "logs" / f"{index}.log"

    def clone(self, index: int) -> Path:
        return self.folder / "clones" / str(index)

    def state_file(self, index: int) -> Path:
        return self.folder / "points" / f"{index}.json"

    def script(self, number: int) -> Path:
        return self.folder / f"job-{number}.sbatch"

    def last_attempt(self, index: int) -> str:
        """The point's log since its last attempt began (TASK_HEADER in task.py)."""
        try:
            text = self.log(index).read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return ""
        return text[text.rfind(TASK_HEADER) :] if TASK_HEADER in text else text

    def save(self) -> None:
        write_json(self.folder / SWEEP_FILE, self.data)

    def note_stop(self, signal_name: str, points: list[int], lines: list[str]) -> None:
        """What a stop ended, kept with the sweep: the points it left without a result, and how."""
        points = [i for i in points if self.read_state(i).get("state") != FINISHED]
        stop = {"time": _now(), "signal": signal_name, "points": points, "done": lines}
        self.data.setdefault("stops", []).append(stop)
        self.save()

    def read_state(self, index: int) -> dict[str, Any]:
        path = self.state_file(index)
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as err:
            raise SweepRecordError(
                f"{path}: cannot read the point's state ({err}); delete it to rerun the point"
            ) from None

    def write_state(self, index: int, state: str, **fields: Any) -> None:
        """What the point's task says about itself, with where and in which process it runs."""
        entry = {**self.read_state(index), **fields, "state": state}
        entry.update(host=socket.gethostname(), pid=os.getpid(), time=_now())
        write_json(self.state_file(index), entry)


def create(scratch: Path, data: Mapping[str, Any]) -> SweepRecord:
    """A new folder, its id sortable by start time and unique between sweeps of one second."""
    sweep_id = time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + secrets.token_hex(2)
    folder = Path(scratch).resolve() / sweep_id
    for sub in ("logs", "points", "clones"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    record = SweepRecord(folder, {**data, "id": sweep_id, "jobs": []})
    record.save()
    return record


def load(scratch: Path, sweep_id: str) -> SweepRecord:
    folder = Path(scratch).resolve() / sweep_id
    if not (folder / SWEEP_FILE).is_file():
        known = sorted(p.parent.name for p in Path(scratch).glob(f"*/{SWEEP_FILE}"))
        hint = f"known here: {', '.join(known[-5:])}" if known else "no sweep has been started there"
        raise SweepRecordError(
            f"sweep {sweep_id!r}: no {folder / SWEEP_FILE} ({hint}); pass the --scratch the sweep used"
        )
    return open_folder(folder)


def open_folder(folder: Path) -> SweepRecord:
    path = Path(folder) / SWEEP_FILE
    try:
        return SweepRecord(Path(folder), json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError) as err:
        raise SweepRecordError(f"{path}: cannot read the sweep record ({err})") from None


def point_state(entry: Mapping[str, Any], live: str | None) -> str:
    """One point's state from its task's own entry and what the executor still runs (`live`:
    pending/running, or None). Finished stays finished (a requeued task exits at once); a task that
    said `running` and is gone was stopped from outside before it could say more."""
    own = entry.get("state")
    if own == FINISHED:
        return FINISHED
    if live:
        return live
    if own == "running":
        return STOPPED
    return own or MISSING
