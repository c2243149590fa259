"""A sweep's folder: what was asked, where each point stands, what stopped it.

Everything about a sweep lives in one folder named by its id, so a stop, a cancelled task,
`--no-wait` or a later shell lose nothing: `sweep.json` (points, baseline, executor, each stop),
`job-<n>.sbatch` (SLURM), `logs/<i>.log` (every attempt appended), `points/<i>.json` (where the
point's own task says it stands) and `clones/<i>/` (kept until the point succeeds: a resumed task
finds its checkpoint there). On one machine, `points/<i>.lock` is held by the point's live task and
all it started, and `sweep.lock` by the process running the sweep's tasks: a flock goes with its
holders however they end, so neither a killed task nor a pid handed to another process is ever
taken for a live one.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import socket
import stat
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from prefshift.core.atomic import write_json
from prefshift.core.locks import private_dir
from prefshift.core.reading import InputFileError, open_regular, special_kind
from prefshift.pipeline.sweep.commands import SweepError

SCRATCH_ENV = "PREFSHIFT_SWEEP_SCRATCH"
FINISHED, STOPPED, MISSING = "success", "stopped", "missing"
"""A task's end: done; ended from outside (cancelled, preempted, killed); never started."""
LIVE = ("pending", "running")
TASK_HEADER = "=== sweep task"
"""Starts each attempt's part of a point's log, so the gatherer reads the last attempt alone."""


class _Checked(BaseModel):
    model_config = ConfigDict(strict=True)  # JSON's types as written: "1" is no index, 1 no name


class _Executor(_Checked):
    kind: str  # the rest is run.Executor's, checked where it is rebuilt


class _Job(_Checked):
    job: str
    indices: list[int]


class _Stop(_Checked):
    time: str
    signal: str
    points: list[int]
    done: list[str]


class _Driver(_Checked):
    points: list[int]
    since: str


class _Stored(_Checked):
    """What the readers of sweep.json index, checked as it is opened: a damaged record (edited, cut
    short by a full disk) is one line naming the field, not a KeyError wherever it is first read."""

    id: str
    root: str
    subdir: str = ""  # the project's folder in its git repository (baseline.git_place)
    submodules: list[str] = []  # the repository's submodules to check out (baseline.checked_out_submodules)
    baseline: str
    points: list[dict[str, str]]
    names: list[str]
    methods: list[str]
    report: bool
    tracking_uri: str
    git_remote: str
    dvc_cache: str | None
    executor: _Executor
    jobs: list[_Job]
    stops: list[_Stop] = []
    driver: _Driver | None = None


class _PointState(_Checked):
    """What a point's task writes about itself (write_state); every key may be absent, but a
    finished point names its experiment's commit, which `collect` files."""

    state: str | None = None
    step: str | None = None
    error: str | None = None
    commit: str | None = None
    attempt: int | None = None
    time: str | None = None
    unpulled: list[str] = []

    @model_validator(mode="after")
    def _finished_names_its_commit(self) -> _PointState:
        if self.state == FINISHED and not self.commit:
            raise ValueError(f"state {FINISHED!r} without the experiment's commit")
        return self


DAMAGED = "the sweep record is damaged; start the sweep again (finished points are reused)"


def field_error(path: Path, err: ValidationError, what: str, prefix: str = "") -> SweepError:
    """One line: the file, the first field `err` found wrong (under `prefix`) and what to do."""
    first = err.errors()[0]
    where = prefix + (".".join(str(part) for part in first["loc"]) or "(top level)")
    return SweepError(f"{path}: {where}: {first['msg']}; {what}")


def _checked(path: Path, data: Any, model: type[BaseModel], what: str) -> dict[str, Any]:
    """`data`, once it has the fields `model` names with their types."""
    try:
        model.model_validate(data)
    except ValidationError as err:
        raise field_error(path, err, what) from None
    return data


def default_scratch(root: Path) -> Path:
    """`$PREFSHIFT_SWEEP_SCRATCH`, else the project's private `.prefshift/sweeps` (never versioned)."""
    configured = os.environ.get(SCRATCH_ENV, "").strip()
    return Path(configured) if configured else Path(root) / ".prefshift" / "sweeps"


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


@dataclass
class SweepRecord:
    folder: Path
    data: dict[str, Any]

    def __post_init__(self) -> None:
        self.id: str = self.data["id"]
        self.points: list[dict[str, str]] = self.data["points"]
        self.names: list[str] = self.data["names"]
        self.subdir: str = self.data.get("subdir", "")  # none in a record from before monorepos

    def log(self, index: int) -> Path:
        return self.folder / "logs" / f"{index}.log"

    def clone(self, index: int) -> Path:
        return self.folder / "clones" / str(index)

    def project(self, index: int) -> Path:
        """The project in the point's clone, where its task runs DVC: a monorepo's is a folder of it."""
        return self.clone(index) / self.subdir

    def check_log(self, index: int) -> None:
        """Refuse a point's log path that holds anything but a regular file: its task's output is
        appended there, into the file a link names, and a FIFO would block the sweep."""
        with contextlib.suppress(FileNotFoundError):
            if not stat.S_ISREG(mode := os.lstat(log := self.log(index)).st_mode):
                kind = "link" if stat.S_ISLNK(mode) else special_kind(mode)
                raise SweepError(f"{log}: a {kind}, not the point's log; move it away, then resume")

    def state_file(self, index: int) -> Path:
        return self.folder / "points" / f"{index}.json"

    def task_lock(self, index: int) -> Path:
        return self.folder / "points" / f"{index}.lock"

    @property
    def driver_lock(self) -> Path:
        return self.folder / "sweep.lock"

    def save(self) -> None:
        write_json(self.folder / "sweep.json", self.data)

    def log_text(self, index: int) -> str | None:
        """The point's whole log, None where it has none; anything but a regular file there (a FIFO
        would hang `status` for good) is refused by name."""
        if not os.path.lexists(log := self.log(index)):
            return None
        with open_regular(log, "point's log") as stream:
            return stream.read().decode("utf-8", errors="replace")

    def last_attempt(self, index: int) -> str:
        text = self.log_text(index) or ""
        return text[text.rfind(TASK_HEADER) :] if TASK_HEADER in text else text

    def note_stop(self, signal_name: str, points: Sequence[int], lines: list[str]) -> None:
        """What a stop ended, kept with the sweep: the points it left without a result, and how."""
        points = [i for i in points if self.read_state(i).get("state") != FINISHED]
        stop = {"time": now(), "signal": signal_name, "points": points, "done": lines}
        self.data.setdefault("stops", []).append(stop)
        self.save()

    def read_state(self, index: int) -> dict[str, Any]:
        path, fix = self.state_file(index), "delete it to rerun the point"
        if not os.path.lexists(path):
            return {}
        try:
            with open_regular(path, "point's state") as stream:  # never a FIFO's endless wait
                data = json.loads(stream.read())
        except InputFileError as err:
            raise SweepError(f"{err}; {fix}") from None
        except ValueError as err:
            raise SweepError(f"{path}: cannot read the point's state ({err}); {fix}") from None
        return _checked(path, data, _PointState, fix)

    def write_state(self, index: int, state: str, new_attempt: bool = False, **fields: Any) -> None:
        """What the point's task says about itself, with where and in which process it runs; a
        `new_attempt` starts afresh, so no earlier attempt's error or commit is read as its own."""
        entry = {**({} if new_attempt else self.read_state(index)), **fields, "state": state}
        entry.update(host=socket.gethostname(), pid=os.getpid(), time=now())
        write_json(self.state_file(index), entry)


def create(scratch: Path | None, data: Mapping[str, Any], root: Path = Path(".")) -> SweepRecord:
    """A new folder in `scratch` (by default the project's), its id sortable by start time and unique
    between sweeps of one second."""
    if scratch is None and not os.environ.get(SCRATCH_ENV, "").strip():
        private_dir(root)  # .prefshift/ with its own .gitignore: the clones never show in `git status`
    sweep_id = time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + secrets.token_hex(2)
    folder = Path(scratch or default_scratch(root)).resolve() / sweep_id
    record = SweepRecord(folder, {**data, "id": sweep_id, "jobs": []})
    folder.mkdir(parents=True, mode=0o700)  # the user's alone: its files carry the tracking URI
    for sub in ("logs", "points", "clones"):
        (record.folder / sub).mkdir()
    record.save()
    return record


def load(scratch: Path | None, sweep_id: str, root: Path = Path(".")) -> SweepRecord:
    """Sweep `sweep_id` of `scratch`, by default the project's (default_scratch)."""
    return open_folder(Path(scratch or default_scratch(root)).resolve() / sweep_id)


def open_folder(folder: Path) -> SweepRecord:
    path = Path(folder) / "sweep.json"
    if not path.is_file():
        known = sorted(p.parent.name for p in path.parent.parent.glob("*/sweep.json"))[-5:]
        hint = f"known there: {', '.join(known)}" if known else "no sweep has been started there"
        raise SweepError(f"sweep {path.parent.name!r}: no {path} ({hint}); pass the --scratch the sweep used")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise SweepError(f"{path}: cannot read the sweep record ({err})") from None
    except ValueError as err:  # cut short (a full disk) or edited: no JSON
        raise SweepError(f"{path}: not a sweep record ({err}); {DAMAGED}") from None
    if len(_checked(path, data, _Stored, DAMAGED)["names"]) != len(data["points"]):
        raise SweepError(f"{path}: names: not one per point; {DAMAGED}")
    return SweepRecord(Path(folder), data)


def point_state(entry: Mapping[str, Any], live: str | None) -> str:
    """One point's state from its task's own entry and what the executor still runs (`live`).
    Finished stays finished (a requeued task exits at once); a task that said `running` and is gone
    was stopped from outside before it could say more."""
    if (own := entry.get("state")) == FINISHED:
        return own
    return live or (STOPPED if own == "running" else own or MISSING)
