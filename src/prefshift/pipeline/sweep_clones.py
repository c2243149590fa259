"""Sweeps whose points run in clones of their own: `--executor slurm` and `--executor local-gpus`.

DVC's queue (the default executor, pipeline/sweep.py) is local-only and every experiment it runs
sees every GPU. These two executors instead run each grid point as a task (sweep_task) in its own
clone of the baseline commit; the point's experiment comes back to the user's workspace through
git (`dvc exp push` from the task, `dvc exp pull` here), and its numbers are then checked and filed
exactly as the queue's are (`sweep.check_experiments`, `sweep.file_results`).

What this module adds around the executors: the checks before anything is submitted (a committed
baseline that the tasks can clone, a DVC remote to pull from and push to, an MLflow server that
many machines can write to), waiting, `status`, `collect` and `resume`. A sweep's record lives in
its folder (sweep_record), so `--no-wait`, a cancelled task or a later shell lose nothing.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prefshift.core.locks import private_dir
from prefshift.core.paths import Layout
from prefshift.core.signals import Terminated, exit_code, signals_as_exceptions, stop_signal
from prefshift.pipeline import sweep_local_gpus, sweep_slurm
from prefshift.pipeline.sweep import (
    SweepError,
    check_distinct,
    check_experiments,
    checked_methods,
    commit_command,
    exp_show,
    experiment_name,
    experiment_rows,
    file_results,
    run_dvc,
    run_git,
    uncommitted_baseline,
)
from prefshift.pipeline.sweep_record import (
    FINISHED,
    MISSING,
    SCRATCH_ENV,
    SweepRecord,
    create,
    default_scratch,
    load,
    point_state,
)
from prefshift.pipeline.sweep_task import TASK_HEADER
from prefshift.tracking.runs import tracking_uri

EXECUTORS = ("queue", "slurm", "local-gpus")
LIVE = ("pending", "running")
POLL_S = 10.0
SHARED_URI_SCHEMES = ("http://", "https://", "databricks")


@dataclass(frozen=True)
class Executor:
    """How the points run: SLURM resources, or the local device list and set size."""

    kind: str
    resources: sweep_slurm.SlurmResources = field(default_factory=sweep_slurm.SlurmResources)
    devices: tuple[str, ...] = ()

    def check(self) -> None:
        if self.kind == "slurm":
            self.resources.check()
            if self.devices:
                raise SweepError(
                    "--gpus: SLURM gives each task its GPUs; ask for them with --gpus-per-task N"
                )
        elif self.kind == "local-gpus":
            if not self.devices:
                raise SweepError("--executor local-gpus: name the devices to use, e.g. --gpus 0,1,2,3")
            sweep_local_gpus.DevicePool(self.devices, self.per_task)
        else:
            raise SweepError(f"--executor {self.kind!r}: choose one of {', '.join(EXECUTORS)}")

    @property
    def per_task(self) -> int:
        return max(1, self.resources.gpus_per_task)


def _executor(record: SweepRecord) -> Executor:
    saved = record.data["executor"]
    resources = dict(saved.get("resources") or {})
    if resources.get("template"):
        resources["template"] = Path(resources["template"])
    return Executor(saved["kind"], sweep_slurm.SlurmResources(**resources), tuple(saved.get("devices") or ()))


def check_shared_tracking(uri: str) -> None:
    """Many nodes write to one MLflow store only through a server: one sqlite file or a local
    folder cannot take writers from several machines (locks over NFS are not to be trusted)."""
    if not uri.startswith(SHARED_URI_SCHEMES):
        raise SweepError(
            f"MLflow tracking URI {uri!r}: a multi-machine sweep cannot log to a sqlite file or a folder; "
            "start `mlflow server --host 0.0.0.0 --port 5000 --backend-store-uri sqlite:///mlflow.db` on one "
            "machine and export MLFLOW_TRACKING_URI=http://<that host>:5000 before sweeping"
        )


def check_baseline(root: Path) -> str:
    """HEAD's commit, once the workspace holds nothing the clones would miss: they check out the
    commit, so uncommitted changes (params, code, dvc.lock, metrics) would not be in them."""
    dirty = [line[3:] for line in run_git(root, "status", "--porcelain", "--untracked-files=no").splitlines()]
    missing = sorted(set(dirty) | set(uncommitted_baseline(root)))
    if missing:
        raise SweepError(
            f"{root}: not committed: {', '.join(missing[:6])}{' ...' if len(missing) > 6 else ''}; "
            f"each point runs in a clone of the baseline commit, so commit first: {commit_command(missing)}"
        )
    return run_git(root, "rev-parse", "HEAD").strip()


def _remotes(root: Path, executor: Executor, baseline: str) -> dict[str, Any]:
    """Where the tasks clone from and push to. SLURM: the `origin` git remote (which must hold the
    baseline) and the default DVC remote, to which the baseline's outputs are pushed now. One
    machine: the project itself, and its DVC cache shared."""
    if executor.kind == "local-gpus":
        cache = run_dvc(root, ["cache", "dir"], echo=False).strip().splitlines()[-1]
        return {"git_remote": str(root.resolve()), "dvc_cache": cache}
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
            "theirs: "
            "`dvc remote add -d <name> <url>` (a folder on the shared filesystem or an object store)"
        )
    sys.stderr.write(
        "sweep: dvc push (the baseline's outputs, for the tasks to pull instead of recomputing)\n"
    )
    run_dvc(root, ["push"])
    return {"git_remote": url, "dvc_cache": None}


def _env(uri: str) -> dict[str, str]:
    return {"MLFLOW_TRACKING_URI": uri}


def _submit(record: SweepRecord, executor: Executor, indices: Sequence[int]) -> None:
    if executor.kind == "slurm":
        job = sweep_slurm.submit(record, indices, executor.resources, _env(record.data["tracking_uri"]))
        sys.stderr.write(
            f"sweep {record.id}: submitted job {job} ({len(indices)} array task(s)); "
            f"script {record.script(len(record.data['jobs']))}\n"
        )
    else:
        pool = sweep_local_gpus.DevicePool(executor.devices, executor.per_task)
        sys.stderr.write(
            f"sweep {record.id}: {len(indices)} point(s), {pool.slots} at a time "
            f"on devices {','.join(executor.devices)}\n"
        )
        sweep_local_gpus.run_points(record, indices, pool)


def dry_run_script(
    root: Path, executor: Executor, points: Sequence[Mapping[str, str]], scratch: Path | None
) -> str:
    """The sbatch script a SLURM sweep of `points` would submit (nothing is written or submitted)."""
    folder = Path(scratch or default_scratch(root)).resolve() / "<sweep id>"
    record = SweepRecord(folder, {"id": "<sweep id>", "points": list(points), "names": [], "jobs": []})
    uri = tracking_uri(Layout(root))
    return sweep_slurm.render_script(record, range(len(points)), executor.resources, _env(uri))


def start(
    root: Path,
    points: Sequence[Mapping[str, str]],
    methods: Sequence[str],
    executor: Executor,
    scratch: Path | None = None,
    report: bool = True,
    wait: bool = True,
    poll_s: float = POLL_S,
) -> dict[str, Any]:
    """Check everything, record the sweep in its folder, submit or run its points; then (with
    `wait`) wait for them and collect."""
    root = Path(root).resolve()
    methods = checked_methods(methods)
    executor.check()
    if executor.kind == "local-gpus" and not wait:
        raise SweepError(
            "--no-wait: local-gpus runs its points from this command; use --executor slurm to leave"
        )
    check_distinct(root / "params.yaml", points)
    uri = tracking_uri(Layout(root))
    if executor.kind == "slurm":
        check_shared_tracking(uri)
        if shutil.which("sbatch") is None:
            raise SweepError(
                "--executor slurm: no `sbatch` on PATH; run the sweep where SLURM jobs can be submitted"
            )
    baseline = check_baseline(root)
    remotes = _remotes(root, executor, baseline)
    if scratch is None and not os.environ.get(SCRATCH_ENV, "").strip():
        private_dir(root)  # .prefshift/ with its own .gitignore: the clones never show in `git status`
    record = create(
        Path(scratch or default_scratch(root)),
        {
            "root": str(root),
            "baseline": baseline,
            "points": [dict(p) for p in points],
            "names": [experiment_name(p) for p in points],
            "methods": methods,
            "report": report,
            "tracking_uri": uri,
            "executor": {
                "kind": executor.kind,
                "resources": executor.resources.as_dict(),
                "devices": list(executor.devices),
            },
            **remotes,
        },
    )
    sys.stderr.write(f"sweep {record.id}: folder {record.folder}\n")
    _submit(record, executor, range(len(points)))
    if not wait:
        return {"sweep_id": record.id, "folder": str(record.folder), "experiments": [], "report": None}
    return finish(root, record, poll_s)


def point_states(record: SweepRecord) -> dict[int, str]:
    executor = record.data["executor"]["kind"]
    live = sweep_slurm.live(record) if executor == "slurm" else sweep_local_gpus.live(record)
    return {i: point_state(record.read_state(i), live.get(i)) for i in range(len(record.points))}


def wait_for(record: SweepRecord, poll_s: float = POLL_S) -> dict[int, str]:
    """Poll until no point is pending or running, printing each change of state."""
    shown: dict[int, str] = {}
    while True:
        states = point_states(record)
        for index, state in states.items():
            if shown.get(index) != state:
                sys.stderr.write(f"sweep {record.id}: point {index} ({record.names[index]}): {state}\n")
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
    """One line per grid point: its state, and for any not finished why and where its log is."""
    lines = []
    for index, state in point_states(record).items():
        entry = record.read_state(index)
        line = f"{index}  {record.names[index]}  {state}"
        if state not in (FINISHED, *LIVE):
            line += f"  ({_why(state, entry)})  log: {record.log(index)}"
        lines.append(line)
    return lines


def _last_attempt(log: Path) -> str:
    try:
        text = log.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return ""
    return text[text.rfind(TASK_HEADER) :] if TASK_HEADER in text else text


def collect(root: Path, record: SweepRecord) -> dict[str, Any]:
    """Bring every point's experiment into the workspace, check its numbers and file it."""
    root = Path(root).resolve()
    states = point_states(record)
    unfinished = [i for i, state in states.items() if state != FINISHED]
    if unfinished:
        raise SweepError(
            f"sweep {record.id}: {len(unfinished)} point(s) without a result; "
            f"`prefshift sweep resume {record.id}` reruns only those:\n  "
            + "\n  ".join(line for line in status_lines(record) if int(line.split()[0]) in unfinished)
        )
    head = run_git(root, "rev-parse", "HEAD").strip()
    if head != record.data["baseline"]:
        raise SweepError(
            f"sweep {record.id} ran on {record.data['baseline'][:12]}, HEAD is {head[:12]}: "
            f"`git checkout {record.data['baseline'][:12]}` to collect it (its experiments belong to it)"
        )
    names = record.names
    if not record.data.get("dvc_cache"):
        run_dvc(root, ["exp", "pull", "--no-cache", "--force", record.data["git_remote"], *names])
    commits = {name: record.read_state(i).get("commit") for i, name in enumerate(names)}
    rows = [
        {**row, "task_id": row["name"], "state": FINISHED}
        for row in experiment_rows(exp_show(root))
        if row["name"] in commits and row["rev"] == commits[row["name"]]
    ]
    done = check_experiments(rows, {name: name for name in names}, record.data["methods"], Layout(root))
    logs = {name: _last_attempt(record.log(i)) for i, name in enumerate(names)}
    result = file_results(root, record.points, done, logs, record.data["methods"], record.data["report"])
    return {"sweep_id": record.id, "folder": str(record.folder), **result}


def finish(root: Path, record: SweepRecord, poll_s: float = POLL_S) -> dict[str, Any]:
    """Wait, then collect. Stopped while waiting (Ctrl-C, SIGTERM), it stops waiting only: the
    points keep running on the cluster, and the sweep's id is all it takes to come back."""
    try:
        with signals_as_exceptions():
            wait_for(record, poll_s)
    except (Terminated, KeyboardInterrupt) as stop:
        signum = stop_signal(stop)
        sys.stderr.write(
            f"sweep {record.id}: stopped waiting ({signal.Signals(signum).name}); its points keep running. "
            f"Follow them with `prefshift sweep status {record.id}`, gather them with `prefshift sweep "
            f"collect {record.id}`, or cancel them with `scancel --name=prefshift-{record.id}`\n"
        )
        raise SystemExit(exit_code(signum)) from stop
    return collect(root, record)


def resume(
    root: Path, sweep_id: str, scratch: Path | None = None, wait: bool = True, poll_s: float = POLL_S
) -> dict[str, Any]:
    """Resubmit only the points that are missing, failed or stopped; finished ones never rerun,
    and ones still pending or running are left to run. A resumed point reuses its clone, so its
    training resumes from the checkpoint an earlier attempt left."""
    root = Path(root).resolve()
    record = load(Path(scratch or default_scratch(root)), sweep_id)
    executor = _executor(record)
    if executor.kind == "local-gpus" and not wait:
        raise SweepError(
            "--no-wait: local-gpus runs its points from this command; use --executor slurm to leave"
        )
    states = point_states(record)
    todo = [i for i, state in states.items() if state not in (FINISHED, *LIVE)]
    for index in todo:
        sys.stderr.write(
            f"sweep {record.id}: resubmitting point {index} ({record.names[index]}, {states[index]})\n"
        )
    if todo:
        _submit(record, executor, todo)
    else:
        sys.stderr.write(f"sweep {record.id}: no point is missing or failed; nothing to resubmit\n")
    if not wait:
        return {
            "sweep_id": record.id,
            "folder": str(record.folder),
            "resubmitted": todo,
            "experiments": [],
            "report": None,
        }
    return {**finish(root, record, poll_s), "resubmitted": todo}


def status(root: Path, sweep_id: str, scratch: Path | None = None) -> list[str]:
    record = load(Path(scratch or default_scratch(Path(root))), sweep_id)
    return [
        f"sweep {record.id} ({record.data['executor']['kind']}, folder {record.folder})",
        *status_lines(record),
    ]


def collect_id(root: Path, sweep_id: str, scratch: Path | None = None) -> dict[str, Any]:
    return collect(root, load(Path(scratch or default_scratch(Path(root).resolve())), sweep_id))
