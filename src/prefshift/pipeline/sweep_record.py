"""The folder of a sweep whose points run in clones of their own (`--executor slurm|local-gpus`).

Such a sweep outlives the command that started it (`--no-wait`, a cancelled task, a later
`resume`), so everything about it lives in one folder on the shared filesystem, named by its id:

    <scratch>/<id>/sweep.json          what was asked: points, baseline commit, remotes, resources
    <scratch>/<id>/job-<n>.sbatch      each script submitted, written before `sbatch` sees it
    <scratch>/<id>/logs/<index>.log    one log per grid point, every attempt appended
    <scratch>/<id>/points/<index>.json where the point's own task says it stands
    <scratch>/<id>/clones/<index>/     the point's clone of the baseline (kept: a resumed task
                                       finds its training checkpoint there)

A point's state combines what its task wrote with what the executor still runs, because a task
that is cancelled, preempted or killed may never write again: see `point_state`.
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
"""A task that never started (cancelled while pending, or never submitted)."""


class SweepRecordError(PrefshiftError):
    """A sweep id with no folder, or a folder whose record cannot be read."""


def default_scratch(root: Path) -> Path:
    """`$PREFSHIFT_SWEEP_SCRATCH`, else the project's private folder (`.prefshift/sweeps`, never
    versioned): on a cluster the project itself usually sits on the shared filesystem."""
    configured = os.environ.get(SCRATCH_ENV, "").strip()
    return Path(configured) if configured else Path(root) / ".prefshift" / "sweeps"


def new_id() -> str:
    """Sortable by start time, unique between two sweeps started in the same second."""
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + secrets.token_hex(2)


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

    def save(self) -> None:
        write_json(self.folder / SWEEP_FILE, self.data)

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
        """What the point's task says about itself; where and in which process, for `point_state`."""
        entry = {
            **self.read_state(index),
            **fields,
            "state": state,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        write_json(self.state_file(index), entry)


def create(scratch: Path, data: Mapping[str, Any]) -> SweepRecord:
    sweep_id = new_id()
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
    pending/running, or None when the executor no longer has it).

    A finished point stays finished whatever the executor says (a requeued task exits at once).
    A task the executor still holds is pending or running. Otherwise the task's word counts, and a
    task that said `running` but is gone was stopped from outside before it could say more.
    """
    own = entry.get("state")
    if own == FINISHED:
        return FINISHED
    if live:
        return live
    if own == "running":
        return STOPPED
    return own or MISSING
