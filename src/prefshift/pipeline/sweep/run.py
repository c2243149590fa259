"""A sweep from start to report: checks, the record, launching, waiting, stopping, resuming, filing.

Every executor stops the same way: SIGINT, SIGTERM or SIGHUP ends the sweep's tasks (their process
groups, or `scancel`), the record notes the points left without a result, and the sweep exits with
128 + the signal's number; `prefshift sweep resume <id>` reruns only those.
"""

from __future__ import annotations

import json
import shutil
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, get_args

from pydantic import TypeAdapter, ValidationError

from prefshift.config.params import Params, check_method
from prefshift.core.paths import Layout
from prefshift.core.signals import exit_code, signals_as_exceptions, signals_ignored, stop_signal
from prefshift.pipeline.sweep import local, slurm
from prefshift.pipeline.sweep.baseline import (
    check_committed,
    check_head,
    check_scratch,
    check_target,
    checked_out_submodules,
    dvc_cache_dir,
    git_place,
    launches_processes,
    open_pipeline,
    unversioned_params_inputs,
)
from prefshift.pipeline.sweep.commands import SweepError, run_dvc, run_git, say
from prefshift.pipeline.sweep.grid import check_distinct, experiment_name
from prefshift.pipeline.sweep.record import (
    DAMAGED,
    FINISHED,
    LIVE,
    MISSING,
    TASK_HEADER,
    SweepRecord,
    create,
    default_scratch,
    field_error,
    load,
    point_state,
)
from prefshift.pipeline.sweep.results import file_results, filing_problems
from prefshift.pipeline.sweep.trial import changed_inputs, check_clone_reads, stale_notes
from prefshift.tracking.runs import tracking_uri

ExecutorKind = Literal["local", "local-gpus", "slurm"]
EXECUTORS = get_args(ExecutorKind)
SWEEP_METHODS = ("anchor_last", "anchor_mid")
POLL_S = 10.0
TIME_LIMIT = "DUE TO TIME LIMIT"
"""What slurmstepd writes into a job's log as it ends a task that ran out of its --time."""
SQUEUE_PATIENCE_S = 600.0
"""How long a waiting SLURM sweep rides out squeue failing (a controller restart or failover)."""


@dataclass(frozen=True)
class Executor:
    """How the points run: `jobs` at once, on disjoint device sets, or as SLURM array tasks."""

    kind: ExecutorKind = "local"  # pydantic holds a record to it (Executor.of); check() the CLI's word
    jobs: int = 1
    devices: tuple[str, ...] = ()
    resources: slurm.SlurmResources = field(default_factory=slurm.SlurmResources)

    def check(self, wait: bool = True) -> None:
        if self.kind not in EXECUTORS:
            raise SweepError(f"--executor {self.kind!r}: choose one of {', '.join(EXECUTORS)}")
        if (self.kind == "local-gpus") != bool(self.devices):
            raise SweepError("--executor local-gpus takes its devices with --gpus 0,1,2,3, and only it")
        if self.kind != "local" and self.jobs != 1:
            raise SweepError(
                f"--jobs {self.jobs}: for --executor local alone; local-gpus runs a point per device set "
                "(--gpus, --gpus-per-task), slurm what it schedules"
            )
        if self.kind != "slurm" and replace(self.resources, gpus_per_task=0) != slurm.SlurmResources():
            raise SweepError(
                "--partition, --time, --account, --cpus-per-task, --sbatch-template: slurm's alone"
            )
        if (per_task := self.resources.gpus_per_task) < 0 or (self.kind == "local" and per_task):
            raise SweepError(f"--gpus-per-task {per_task}: 1 or more, for --executor local-gpus or slurm")
        if self.kind != "slurm" and not wait:
            raise SweepError(f"--no-wait: {self.kind} runs its points from this command; slurm leaves")
        self.resources.check() if self.kind == "slurm" else self.slots()

    def changed(self, **changes: Any) -> Executor:
        """This executor with what a resume asks to change (`jobs`, `devices`, a SlurmResources field
        such as a longer `time`); None keeps what the sweep was started with."""
        asked = {key: value for key, value in changes.items() if value is not None}
        own = {key: asked.pop(key) for key in ("jobs", "devices") if key in asked}
        if "template" in asked:  # read anew (read) once checked
            asked["template_body"] = None
        return replace(self, **own, resources=replace(self.resources, **asked))

    def read(self) -> Executor:
        """This executor as its record keeps it: a SLURM template's text read now (SlurmResources.read)."""
        return replace(self, resources=self.resources.read())

    def slots(self) -> local.Slots:
        return local.Slots(self.jobs, self.devices, max(1, self.resources.gpus_per_task))

    @classmethod
    def of(cls, record: SweepRecord) -> Executor:
        """The executor a sweep was started with, as its record keeps it (`asdict`), its fields checked."""
        path = record.folder / "sweep.json"
        try:  # strict: a `jobs` of "2" or true is a damaged record, not two jobs
            executor = TypeAdapter(cls).validate_json(json.dumps(record.data["executor"]), strict=True)
        except ValidationError as err:
            raise field_error(path, err, DAMAGED, "executor.") from None
        return executor


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
    root, methods = Path(root).resolve(), [check_method(m) for m in methods]
    if not methods or len(set(methods)) != len(methods):
        raise SweepError(f"--methods {','.join(methods)!r}: name each method to collect once, e.g. naive")
    executor.check(wait)
    executor = executor.read()
    loaded = check_distinct(root / "params.yaml", points, methods)
    problems, notes = preflight(root, points, loaded, methods, executor, scratch)
    if problems:
        raise SweepError(problems[0])
    for note in notes:
        say(f"sweep: {note}")
    uri, baseline = tracking_uri(Layout(root)), run_git(root, "rev-parse", "HEAD").strip()
    cluster = executor.kind == "slurm"
    # One machine: the tasks clone this project and share its DVC cache; a cluster's, the remotes.
    top, subdir = git_place(root)
    cache = None if cluster else dvc_cache_dir(root)
    where = slurm.prepare(root, baseline, uri) if cluster else {"git_remote": top, "dvc_cache": cache}
    data = {"root": str(root), "subdir": subdir, "submodules": checked_out_submodules(top)}
    data.update(baseline=baseline, points=[dict(p) for p in points], methods=methods, report=report)
    data["names"] = [experiment_name(p) for p in points]
    record = create(scratch, {**data, "tracking_uri": uri, **where, "executor": asdict(executor)}, root)
    say(f"sweep {record.id}: {len(points)} point(s), folder {record.folder}")
    with local.driving(record, not cluster) as record:
        try:
            return _launch(root, record, executor, range(len(points)), wait)
        except SweepError:
            if cluster and not record.data["jobs"]:  # sbatch refused it (a partition, a resource)
                # A timed-out sbatch may have queued a job nonetheless: cancelled by the sweep's name.
                held, done = slurm.stop(record)
                if held:
                    say(f"sweep {record.id}: sbatch failed; its folder is kept: {'; '.join(done)}")
                else:
                    shutil.rmtree(record.folder, ignore_errors=True)  # new, and this process's alone
                    say(f"sweep {record.id}: nothing was submitted; its folder is removed")
            raise


def preflight(
    root: Path,
    points: Sequence[Mapping[str, str]],
    loaded: Sequence[Params],
    methods: Sequence[str],
    executor: Executor,
    scratch: Path | None,
) -> tuple[list[str], list[str]]:
    """(each refusal the sweep earns, what it notes) before anything runs: `start` raises the first
    refusal and says the notes, a dry run prints them all, so that it passes only what the sweep
    itself would. The pipeline is read once for all of them (open_pipeline). A trial clone backs the
    checks up once they pass: it sees what they do not name."""
    root = Path(root).resolve()
    scratch = Path(scratch).resolve() if scratch else None  # as given here, not from the project
    head = _refusals([lambda: check_head(root)])
    cluster = [] if executor.kind != "slurm" else _refusals([  # the rest need its remotes (slurm.prepare)
        lambda: slurm.check_tracking(tracking_uri(Layout(root))),
        lambda: slurm.check_folder(scratch or default_scratch(root)),
    ])  # fmt: skip
    filing = filing_problems(root, points, loaded, methods)
    try:
        with open_pipeline(root) as repo:
            problems = head or _refusals([lambda: check_committed(repo)])
            problems += _refusals([lambda: check_target(repo), lambda: check_scratch(repo, scratch)])
            problems += cluster + filing + _refusals([lambda: unversioned_params_inputs(repo, loaded)])
            changed = changed_inputs(repo)
            problems += [] if problems else _refusals([lambda: check_clone_reads(repo, changed)])
            return problems, stale_notes(repo, changed) + device_notes(repo, executor)
    except SweepError as err:  # no pipeline to read (every check of it is in a _refusals)
        return [*head, str(err), *cluster, *filing], []


def _refusals(checks: Sequence[Callable[[], Sequence[str] | None]]) -> list[str]:
    """What each of `checks` refuses, each said once: the refusals it returns, or the one it raises
    (SweepError, a failing git command's too), so that one check failing drops no other's."""
    problems: list[str] = []
    for check in checks:
        try:
            found = check() or []
        except SweepError as err:
            found = [str(err)]
        problems += [problem for problem in found if problem not in problems]
    return problems


def device_notes(repo: Any, executor: Executor) -> list[str]:
    """A point given several GPUs whose stages each run as one process uses the first alone."""
    if (per_task := executor.resources.gpus_per_task) < 2 or launches_processes(repo):
        return []
    return [
        f"--gpus-per-task {per_task}: each stage of a point runs as one process and trains on the first "
        f"of its {per_task} devices (no command in dvc.yaml starts `accelerate launch` or `torchrun`; see "
        "docs/scaling.md), so the rest stay idle; --gpus-per-task 1 runs more points at once"
    ]


def _launch(
    root: Path,
    record: SweepRecord,
    executor: Executor,
    indices: Sequence[int],
    wait: bool,
    awaited: Sequence[int] = (),
    keep: Mapping[str, Any] | None = None,
) -> dict:
    """Start (local) or submit (slurm) points `indices`, wait for every point, then file; the caller
    holds the sweep (local.driving). A stop (or, on one machine, any error) ends the tasks; a
    cluster's tasks outlive an error of this command. On one machine, points `awaited` run a dead
    task's work: they are rerun if it ends without a result."""
    pool, waiting = None if executor.kind == "slurm" else local.Pool(record, executor.slots()), False
    try:
        with signals_as_exceptions():
            if pool:
                pool.launch(indices, awaited)
            elif indices:
                slurm.submit(record, indices, executor.resources)
            if keep is not None:  # a resume's new executor, now that its points are launched with it
                record.data["executor"] = dict(keep)
                record.save()
            if not wait:
                return dict(sweep_id=record.id, folder=str(record.folder), experiments=[], report=None)
            waiting = True
            wait_for(record, pool)
    except BaseException as stopped:
        if (signum := stop_signal(stopped)) is None and pool is None:
            if isinstance(stopped, SweepError) and waiting:
                raise SweepError(  # squeue's controller gone a while, say: the jobs are SLURM's
                    f"{stopped}; the sweep's SLURM jobs go on: `prefshift sweep status {record.id}`, then "
                    f"`prefshift sweep collect {record.id}` (or `resume`)"
                ) from None
            raise
        with signals_ignored():
            name = signal.Signals(signum).name if signum else type(stopped).__name__
            record.note_stop(name, *(pool.stop() if pool else slurm.stop(record)))
            for line in record.data["stops"][-1]["done"]:
                say(f"  {line}")
        if signum is None:
            raise
        say(f"sweep {record.id}: stopped by {name}; `prefshift sweep resume {record.id}` reruns "
            "the points without a result, finished ones are kept")  # fmt: skip
        raise SystemExit(exit_code(signum)) from None
    return collect(root, record)


def point_states(record: SweepRecord, live: Mapping[int, str] | None = None) -> dict[int, str]:
    """Each point's state from its task's own word and what is pending or running: by default as any
    process sees it (squeue, or a live task's pid on this machine)."""
    if live is None:
        live = (slurm if record.data["executor"]["kind"] == "slurm" else local).live(record)
    return {i: point_state(record.read_state(i), live.get(i)) for i in range(len(record.points))}


def wait_for(record: SweepRecord, pool: local.Pool | None = None) -> None:
    """Poll until no point is pending or running, printing each change of state; a local pool starts
    its queued points as slots free up, and is waited for until its last task has exited (a task
    says `success` before it removes its clone, and the pool prints its log once it is reaped). A
    SLURM sweep rides out squeue failing for up to SQUEUE_PATIENCE_S: the jobs are SLURM's."""
    shown: dict[int, str] = {}
    failing_since = None  # since when squeue has failed: a controller restart or failover
    while True:
        try:
            states = point_states(record, pool.live() if pool else None)
            seen, failing_since = shown_states(record, states), None
        except SweepError as err:
            if pool or (failing_since and time.monotonic() - failing_since > SQUEUE_PATIENCE_S):
                raise
            if failing_since is None:  # said once an outage; every state is said again after it
                say(f"sweep {record.id}: {err}; trying again for up to {SQUEUE_PATIENCE_S / 60:.0f} min")
                failing_since, shown = time.monotonic(), {}
            time.sleep(POLL_S)
            continue
        for index, state in seen.items():
            if shown.get(index) != state:
                say(f"sweep {record.id}: point {index} ({record.names[index]}): {state}")
        if not any(state in LIVE for state in states.values()) and not (pool and pool.running):
            return
        shown = seen
        time.sleep(local.POLL_S if pool else POLL_S)


def shown_states(record: SweepRecord, states: Mapping[int, str]) -> dict[int, str]:
    """States as a person reads them: a SLURM point pending with squeue's reason, so that one that
    asks for what never comes (PartitionConfig) does not wait in silence; a finished one that
    recomputed stages DVC could not pull, so that the next points are not left to do the same."""
    cluster = record.data["executor"]["kind"] == "slurm"
    why = slurm.pending_reasons(record) if cluster and "pending" in states.values() else {}
    why |= {
        i: f"recomputed {', '.join(unpulled)}: DVC could not pull {'it' if len(unpulled) == 1 else 'them'} "
        "from the remote the sweep pushed the baseline to; check that the nodes reach it"
        for i, state in states.items()
        if state == FINISHED and (unpulled := record.read_state(i).get("unpulled"))
    }
    return {i: f"{state} ({why[i]})" if i in why and state in ("pending", FINISHED) else state
            for i, state in states.items()}  # fmt: skip


def _never_started(record: SweepRecord, index: int) -> str:
    """Why a point's task never said where it stood: it ended before its first step (stopped while
    it waited for a lock, which its log shows), its job ended before it began (a template's set-up
    failed, say, loudly or not: its log is made as it starts), or it never ran; on a cluster, a
    node that cannot write the sweep's folder leaves no log either."""
    if (text := record.log_text(index)) is None:
        if record.data["executor"]["kind"] == "slurm":
            return (f"never started: no log; cancelled while pending, or its node could not write "
                    f"{record.log(index).parent} (is the sweep's folder on a filesystem the nodes "
                    "share?)")  # fmt: skip
        return "never started"
    if not (text := text.strip()):
        return "its job began (its log was made) and ended before prefshift's task wrote a line"
    last = text.splitlines()[-1]
    last = last if len(last) <= 200 else "..." + last[-200:]
    if TASK_HEADER in record.last_attempt(index):
        return f"its task ended before its first step: {last}"
    return f"its job ended before prefshift's task began: {last}"


def _gist(error: str) -> str:
    """The line of a failure that says what went wrong: DVC's last `ERROR:` line (its output ends
    in a help banner), else the last line."""
    lines = [line.strip() for line in error.strip().splitlines() if line.strip()] or ["no message"]
    return next((line for line in reversed(lines) if line.startswith("ERROR")), lines[-1])


def status_lines(record: SweepRecord) -> list[str]:
    """One line per grid point: its state, and for one without a result why and where its log is."""
    states = point_states(record)
    lines, shown = [], shown_states(record, states)
    for index, state in states.items():
        line = f"{index}  {record.names[index]}  {shown[index]}"
        if state not in (FINISHED, *LIVE):
            line += f"  ({_why_not_finished(record, index, state)})  log: {record.log(index)}"
        lines.append(line)
    return lines


def _why_not_finished(record: SweepRecord, index: int, state: str) -> str:
    entry = record.read_state(index)
    if state == "failed":
        return f"failed during {entry.get('step')}: {_gist(entry.get('error') or '')}"
    if state == MISSING:
        return _never_started(record, index)
    if TIME_LIMIT in record.last_attempt(index):
        return (f"its job ran out of its time; `prefshift sweep resume {record.id} --time <longer>` goes on "
                "from its checkpoint")  # fmt: skip
    return (
        entry.get("error")
        or f"ended during {entry.get('step')} without a word: cancelled, preempted or killed"
    )


def collect(root: Path, record: SweepRecord) -> dict[str, Any]:
    """Bring every point's experiment into the workspace, check its numbers and file it."""
    root = Path(root).resolve()
    if unfinished := [line for line in status_lines(record) if line.split()[2] != FINISHED]:
        raise SweepError(
            f"sweep {record.id}: {len(unfinished)} point(s) without a result; `prefshift sweep resume "
            f"{record.id}` reruns those stopped or failed, and waits for the rest:\n  "
            + "\n  ".join(unfinished)
        )
    if (head := run_git(root, "rev-parse", "HEAD").strip()) != (baseline := record.data["baseline"]):
        raise SweepError(
            f"sweep {record.id} ran on {baseline[:12]}, HEAD is {head[:12]}: `git checkout {baseline[:12]}` "
            "to collect it (its experiments belong to it)"
        )
    if not record.data.get("dvc_cache"):  # not echoed: it says "No experiments to pull." of ones already here
        remote, names = record.data["git_remote"], record.names
        say(f"sweep {record.id}: dvc exp pull of {len(names)} experiment(s) from {remote}")
        run_dvc(root, ["exp", "pull", "--no-cache", "--force", remote, *names], echo=False)
    commits = [record.read_state(i)["commit"] for i in range(len(record.points))]
    result = file_results(root, record.points, commits, record.data["methods"], record.data["report"])
    return {"sweep_id": record.id, "folder": str(record.folder), **result}


def resume(
    root: Path, sweep_id: str, scratch: Path | None = None, wait: bool = True, **changes: Any
) -> dict[str, Any]:
    """Rerun only the points that are missing, failed or stopped; finished ones never rerun, and
    ones still pending or running are waited for (on one machine, such a point runs what a dead task
    left, and is rerun if that ends without a result). A resumed point reuses its clone, so its
    training resumes from the checkpoint an earlier attempt left, also with the `changes` to its
    executor (Executor.changed) that the points rerun ask for: a point out of its `time` gets more.
    `root` finds the sweep's folder; the experiments go to the project it ran from, wherever resume
    runs."""
    record = load(scratch, sweep_id, root)
    executor = (recorded := Executor.of(record)).changed(**changes)
    try:
        executor.check(wait)
    except SweepError as err:  # named for `--executor`, which a resume does not take
        raise SweepError(
            f"sweep {record.id} runs with --executor {recorded.kind}, as its resumes do: {err}"
        ) from None
    executor = executor.read()
    with local.driving(record, executor.kind != "slurm") as record:
        return _rerun(_project(record), record, executor, wait, recorded)


def _described(executor: Executor) -> str:
    """What a resume's points ask for, as the options that say it."""
    if executor.kind == "slurm":
        return " ".join(executor.resources.options()) or "the cluster's defaults"
    if executor.kind == "local-gpus":
        per_task = max(1, executor.resources.gpus_per_task)
        return f"--gpus {','.join(executor.devices)} --gpus-per-task {per_task}"
    return f"--jobs {executor.jobs}"


def _rerun(
    root: Path, record: SweepRecord, executor: Executor, wait: bool, recorded: Executor
) -> dict[str, Any]:
    """`resume`'s work, once it holds the sweep; `root` is the project the sweep ran from. Holding
    it, no other process can have points queued: on one machine only live tasks count. The record
    keeps `executor` in place of the `recorded` one once the points it reruns are launched with it
    (a refused resume, or one with nothing to rerun, changes nothing)."""
    states = point_states(
        record, slurm.live(record) if executor.kind == "slurm" else local.tasks_alive(record)
    )
    todo = [i for i, state in states.items() if state not in (FINISHED, *LIVE)]
    if todo and executor.kind == "slurm":  # the points log to the server the sweep started with
        slurm.check_tracking(record.data["tracking_uri"], "its points log there: start it at that address")
    awaited = [i for i, state in states.items() if state in LIVE]
    for index in (*todo, *awaited):
        what = "rerunning" if index in todo else "waiting for"
        say(f"sweep {record.id}: {what} point {index} ({record.names[index]}, {states[index]})")
    if not todo and not awaited:
        say(f"sweep {record.id}: no point is missing, failed or stopped; nothing to rerun")
    keep = asdict(executor) if todo and executor != recorded else None
    if keep and _asked(executor) != _asked(recorded):  # not a template's text read for an older record
        say(f"sweep {record.id}: the points it reruns now run with {_described(executor)}")
    return {**_launch(root, record, executor, todo, wait, awaited, keep), "resubmitted": todo}


def _asked(executor: Executor) -> Executor:
    """What an executor asks for, whatever text of its template was read when."""
    return replace(executor, resources=replace(executor.resources, template_body=None))


def status(root: Path, sweep_id: str, scratch: Path | None = None) -> list[str]:
    record = load(scratch, sweep_id, root)
    lines = [f"sweep {record.id} ({record.data['executor']['kind']}, folder {record.folder})"]
    lines += [
        f"stopped by {s['signal']} at {s['time']}: points {s['points']}" for s in record.data.get("stops", [])
    ]
    return lines + status_lines(record)


def collect_id(root: Path, sweep_id: str, scratch: Path | None = None) -> dict[str, Any]:
    """Collect the sweep into the project it ran from (its record's root), wherever this runs."""
    record = load(scratch, sweep_id, root)
    return collect(_project(record), record)


def _project(record: SweepRecord) -> Path:
    """The project the sweep ran from, where its experiments go; one moved or deleted since is
    refused by name (its tasks would fail one by one on a git error about a missing path)."""
    if not (root := Path(record.data["root"])).is_dir():
        raise SweepError(
            f"sweep {record.id}: its project {root} is gone (moved or deleted); move it back, or start "
            "the sweep again from where it is now (finished points are reused)"
        )
    return root
