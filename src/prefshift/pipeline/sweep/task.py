"""One grid point in its own clone (`prefshift sweep task <folder> <index>`): what every executor runs.

Each task has its own clone because tasks sharing one workspace would block each other on DVC's
lock (treeverse/dvc#7419). It clones, runs `dvc exp run`, pushes the experiment back, and writes
where it stands (`points/<i>.json`) before each step and at its end (docs/cluster.md).
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import shutil
import socket
import time
from collections.abc import Sequence
from pathlib import Path

from prefshift.config.params import ConfigError, get_dotted, read_yaml
from prefshift.core import locks
from prefshift.core.atomic import atomic_path, write_text
from prefshift.core.signals import Terminated, exit_code, signals_as_exceptions
from prefshift.pipeline.sweep.baseline import TARGET, cache_config
from prefshift.pipeline.sweep.commands import SweepError, run_dvc, run_git
from prefshift.pipeline.sweep.grid import dvc_value
from prefshift.pipeline.sweep.record import FINISHED, STOPPED, TASK_HEADER, SweepRecord, open_folder

DVC_LOCKS = ("lock", "rwlock", "rwlock.lock")
UNPULLED = re.compile(r"^Unable to pull data for stage: '(.+)'$", re.MULTILINE)
"""What `dvc exp run --pull` says of an unchanged stage whose outputs it could not pull, as it
goes on to run it (dvc/stage/__init__.py, Stage.reproduce)."""
LOCK_REPORT_S = 600.0
"""How often a task waiting for a lock (its point's on SLURM, its experiment's) says
so in the point's log."""


def experiment_ref(baseline: str, name: str) -> str:
    """Where DVC keeps experiment `name` of commit `baseline`."""
    return f"refs/exps/{baseline[:2]}/{baseline[2:]}/{name}"


def experiment_commit(root: Path, name: str) -> str:
    """The commit of experiment `name` on the current HEAD, or ''."""
    ref = experiment_ref(run_git(root, "rev-parse", "HEAD").strip(), name)
    return run_git(root, "for-each-ref", "--format=%(objectname)", ref).strip()


def _fetch_earlier(record: SweepRecord, index: int, project: Path, say) -> None:
    """Fetch the point's experiment if the user's repository already holds it on this baseline (an
    earlier sweep ran the point): the task then pushes it back instead of running it again, so a
    sweep repeated as it was reruns nothing. One whose params differ from the point's (two values
    that make one name, such as `a/b` and `a_b`) is dropped from the clone, and the point runs.
    `project` is the project's folder in the clone, and `./` names a file in it."""
    ref = experiment_ref(record.data["baseline"], record.names[index])
    if not run_git(project, "ls-remote", "origin", ref).strip():
        return
    run_git(project, "fetch", "--quiet", "origin", f"+{ref}:{ref}")
    point, where = record.points[index], f"{ref}:./params.yaml"
    try:
        theirs = read_yaml(run_git(project, "show", where), where)
        ours = run_git(project, "show", f"{record.data['baseline']}:./params.yaml")
        same = all(get_dotted(theirs, key) == dvc_value(ours, key, value) for key, value in point.items())
    except (KeyError, ConfigError, SweepError):  # no params.yaml there, no such key, no YAML
        same = False
    if not same:
        run_git(project, "update-ref", "-d", ref)
        say(f"an earlier experiment named {record.names[index]} has other params; running the point")


def _clone(record: SweepRecord, index: int, say) -> Path:
    """The point's clone: made once, atomically (a half-made clone is never taken for one), reused by
    later attempts. It is made in scratch that prefshift can prove its own (`core.scratch`), so what
    an attempt killed mid-clone left is removed by the next, and nothing else. A reused clone's DVC
    locks are a dead attempt's (one killed mid-write leaves an unreadable one): the point's lock,
    handed down to all an attempt starts, is free only once none of it runs."""
    clone, remote = record.clone(index), record.data["git_remote"]
    if clone.is_symlink() or (clone.exists() and not _made_here(clone)):
        raise SweepError(
            f"{clone}: not a clone this sweep made (a link, or a folder without a .git of its own); "
            "a task runs dvc and deletes files there: move it away, then resume"
        )
    if clone.exists():
        say(f"reusing {clone} (an earlier attempt's checkpoints stay)")
        for name in DVC_LOCKS:
            (record.project(index) / ".dvc" / "tmp" / name).unlink(missing_ok=True)
        return clone
    say(f"cloning {remote} at {record.data['baseline'][:12]} into {clone}")
    cache = record.data.get("dvc_cache")  # one machine: what `dvc cache dir --local` writes
    config = cache_config(cache, Path(record.data["root"])) if cache else None
    submodules = record.data.get("submodules", [])
    with atomic_path(clone, directory=True) as staging:
        clone_baseline(remote, staging, record.data["baseline"], submodules, record.subdir, config)
    return clone


def clone_baseline(
    remote: str,
    into: Path,
    baseline: str,
    submodules: Sequence[str],
    subdir: str,
    config_local: str | None,
    shared: bool = False,
) -> None:
    """Clone `remote` into `into` at commit `baseline`, its `submodules` checked out, as a point's
    task does and the trial (trial.py) must, to see what a point will. With `config_local` (one
    machine), the clone is written the project's `.dvc/config.local` (cache_config), and its
    submodules come from `remote`'s own checkouts of them; `shared` borrows `remote`'s objects
    instead of copying them, for a clone gone within seconds."""
    borrow = ["--shared"] if shared else []
    run_git(into.parent, "clone", "--quiet", *borrow, "--no-checkout", remote, str(into))
    run_git(into, "checkout", "--quiet", "--detach", baseline)
    check_out_submodules(into, submodules, Path(remote) if config_local is not None else None)
    if config_local is not None:
        (into / subdir / ".dvc" / "config.local").write_text(config_local, encoding="utf-8")


def check_out_submodules(clone: Path, paths: Sequence[str], workspace: Path | None) -> None:
    """Check out submodules `paths` (from the repository's top, nested ones after the one holding
    them) in `clone`, each at the commit its superproject records: a stage may read them, and
    without them every point failed on a missing dep. On one machine each is cloned from the
    `workspace`'s own checkout of it, with no network; a cluster's task (no `workspace`) has git
    fetch it from its URL, as `git submodule update` resolves it against the clone's origin."""
    for path in paths:
        holder, name = (clone / path).parent, Path(path).name  # the repository that records it
        if workspace is not None:
            commit = run_git(holder, "rev-parse", f"HEAD:./{name}").strip()
            run_git(clone, "clone", "--quiet", "--no-checkout", str(workspace / path), str(clone / path))
            run_git(clone / path, "checkout", "--quiet", "--detach", commit)
        else:  # git refuses a submodule from a local path unless told (CVE-2022-39253): the user's own
            run_git(holder, "-c", "protocol.file.allow=always", "submodule", "--quiet", "update", "--init",
                    "--", name)  # fmt: skip


def _made_here(clone: Path) -> bool:
    """A folder holding a git repository of its own, as `git clone` left it: not a link to one."""
    git = clone / ".git"
    return clone.is_dir() and git.is_dir() and not git.is_symlink()


def _run(record: SweepRecord, index: int, project: Path, say) -> list[str]:
    """Run the point's experiment unless it exists; return the stages DVC could not pull and so
    recomputed (UNPULLED): on a cluster, a DVC remote the node does not reach, which left alone
    would retrain the shared stages in every point."""
    _fetch_earlier(record, index, project, say)
    if experiment_commit(project, name := record.names[index]):
        say(f"experiment {name} is on this baseline already (an earlier attempt or sweep); pushing it")
        return []
    overrides = [f"-S{key}={value}" for key, value in record.points[index].items()]
    args = ["exp", "run", "--name", name, *overrides]
    if record.data.get("dvc_cache"):  # --summary: a line of counts, not one per output
        restored = run_dvc(project, ["checkout", "--summary", "--allow-missing"], echo=False).strip()
        say(f"the baseline's outputs, from the project's DVC cache: {restored}")
    else:
        args.append("--pull")
    say(f"dvc {' '.join(args)} {TARGET}")
    if code := baseline_code(record, index):
        say(f"the stages import prefshift from {code}, the baseline's, not the workspace's")
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [code, os.environ.get("PYTHONPATH")]))} if code else {}
    return UNPULLED.findall(run_dvc(project, [*args, TARGET], env=env))


def baseline_code(record: SweepRecord, index: int) -> str | None:
    """Where the point's stages import prefshift from, when it runs from the project's own source
    (an editable install, as `make` sets it up): the clone's copy, the baseline's code. Left to the
    install, they imported the workspace's source, which may change while the sweep runs, and a
    point started after an edit ran the new code as an experiment of the baseline. None where
    prefshift is installed from elsewhere (its code is then no part of the project)."""
    import prefshift

    package = Path(prefshift.__file__).resolve().parent
    top = Path(record.data["root"]).joinpath(*[".."] * len(Path(record.subdir).parts)).resolve()
    if not package.is_relative_to(top):  # the workspace's repository, which each point clones
        return None
    return str(record.clone(index) / package.parent.relative_to(top))


def _push(record: SweepRecord, index: int, project: Path, say) -> str:
    if not (commit := experiment_commit(project, name := record.names[index])):
        raise SweepError(f"{project}: `dvc exp run` left no experiment named {name}")
    say(f"dvc exp push origin {name}")
    run_dvc(project, ["exp", "push", "--force", "--no-cache", "origin", name])
    if not record.data.get("dvc_cache"):
        say("dvc push (the experiment's outputs, to the project's DVC remote)")
        run_dvc(project, ["push"])
    return commit


def run_point(folder: Path, index: int) -> int:
    """Run grid point `index` of the sweep in `folder`; return the task's exit status. The task holds
    the point's lock and hands it down to its dvc and the stages dvc runs: a task killed alone
    (`kill -9 <pid>`) leaves them working in the clone, and no later attempt may start beside them
    (two dvc in one clone) until the last of them ends. On one machine the lock is also the point's
    liveness for every other process (a cluster's is squeue's)."""
    record = open_folder(folder)
    if not 0 <= index < len(record.points):  # a negative one would run another point under its own name
        raise SweepError(f"sweep {record.id}: no point {index}; its points are 0 to {len(record.points) - 1}")
    name, say = record.names[index], functools.partial(_say, record.names[index])
    attempt = int(record.read_state(index).get("attempt", 0)) + 1
    devices = os.environ.get("CUDA_VISIBLE_DEVICES", "(unset)")
    print(f"{TASK_HEADER} {record.id} point {index} ({name}) attempt {attempt} on {socket.gethostname()}, "
          f"CUDA_VISIBLE_DEVICES={devices} ===", flush=True)  # fmt: skip
    with contextlib.ExitStack() as held:
        if (lock := take_point(record, index, say)) is not None:
            held.callback(os.close, lock)
            held.enter_context(locks.handed_down(lock))
        if (experiment := take_experiment(record, index, say)) is not None:
            held.callback(os.close, experiment)
        return _attempt(record, index, say, attempt=attempt, devices=devices)


def take_point(record: SweepRecord, index: int, say) -> int | None:
    """The point's lock, held. On one machine the pool never starts a task whose point is held, so a
    held one is refused. A SLURM task waits for it: a resume resubmits a point whose task was killed
    alone, and a cluster that tracks processes by parentage (proctrack/linuxproc) lets the work that
    task started outlive its job. Where the sweep's folder takes no flock (a cluster filesystem
    mounted without locks), a SLURM task goes on unlocked, as squeue is its liveness there."""
    cluster, path = record.data["executor"]["kind"] == "slurm", record.task_lock(index)

    def held_by(holder: str) -> str:
        return f"point {index} of sweep {record.id} is being run by {holder} or what it started"

    try:
        return _take(path, f"prefshift sweep task {index}", held_by, say, wait=cluster)
    except OSError as err:
        if not cluster or err.errno not in locks.UNLOCKABLE:
            raise
        say(f"{path} cannot be locked ({err}); running unlocked")
        return None


def take_experiment(record: SweepRecord, index: int, say) -> int | None:
    """The lock of the point's experiment, in the project it goes to: a task of another sweep
    running the same point on the same baseline (one grid swept twice at once) holds it, and this
    one waits, then reuses that experiment (`_fetch_earlier`) instead of training it a second time.
    A SLURM task whose node does not see the project, or whose filesystem takes no lock there, goes
    on without it and says so: the lock saves a second training, the clone needs none of it."""
    root, name = Path(record.data["root"]), record.names[index]
    if not root.is_dir():  # one machine: a moved project, which fails at clone
        if not record.data.get("dvc_cache"):
            say(f"{root}: not on this node; another sweep of this grid at once may train this point too")
        return None

    def held_by(holder: str) -> str:
        return f"experiment {name} is being run by {holder}, a task of another sweep"

    # The lock goes with its task, but the dvc and stage of a task killed with its sweep run on,
    # holding that task's point lock, which each holder writes down beside this one. Waited for
    # without this lock, lest that sweep's resumed task wait for it while holding its point lock.
    path = locks.lock_file(root, root / experiment_ref(record.data["baseline"], name))
    last, mine, waited = path.with_name(path.name + ".point"), record.task_lock(index), 0
    while True:
        try:
            locks.private_dir(root)
            fd = _take(path, f"prefshift sweep task {index} of sweep {record.id}", held_by, say, wait=True)
        except OSError as err:  # no flock on that filesystem, or a project the node may not write
            say(f"{path} cannot be locked ({err}); another sweep of this grid at once may train it too")
            return None
        theirs = Path(last.read_text(encoding="utf-8")) if last.is_file() else mine
        if theirs == mine or not locks.held(theirs):
            write_text(last, str(mine))
            return fd
        os.close(fd)
        if waited % LOCK_REPORT_S == 0:
            say(f"experiment {name}: work left by a killed task of another sweep runs on; waiting for it")
        time.sleep(1.0)
        waited += 1


def _take(path: Path, command: str, held_by, say, wait: bool) -> int:
    """Lock `path` (locks.take); one another process holds is refused, or with `wait` waited for,
    a line in the point's log every LOCK_REPORT_S saying so."""
    patience = locks.PROBE_GRACE_S
    while True:
        try:
            return locks.take(path, command, held_by, patience)
        except locks.LockedError as err:
            if not wait:
                raise
            say(f"{err}; waiting for it to end")
            patience = LOCK_REPORT_S


def _say(name: str, message: str) -> None:
    """A line of the point's log: the time, the point's experiment name, the message."""
    print(f"{time.strftime('%H:%M:%S')} [{name}] {message}", flush=True)


def _attempt(record: SweepRecord, index: int, say, **started: str | int) -> int:
    """One attempt at the point, its lock held: clone, run, push, each step written to its state
    (the first with what `started` it: its number, its devices)."""
    if record.read_state(index).get("state") == FINISHED:
        say("finished by an earlier attempt; nothing to do")
        return 0
    step = "clone"
    record.write_state(index, "running", new_attempt=True, step=step, **started)
    try:
        with signals_as_exceptions():
            clone = _clone(record, index, say)
            record.write_state(index, "running", step=(step := "run"))
            unpulled = _run(record, index, record.project(index), say)
            record.write_state(index, "running", step=(step := "push"))
            commit = _push(record, index, record.project(index), say)
    except (Terminated, KeyboardInterrupt) as stop:
        record.write_state(index, STOPPED, step=step, error=f"stopped by a signal during {step}")
        say(f"stopped by a signal during {step}")
        return exit_code(getattr(stop, "signum", 2))
    except SweepError as err:
        record.write_state(index, "failed", step=step, error=str(err)[-2000:])
        say(f"failed during {step}: {err}")
        return 1
    record.write_state(index, FINISHED, step="done", commit=commit, unpulled=unpulled)
    shutil.rmtree(clone, ignore_errors=True)
    say(f"done: experiment {record.names[index]} at {commit[:12]}")
    return 0
