"""A sweep from start to report: checks, the record, launching, waiting, stopping, resuming, filing.

Stopping is the executor's job and the same for all: SIGINT, SIGTERM or SIGHUP on `prefshift sweep`
ends its tasks' process groups (local) or `scancel`s them (slurm), notes in the record what it
stopped, and exits with 128 + the signal's number; `prefshift sweep resume <id>` reruns only the
points without a result. The sweep's output may go to a terminal, a file or a pipe whose reader
went away: it never depends on that output (commands.say).
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prefshift.config.params import check_method
from prefshift.core.locks import private_dir
from prefshift.core.paths import Layout
from prefshift.core.signals import Terminated, exit_code, signals_as_exceptions, signals_ignored, stop_signal
from prefshift.pipeline.sweep import local, slurm
from prefshift.pipeline.sweep.baseline import check_committed, commit_command, snapshot, uncommitted_baseline
from prefshift.pipeline.sweep.commands import SweepError, run_dvc, run_git, say
from prefshift.pipeline.sweep.grid import check_distinct, experiment_name
from prefshift.pipeline.sweep.record import (
    FINISHED,
    LIVE,
    MISSING,
    SCRATCH_ENV,
    SweepRecord,
    create,
    default_scratch,
    load,
    point_state,
)
from prefshift.pipeline.sweep.results import file_results
from prefshift.tracking.runs import tracking_uri

EXECUTORS = ("local", "local-gpus", "slurm")
SWEEP_METHODS = ("anchor_last", "anchor_mid")
POLL_S = 10.0
SHARED_URI_SCHEMES = ("http://", "https://", "databricks")


@dataclass(frozen=True)
class Executor:
    """How the points run: `jobs` at once, on disjoint device sets, or as SLURM array tasks."""

    kind: str = "local"
    jobs: int = 1
    devices: tuple[str, ...] = ()
    resources: slurm.SlurmResources = field(default_factory=slurm.SlurmResources)

    def check(self) -> None:
        if self.kind not in EXECUTORS:
            raise SweepError(f"--executor {self.kind!r}: choose one of {', '.join(EXECUTORS)}")
        if self.kind == "slurm":
            self.resources.check()
        if self.devices and self.kind != "local-gpus":
            raise SweepError("--gpus: for --executor local-gpus (SLURM gives GPUs with --gpus-per-task N)")
        if self.kind == "local-gpus" and not self.devices:
            raise SweepError("--executor local-gpus: name the devices to use, e.g. --gpus 0,1,2,3")
        self.slots()

    def slots(self) -> local.Slots:
        return local.Slots(self.jobs, self.devices, max(1, self.resources.gpus_per_task))

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "jobs": self.jobs,
            "devices": list(self.devices),
            "resources": self.resources.as_dict(),
        }


def _executor(record: SweepRecord) -> Executor:
    saved = record.data["executor"]
    resources = slurm.SlurmResources(**saved["resources"])
    return Executor(saved["kind"], saved.get("jobs", 1), tuple(saved["devices"]), resources)


def checked_methods(methods: Sequence[str]) -> list[str]:
    methods = [check_method(m) for m in methods]
    if not methods or len(set(methods)) != len(methods):
        raise SweepError(f"--methods {','.join(methods)!r}: name each method to collect once, e.g. naive")
    return methods


def check_shared_tracking(uri: str) -> None:
    """Many nodes write to one MLflow store only through a server (sqlite over NFS is not safe)."""
    if not uri.startswith(SHARED_URI_SCHEMES):
        raise SweepError(
            f"MLflow tracking URI {uri!r}: a multi-machine sweep cannot log to a sqlite file or a folder; "
            "start `mlflow server --host 0.0.0.0 --port 5000 --backend-store-uri sqlite:///mlflow.db` on one "
            "machine and export MLFLOW_TRACKING_URI=http://<that host>:5000 before sweeping"
        )


def _cluster_remotes(root: Path, baseline: str) -> dict[str, Any]:
    """A cluster's tasks clone from `origin` (which must hold the baseline) and pull from and push to
    the default DVC remote, to which the baseline's outputs are pushed now."""
    try:
        url = run_git(root, "remote", "get-url", "origin").strip()
    except SweepError:
        raise SweepError(
            f"{root}: no git remote `origin`; the tasks clone the baseline from it and push their "
            "experiments to it: `git remote add origin <url>` (a bare repository on the shared filesystem)"
        ) from None
    run_git(root, "fetch", "--quiet", "origin")
    if not run_git(root, "branch", "--remotes", "--contains", baseline).strip():
        raise SweepError(
            f"baseline {baseline[:12]} is not on origin ({url}); the tasks clone it from there: "
            "`git push origin HEAD`"
        )
    if not run_dvc(root, ["remote", "default"], echo=False).strip():
        raise SweepError(
            f"{root}: no default DVC remote; the tasks pull the shared stages' outputs from it and push "
            "theirs: `dvc remote add -d <name> <url>` (a folder on the shared filesystem or an object store)"
        )
    say("sweep: dvc push (the baseline's outputs, for the tasks to pull instead of recomputing)")
    run_dvc(root, ["push"])
    return {"git_remote": url, "dvc_cache": None}


def _baseline(root: Path, executor: Executor) -> dict[str, Any]:
    """The commit the tasks clone and where they reach the project; on one machine, a note of what
    `dvc exp show` and `dvc exp diff` miss while the baseline's results are not committed."""
    baseline = run_git(root, "rev-parse", "HEAD").strip()
    if executor.kind == "slurm":
        check_committed(root)
        return {"baseline": baseline, **_cluster_remotes(root, baseline)}
    if uncommitted := uncommitted_baseline(root):
        say(
            f"note: HEAD does not hold these as they are in the workspace: {', '.join(uncommitted)}. "
            "The points start from the workspace all the same, but `dvc exp show` shows the baseline "
            "row without them and `dvc exp diff` has no baseline to compare with until you commit it:\n"
            f"  {commit_command(uncommitted)}"
        )
    cache = run_dvc(root, ["cache", "dir"], echo=False).strip().splitlines()[-1]
    return {"baseline": baseline, "git_remote": str(root), "dvc_cache": cache}


def _env(uri: str) -> dict[str, str]:
    return {"MLFLOW_TRACKING_URI": uri}


def dry_run_script(
    root: Path, executor: Executor, points: Sequence[Mapping[str, str]], scratch: Path | None
) -> str:
    """The sbatch script a SLURM sweep of `points` would submit (nothing is written or submitted)."""
    folder = Path(scratch or default_scratch(root)).resolve() / "<sweep id>"
    record = SweepRecord(folder, {"id": "<sweep id>", "points": list(points), "names": [], "jobs": []})
    return slurm.render_script(
        record, range(len(points)), executor.resources, _env(tracking_uri(Layout(root)))
    )


def start(
    root: Path,
    points: Sequence[Mapping[str, str]],
    methods: Sequence[str] = SWEEP_METHODS,
    executor: Executor = Executor(),
    scratch: Path | None = None,
    report: bool = True,
    wait: bool = True,
    poll_s: float = POLL_S,
) -> dict[str, Any]:
    """Check everything, record the sweep in its folder, run or submit its points; then (with
    `wait`) wait for them and file their results."""
    root = Path(root).resolve()
    methods = checked_methods(methods)
    executor.check()
    if executor.kind != "slurm" and not wait:
        raise SweepError(
            f"--no-wait: {executor.kind} runs its points from this command; use --executor slurm to leave"
        )
    check_distinct(root / "params.yaml", points)
    uri = tracking_uri(Layout(root))
    if executor.kind == "slurm":
        check_shared_tracking(uri)
        if shutil.which("sbatch") is None:
            raise SweepError(
                "--executor slurm: no `sbatch` on PATH; run the sweep where SLURM jobs can be submitted"
            )
    where = _baseline(root, executor)
    if scratch is None and not os.environ.get(SCRATCH_ENV, "").strip():
        private_dir(root)  # .prefshift/ with its own .gitignore: the clones never show in `git status`
    data = {
        "root": str(root),
        "points": [dict(p) for p in points],
        "names": [experiment_name(p) for p in points],
    }
    data.update(methods=methods, report=report, tracking_uri=uri, executor=executor.as_dict(), **where)
    record = create(Path(scratch or default_scratch(root)), data)
    if executor.kind != "slurm":
        _, record.data["overlay_deleted"] = snapshot(root, record.folder / "overlay")
        record.save()
    say(f"sweep {record.id}: {len(points)} point(s), folder {record.folder}")
    return _launch(root, record, executor, range(len(points)), wait, poll_s)


def _launch(
    root: Path, record: SweepRecord, executor: Executor, indices: Sequence[int], wait: bool, poll_s: float
) -> dict[str, Any]:
    """Run (local) or submit and wait for (slurm) points `indices`, then file; a stop ends them."""
    try:
        with signals_as_exceptions():
            if executor.kind == "slurm":
                job = slurm.submit(record, indices, executor.resources, _env(record.data["tracking_uri"]))
                say(f"sweep {record.id}: submitted job {job} ({len(indices)} array task(s))")
                if not wait:
                    return {
                        "sweep_id": record.id,
                        "folder": str(record.folder),
                        "experiments": [],
                        "report": None,
                    }
                wait_for(record, poll_s)
            else:
                say(f"sweep {record.id}: {executor.slots().count} point(s) at a time")
                local.run_points(record, indices, executor.slots())
    except (Terminated, KeyboardInterrupt) as stopped:
        signum = stop_signal(stopped)
        with signals_ignored():
            if executor.kind == "slurm":
                held, lines = slurm.stop(record)
                record.note_stop(signal.Signals(signum).name, held, lines)
                for line in lines:
                    say(f"  {line}")
            say(
                f"sweep {record.id}: stopped by {signal.Signals(signum).name}; `prefshift sweep resume "
                f"{record.id}` reruns the points without a result, finished ones are kept"
            )
        raise SystemExit(exit_code(signum)) from None
    return collect(root, record)


def point_states(record: SweepRecord) -> dict[int, str]:
    live = slurm.live(record) if record.data["executor"]["kind"] == "slurm" else local.live(record)
    return {i: point_state(record.read_state(i), live.get(i)) for i in range(len(record.points))}


def wait_for(record: SweepRecord, poll_s: float = POLL_S) -> dict[int, str]:
    """Poll until no point is pending or running, printing each change of state."""
    shown: dict[int, str] = {}
    while True:
        states = point_states(record)
        for index, state in states.items():
            if shown.get(index) != state:
                say(f"sweep {record.id}: point {index} ({record.names[index]}): {state}")
        shown = states
        if not any(state in LIVE for state in states.values()):
            return states
        time.sleep(poll_s)


def _why(state: str, entry: Mapping[str, Any]) -> str:
    """What ended a point that has no result, in one line."""
    if state == MISSING:
        return "never started"
    error = (entry.get("error") or "").strip().splitlines()
    if state == "failed":
        return f"failed during {entry.get('step')}: {error[-1] if error else 'no message'}"
    return (
        error[0]
        if error
        else f"ended during {entry.get('step')} without a word: cancelled, preempted or killed"
    )


def status_lines(record: SweepRecord) -> list[str]:
    """One line per grid point: its state, and for one not finished why and where its log is."""
    lines = []
    for index, state in point_states(record).items():
        line = f"{index}  {record.names[index]}  {state}"
        if state not in (FINISHED, *LIVE):
            line += f"  ({_why(state, record.read_state(index))})  log: {record.log(index)}"
        lines.append(line)
    return lines


def collect(root: Path, record: SweepRecord) -> dict[str, Any]:
    """Bring every point's experiment into the workspace, check its numbers and file it."""
    root = Path(root).resolve()
    unfinished = [line for line in status_lines(record) if line.split()[2] != FINISHED]
    if unfinished:
        raise SweepError(
            f"sweep {record.id}: {len(unfinished)} point(s) without a result; "
            f"`prefshift sweep resume {record.id}` reruns only those:\n  " + "\n  ".join(unfinished)
        )
    head = run_git(root, "rev-parse", "HEAD").strip()
    if head != record.data["baseline"]:
        raise SweepError(
            f"sweep {record.id} ran on {record.data['baseline'][:12]}, HEAD is {head[:12]}: "
            f"`git checkout {record.data['baseline'][:12]}` to collect it (its experiments belong to it)"
        )
    if not record.data.get("dvc_cache"):
        run_dvc(root, ["exp", "pull", "--no-cache", "--force", record.data["git_remote"], *record.names])
    indices = range(len(record.points))
    commits = [record.read_state(i)["commit"] for i in indices]
    logs = [record.last_attempt(i) for i in indices]
    result = file_results(root, record.points, commits, logs, record.data["methods"], record.data["report"])
    return {"sweep_id": record.id, "folder": str(record.folder), **result}


def resume(
    root: Path, sweep_id: str, scratch: Path | None = None, wait: bool = True, poll_s: float = POLL_S
) -> dict[str, Any]:
    """Rerun only the points that are missing, failed or stopped; finished ones never rerun, and
    ones still pending or running are left to run. A resumed point reuses its clone, so its training
    resumes from the checkpoint an earlier attempt left."""
    root = Path(root).resolve()
    record = load(Path(scratch or default_scratch(root)), sweep_id)
    executor = _executor(record)
    if executor.kind != "slurm" and not wait:
        raise SweepError(
            f"--no-wait: {executor.kind} runs its points from this command; use --executor slurm to leave"
        )
    states = point_states(record)
    todo = [i for i, state in states.items() if state not in (FINISHED, *LIVE)]
    for index in todo:
        say(f"sweep {record.id}: rerunning point {index} ({record.names[index]}, {states[index]})")
    if todo:
        return {**_launch(root, record, executor, todo, wait, poll_s), "resubmitted": todo}
    say(f"sweep {record.id}: no point is missing, failed or stopped; nothing to rerun")
    if not wait:
        return {"sweep_id": record.id, "folder": str(record.folder), "experiments": [], "report": None}
    if executor.kind == "slurm":
        wait_for(record, poll_s)
    return {**collect(root, record), "resubmitted": todo}


def status(root: Path, sweep_id: str, scratch: Path | None = None) -> list[str]:
    record = load(Path(scratch or default_scratch(Path(root))), sweep_id)
    head = f"sweep {record.id} ({record.data['executor']['kind']}, folder {record.folder})"
    stops = [
        f"stopped by {s['signal']} at {s['time']}: points {s['points']}" for s in record.data.get("stops", [])
    ]
    return [head, *stops, *status_lines(record)]


def collect_id(root: Path, sweep_id: str, scratch: Path | None = None) -> dict[str, Any]:
    return collect(root, load(Path(scratch or default_scratch(Path(root).resolve())), sweep_id))
