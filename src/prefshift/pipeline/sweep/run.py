"""A sweep from start to report: checks, the record, launching, waiting, stopping, resuming, filing.

Stopping is the executor's job and the same for all: SIGINT, SIGTERM or SIGHUP ends the sweep's
tasks' process groups (local) or `scancel`s them (slurm), notes in the record which points it left
without a result, and exits with 128 + the signal's number; `prefshift sweep resume <id>` reruns
only those. Nothing depends on where the sweep's output goes (commands.say).
"""

from __future__ import annotations

import signal
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from prefshift.config.params import check_method
from prefshift.core.paths import Layout
from prefshift.core.signals import Terminated, exit_code, signals_as_exceptions, signals_ignored, stop_signal
from prefshift.pipeline.sweep import local, slurm
from prefshift.pipeline.sweep.baseline import commit_command, snapshot, uncommitted_baseline
from prefshift.pipeline.sweep.commands import SweepError, run_dvc, run_git, say
from prefshift.pipeline.sweep.grid import check_distinct, experiment_name
from prefshift.pipeline.sweep.record import FINISHED, LIVE, MISSING, SweepRecord, create, load, point_state
from prefshift.pipeline.sweep.results import file_results
from prefshift.tracking.runs import tracking_uri

EXECUTORS = ("local", "local-gpus", "slurm")
SWEEP_METHODS = ("anchor_last", "anchor_mid")
POLL_S = 10.0


@dataclass(frozen=True)
class Executor:
    """How the points run: `jobs` at once, on disjoint device sets, or as SLURM array tasks."""

    kind: str = "local"
    jobs: int = 1
    devices: tuple[str, ...] = ()
    resources: slurm.SlurmResources = field(default_factory=slurm.SlurmResources)

    def check(self, wait: bool = True) -> None:
        if self.kind not in EXECUTORS:
            raise SweepError(f"--executor {self.kind!r}: choose one of {', '.join(EXECUTORS)}")
        if (self.kind == "local-gpus") != bool(self.devices):
            raise SweepError("--executor local-gpus takes its devices with --gpus 0,1,2,3, and only it")
        if self.kind != "slurm" and not wait:
            raise SweepError(f"--no-wait: {self.kind} runs its points from this command; slurm leaves")
        self.resources.check() if self.kind == "slurm" else self.slots()

    def slots(self) -> local.Slots:
        return local.Slots(self.jobs, self.devices, max(1, self.resources.gpus_per_task))

    @classmethod
    def of(cls, record: SweepRecord) -> Executor:
        """The executor a sweep was started with, as its record keeps it (`asdict`)."""
        saved = record.data["executor"]
        resources = slurm.SlurmResources(**saved["resources"])
        return cls(saved["kind"], saved["jobs"], tuple(saved["devices"]), resources)


def checked_methods(methods: Sequence[str]) -> list[str]:
    methods = [check_method(m) for m in methods]
    if not methods or len(set(methods)) != len(methods):
        raise SweepError(f"--methods {','.join(methods)!r}: name each method to collect once, e.g. naive")
    return methods


def _local_baseline(root: Path) -> dict[str, Any]:
    """On one machine the tasks clone the project itself and share its DVC cache; say what
    `dvc exp show` and `dvc exp diff` miss while the baseline's results are not committed."""
    if uncommitted := uncommitted_baseline(root):
        say(
            f"note: HEAD does not hold these as they are in the workspace: {', '.join(uncommitted)}. "
            "The points start from the workspace all the same, but `dvc exp show` shows the baseline "
            "row without them and `dvc exp diff` has nothing to compare with until you commit it:\n"
            f"  {commit_command(uncommitted)}"
        )
    return {"git_remote": str(root), "dvc_cache": run_dvc(root, ["cache", "dir"], echo=False).split()[-1]}


def start(
    root: Path,
    points: Sequence[Mapping[str, str]],
    methods: Sequence[str] = SWEEP_METHODS,
    executor: Executor = Executor(),
    scratch: Path | None = None,
    report: bool = True,
    wait: bool = True,
) -> dict[str, Any]:
    """Check everything, record the sweep in its folder, run or submit its points, then (with
    `wait`) file their results."""
    root, methods = Path(root).resolve(), checked_methods(methods)
    executor.check(wait)
    check_distinct(root / "params.yaml", points)
    uri, baseline = tracking_uri(Layout(root)), run_git(root, "rev-parse", "HEAD").strip()
    cluster = executor.kind == "slurm"
    where = slurm.prepare(root, baseline, uri) if cluster else _local_baseline(root)
    data = {"root": str(root), "baseline": baseline, "points": [dict(p) for p in points]}
    data.update(names=[experiment_name(p) for p in points], methods=methods, report=report)
    data.update(tracking_uri=uri, **where, executor=asdict(executor))
    record = create(scratch, data, root)
    if not cluster:
        record.data["overlay_deleted"] = snapshot(root, record.folder / "overlay")
        record.save()
    say(f"sweep {record.id}: {len(points)} point(s), folder {record.folder}")
    return _launch(root, record, executor, range(len(points)), wait)


def _launch(root: Path, record: SweepRecord, executor: Executor, indices: Sequence[int], wait: bool) -> dict:
    """Run (local) or submit and wait for (slurm) points `indices`, then file; a stop ends them."""
    try:
        with signals_as_exceptions():
            if executor.kind != "slurm":
                local.run_points(record, indices, executor.slots())
            elif slurm.submit(record, indices, executor.resources) and not wait:
                return _submitted(record)
            else:
                wait_for(record)
    except (Terminated, KeyboardInterrupt) as stopped:
        name = signal.Signals(signum := stop_signal(stopped)).name
        with signals_ignored():
            if executor.kind == "slurm":
                record.note_stop(name, *slurm.stop(record))
            for line in record.data.get("stops", [{}])[-1].get("done", []):
                say(f"  {line}")
            say(f"sweep {record.id}: stopped by {name}; `prefshift sweep resume {record.id}` reruns "
                "the points without a result, finished ones are kept")  # fmt: skip
        raise SystemExit(exit_code(signum)) from None
    return collect(root, record)


def _submitted(record: SweepRecord) -> dict[str, Any]:
    """What `--no-wait` returns: the sweep's id and folder, nothing filed yet."""
    return {"sweep_id": record.id, "folder": str(record.folder), "experiments": [], "report": None}


def point_states(record: SweepRecord) -> dict[int, str]:
    live = (slurm if record.data["executor"]["kind"] == "slurm" else local).live(record)
    return {i: point_state(record.read_state(i), live.get(i)) for i in range(len(record.points))}


def wait_for(record: SweepRecord) -> None:
    """Poll until no point is pending or running, printing each change of state."""
    shown: dict[int, str] = {}
    while True:
        for index, state in (states := point_states(record)).items():
            if shown.get(index) != state:
                say(f"sweep {record.id}: point {index} ({record.names[index]}): {state}")
        if not any(state in LIVE for state in states.values()):
            return
        shown = states
        time.sleep(POLL_S)


def status_lines(record: SweepRecord) -> list[str]:
    """One line per grid point: its state, and for one without a result why and where its log is."""
    lines = []
    for index, state in point_states(record).items():
        entry, line = record.read_state(index), f"{index}  {record.names[index]}  {state}"
        error = (entry.get("error") or "").strip().splitlines() or ["no message"]
        if state == "failed":
            line += f"  (failed during {entry.get('step')}: {error[-1]})"
        elif state not in (FINISHED, *LIVE):
            silent = f"ended during {entry.get('step')} without a word: cancelled, preempted or killed"
            line += f"  ({'never started' if state == MISSING else entry.get('error') or silent})"
        lines.append(line + (f"  log: {record.log(index)}" if state not in (FINISHED, *LIVE) else ""))
    return lines


def collect(root: Path, record: SweepRecord) -> dict[str, Any]:
    """Bring every point's experiment into the workspace, check its numbers and file it."""
    root = Path(root).resolve()
    if unfinished := [line for line in status_lines(record) if line.split()[2] != FINISHED]:
        raise SweepError(
            f"sweep {record.id}: {len(unfinished)} point(s) without a result; "
            f"`prefshift sweep resume {record.id}` reruns only those:\n  " + "\n  ".join(unfinished)
        )
    if (head := run_git(root, "rev-parse", "HEAD").strip()) != (baseline := record.data["baseline"]):
        raise SweepError(
            f"sweep {record.id} ran on {baseline[:12]}, HEAD is {head[:12]}: `git checkout {baseline[:12]}` "
            "to collect it (its experiments belong to it)"
        )
    if not record.data.get("dvc_cache"):
        run_dvc(root, ["exp", "pull", "--no-cache", "--force", record.data["git_remote"], *record.names])
    commits = [record.read_state(i)["commit"] for i in range(len(record.points))]
    result = file_results(root, record.points, commits, record.data["methods"], record.data["report"])
    return {"sweep_id": record.id, "folder": str(record.folder), **result}


def resume(root: Path, sweep_id: str, scratch: Path | None = None, wait: bool = True) -> dict[str, Any]:
    """Rerun only the points that are missing, failed or stopped; finished ones never rerun, and
    ones still pending or running are left to run. A resumed point reuses its clone, so its training
    resumes from the checkpoint an earlier attempt left."""
    record = load(scratch, sweep_id, root)
    executor = Executor.of(record)
    executor.check(wait)
    states = point_states(record)
    todo = [i for i, state in states.items() if state not in (FINISHED, *LIVE)]
    for index in todo:
        say(f"sweep {record.id}: rerunning point {index} ({record.names[index]}, {states[index]})")
    if todo:
        return {**_launch(Path(root), record, executor, todo, wait), "resubmitted": todo}
    say(f"sweep {record.id}: no point is missing, failed or stopped; nothing to rerun")
    if not wait:
        return _submitted(record)
    if executor.kind == "slurm":
        wait_for(record)
    return {**collect(root, record), "resubmitted": todo}


def status(root: Path, sweep_id: str, scratch: Path | None = None) -> list[str]:
    record = load(scratch, sweep_id, root)
    lines = [f"sweep {record.id} ({record.data['executor']['kind']}, folder {record.folder})"]
    lines += [
        f"stopped by {s['signal']} at {s['time']}: points {s['points']}" for s in record.data.get("stops", [])
    ]
    return lines + status_lines(record)


def collect_id(root: Path, sweep_id: str, scratch: Path | None = None) -> dict[str, Any]:
    return collect(root, load(scratch, sweep_id, root))
