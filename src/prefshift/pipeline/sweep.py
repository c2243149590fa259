"""`prefshift sweep`: a grid of params queued as DVC experiments, results filed for the report.

This module is the default executor, DVC's queue on this machine, and the helpers every executor
shares (grid parsing, names, the checks of an experiment's numbers, filing). Points that run in
clones of their own, through SLURM or one device set each on local GPUs, are sweep_clones.py's.

Each grid point is queued with `dvc exp run --queue --name sweep-<key>-<value> -S key=value
report`, then `dvc queue start -j N` runs the queue (N = `--jobs`, default 1: each run already
uses every core for torch). DVC stashes the workspace at queue time, applies the overrides in
a temporary copy, reruns only what they invalidate (dvc.lock covers the rest) and commits the
result to an experiment ref. The user's params.yaml and outputs are never touched.

Why the target is `report` and not `evaluate@<method>`: an experiment commit then is one
consistent pipeline state (every stage the override invalidates has rerun, not only the
collected methods), its aggregate reports/metrics.json and reports/plots/ are its own, and
every metrics file is in it. DVC `git add`s the `cache: false` outputs of every stage in the
target's pipeline, run or skipped, before committing an experiment, so the experiments carry
all metrics whatever the workspace's git state. Untracked outputs reach the temporary copy
with `-C` (see `copy_paths`); committed ones come with the commit. `promote` is never run:
it would register experiment models in MLflow.

The sweep does not trust its experiments blindly: it follows the queue through
`dvc exp show --json` (by task id, so earlier experiments of the same name cannot be
confused with this sweep's), echoes each finished task's `dvc queue logs`, fails with the
log of any failed task, and checks that every experiment's row holds numeric WRG, mean AOG
and mean NTS for each collected method before filing it. A failed experiment's row in
`dvc exp show` shows the baseline's numbers, so only `success` rows count.

Stopping. Grid points are compared by the params they resolve to before anything is queued:
two points that are one experiment (`1,1.0`, or two axes setting one param) are refused. On
Ctrl-C, SIGTERM or SIGHUP the sweep stops what it started before it exits (with 128 + the
signal's number): `dvc queue stop --kill` for the project's queue workers and running
experiments, then every process of the queue still alive (a killed experiment's stage outlives
it), found in /proc and ended with SIGTERM (SIGKILL after a grace period), and the sweep's tasks
still queued are removed. It prints each step. The queue is the project's: a worker that another
command started in this project is stopped too.

Results are read from the experiment commit (`git show <rev>:reports/metrics/<m>/seed-<k>.json`,
for each seed the experiment's params list) and written to reports/sweeps/ as the report
expects them: the full metrics JSON (with the confidence intervals that `dvc exp show` drops,
lists not being metrics to DVC) plus {"sweep": {<dotted key>: <value from the experiment's
params.yaml>, "seed": <replicate seed>}}. These copies outlive
the experiments (which `dvc exp gc`/`remove` discard, and which `dvc exp show` lists only
under their own baseline commit), so the report's ablation tables keep them.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import itertools
import json
import math
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from prefshift.config.params import (
    apply_overrides,
    check_method,
    load_params,
    parse_params,
    read_yaml,
    split_override,
)
from prefshift.core.atomic import write_json
from prefshift.core.errors import PrefshiftError
from prefshift.core.paths import Layout
from prefshift.core.signals import Terminated, exit_code, signals_as_exceptions, signals_ignored, stop_signal
from prefshift.tracking.runs import proc_info

SWEEP_METHODS = ("anchor_last", "anchor_mid")
TARGET = "report"  # see the module docstring: one consistent pipeline state per experiment
HEADLINE = ("wrg", "mean_aog", "mean_nts")
DONE_STATES = ("success", "failed")
SEEDED_METRICS = re.compile(r"reports/metrics/(?P<method>[^/]+)/seed-\d+\.json")
POLL_S = 10.0  # one `dvc exp show --json` per poll: about a second of CPU
QUEUE_TMP = "/.dvc/tmp/exps/"
QUEUE_SETTLE_S = 300.0
"""How long `exp_show` retries a failure on the queue's own temporary files while a worker runs:
an executor being set up or cleaned up takes seconds, longer under load."""
HANDED_BACK = re.compile(r"/\.dvc/tmp/exps/run/(?P<rev>[0-9a-f]{40})/(?P=rev)\.run")
"""The info file of a task that DVC lists as running. Missing while no worker runs, it marks a
task handed back: see `exp_show`."""
EXP_SHOW_TIMEOUT_S = 30.0
"""A hung call is killed and retried like a failed one. `dvc exp show` sometimes blocks on a futex
while the queue worker cleans up (seen in CI: 300 s lost to one call that the retry answered at
once; later 120 s to the previous bound, in the test suite). A healthy call on these projects
takes about a second (1.2 s on the embedded default's full pipeline), so 30 s leaves a 25x
margin for a loaded machine, and a call slower than that is retried like a hung one."""
WAIT_S = 24 * 3600.0  # a bound for a queue whose worker died; experiments keep running past it
STOP_COMMAND_S = 120.0  # `dvc queue stop --kill` answers in about a second; bounded for a loaded machine
STOP_SETTLE_S = 30.0  # the workers' own shutdown after `dvc queue stop --kill`: seconds on this machine
STOP_GRACE_S = 30.0  # what a stage gets after SIGTERM to end its MLflow run and clean up, before SIGKILL
GONE_POLLS = 3  # polls in a row without a task before it counts as removed, not between two states
_REF_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
MAX_NAME = 120


class SweepError(PrefshiftError):
    """A grid that cannot be parsed, or an experiment that failed or left no result."""


def split_values(text: str) -> list[str]:
    """Split `a,b,[c,d]` on top-level commas, so list values like `[0.25,0.5]` stay whole."""
    values, depth, current = [], 0, ""
    for char in text:
        depth += {"[": 1, "{": 1, "]": -1, "}": -1}.get(char, 0)
        if char == "," and depth == 0:
            values.append(current.strip())
            current = ""
        else:
            current += char
    values.append(current.strip())
    return values


def parse_grid(specs: Sequence[str]) -> dict[str, list[str]]:
    """`-S key=v1,v2` items → {key: [v1, v2]} (values kept as text; DVC parses them)."""
    if not specs:
        raise SweepError("nothing to sweep: pass at least one -S key=value1,value2")
    grid: dict[str, list[str]] = {}
    for spec in specs:
        keys, values = split_override(spec)
        key = ".".join(keys)
        if key in grid:
            raise SweepError(f"-S {key}: given twice; list every value in one -S")
        points = split_values(values)
        if any(not v for v in points):
            raise SweepError(f"-S {spec!r}: empty value in the list")
        grid[key] = points
    return grid


def grid_points(grid: Mapping[str, Sequence[str]]) -> list[dict[str, str]]:
    keys = list(grid)
    return [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*(grid[k] for k in keys))]


def _shown(point: Mapping[str, str]) -> str:
    return " ".join(f"{key}={value}" for key, value in point.items())


def check_distinct(params_path: Path, points: Sequence[Mapping[str, str]]) -> None:
    """Load each point's params (a typo or a bad value fails here, before anything is queued) and
    refuse two points that are one experiment.

    Points are compared by the params they resolve to, not by their text: `1` and `1.0`, or `1e-4`
    and `0.0001`, are one value once parsed, and two axes can set one param. Two experiments of one
    name would also collide in DVC's queue, so distinct points whose names coincide are refused too.

    The file is read and parsed once (a grid file's hundreds of points made parsing it again per
    point the dry run's main cost); each point's overrides go onto a copy of that tree.
    """
    load_params(params_path)  # the file itself, checked once with its own errors
    raw = read_yaml(Path(params_path).read_text(encoding="utf-8"), str(params_path))
    by_params: dict[str, Mapping[str, str]] = {}
    by_name: dict[str, Mapping[str, str]] = {}
    for point in points:
        overrides = [f"{k}={v}" for k, v in point.items()]
        tree = apply_overrides(copy.deepcopy(raw), overrides)
        params = parse_params(tree, " -S ".join([str(params_path), *overrides]))
        resolved = json.dumps(params.resolved(), sort_keys=True)
        for seen, key, why in (
            (by_params, resolved, "give the same params"),
            (by_name, experiment_name(point), "get the same experiment name"),
        ):
            if key in seen:
                raise SweepError(
                    f"grid points {_shown(seen[key])!r} and {_shown(point)!r} {why}: list each value once "
                    "(values are compared as parsed, so 1 and 1.0 are one value); nothing was queued"
                )
            seen[key] = point


def experiment_name(point: Mapping[str, str]) -> str:
    """A git-ref-safe readable name, e.g. `sweep-anchor.lambda-0.01`.

    A point that sets many params (a grid file's bundles) would give a name past what a ref's file
    name may hold (255 bytes), so a long name keeps its readable start and ends with a hash of the
    whole: still one name per point, the same on every run."""
    parts = [f"{key}-{_REF_UNSAFE.sub('_', value).strip('_')}" for key, value in point.items()]
    name = "sweep-" + "-".join(parts)
    if len(name) <= MAX_NAME:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:12]
    return f"{name[: MAX_NAME - len(digest) - 1].rstrip('-_.')}-{digest}"


def sweep_filename(method: str, sweep: Mapping[str, Any]) -> str:
    parts = [f"{key}={json.dumps(value, separators=(',', ':'))}" for key, value in sweep.items()]
    return "__".join([method, *parts]).replace("/", "_") + ".json"


def run_git(root: Path, *args: str) -> str:
    done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True)
    if done.returncode != 0:
        raise SweepError(f"git {' '.join(args)} (in {root}) failed: {done.stderr.strip()}")
    return done.stdout


def dvc_command(args: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    """The dvc installed with prefshift (else PATH's), with its directory leading the child's PATH:
    queue workers and the experiments they run call plain `dvc` and `prefshift`."""
    bin_dir = Path(sys.executable).parent
    sibling = bin_dir / "dvc"
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    return [str(sibling) if sibling.exists() else "dvc", *args], env


def run_dvc(root: Path, args: Sequence[str], echo: bool = True) -> str:
    """Run dvc, echoing its output as it comes (unless told not to); return that output."""
    command, env = dvc_command(args)
    proc = subprocess.Popen(
        command, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    lines = []
    for line in proc.stdout:
        if echo:
            sys.stderr.write(line)
        lines.append(line)
    output = "".join(lines)
    if proc.wait() != 0:
        raise SweepError(f"`dvc {' '.join(args)}` failed (exit {proc.returncode}):\n{output[-3000:]}")
    return output


def start_queue(root: Path, jobs: int) -> None:
    """`dvc queue start -j N`, waiting for the command only.

    It leaves a daemon behind that holds the command's stdout until the queue is empty, so
    its output goes to a file, not to a pipe that would be read to its end.
    """
    command, env = dvc_command(["queue", "start", "--jobs", str(jobs)])
    with tempfile.TemporaryFile("w+") as out:
        code = subprocess.run(command, cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT).returncode
        out.seek(0)
        output = out.read()
    sys.stderr.write(output)
    if code != 0:
        raise SweepError(f"`dvc queue start --jobs {jobs}` failed (exit {code}):\n{output[-3000:]}")


def _tracked_dirs(root: Path) -> set[Path]:
    """Directories that hold a git-tracked file: the ones a temporary experiment copy has."""
    files = run_git(root, "ls-files", "-z").split("\0")
    return {parent for f in files if f for parent in Path(f).parents}


def pipeline_outputs(root: Path) -> list[tuple[Path, bool, bool]]:
    """(path relative to root, DVC-cached?, declared as metrics?) of every stage output."""
    from dvc.repo import Repo

    with Repo(str(root)) as repo:
        base = root.resolve()
        return [
            (Path(out.fs_path).resolve().relative_to(base), out.use_cache, bool(out.metric))
            for stage in repo.index.stages
            for out in stage.outs
        ]


def copy_paths(root: Path) -> tuple[list[str], list[str]]:
    """Paths to pass with `-C`, and the `cache: false` outputs that cannot be passed.

    DVC copies a `-C` path only where its parent directory exists in the temporary copy,
    so each untracked output is carried by its shallowest ancestor that git does not
    track. An ancestor that would also carry DVC-cached outputs (models, parquet) is
    skipped instead: those come from the cache, and the stage owning the output reruns.
    An untracked dvc.lock is carried too, or every stage would count as never run.
    """
    rel = [(path, use_cache) for path, use_cache, _ in pipeline_outputs(root)]
    tracked_files = set(filter(None, run_git(root, "ls-files", "-z").split("\0")))
    present = _tracked_dirs(root)
    cached = [path for path, use_cache in rel if use_cache]
    roots, skipped = set(), []
    for path, use_cache in rel:
        if use_cache or not (root / path).exists() or path.as_posix() in tracked_files:
            continue
        carrier = next(a for a in [*reversed(path.parents), path] if a != Path(".") and a not in present)
        if any(c == carrier or carrier in c.parents for c in cached):
            skipped.append(path.as_posix())
        else:
            roots.add(carrier.as_posix())
    if (root / "dvc.lock").exists() and "dvc.lock" not in tracked_files:
        roots.add("dvc.lock")
    return sorted(roots), sorted(skipped)


def uncommitted_baseline(root: Path) -> list[str]:
    """dvc.lock and the metrics files in the workspace that HEAD does not hold as they are.

    The experiments carry their metrics either way (see the module docstring); this is
    what `dvc exp show`'s baseline row and a plain `dvc exp diff` need.
    """
    paths = [p.as_posix() for p, _, metric in pipeline_outputs(root) if metric and (root / p).exists()]
    if (root / "dvc.lock").exists():
        paths.insert(0, "dvc.lock")
    if not paths:
        return []
    status = run_git(root, "status", "--porcelain", "--untracked-files=all", "--", *paths)
    changed = {line[3:].strip() for line in status.splitlines() if line.strip()}
    return [p for p in paths if p in changed]


def commit_command(paths: Sequence[str]) -> str:
    quoted = " ".join(shlex.quote(p) for p in paths)
    return f'git add {quoted} && git commit -m "Baseline results for the sweep"'


def experiment_ref(root: Path, name: str) -> str | None:
    """The ref of experiment `name` on the current HEAD (refs/exps/<sha[:2]>/<sha[2:]>/<name>)."""
    head = run_git(root, "rev-parse", "HEAD").strip()
    ref = f"refs/exps/{head[:2]}/{head[2:]}/{name}"
    return ref if run_git(root, "for-each-ref", ref).strip() else None


def _dotted(tree: Mapping[str, Any], key: str, where: str) -> Any:
    node: Any = tree
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            raise SweepError(f"{where}: no param {key!r}")
        node = node[part]
    return node


def ran_stages(output: str) -> list[str]:
    return [line.split("'")[1] for line in output.splitlines() if line.startswith("Running stage '")]


def exp_show(
    root: Path,
    attempts: int = 6,
    pause_s: float = 5.0,
    settle_s: float = QUEUE_SETTLE_S,
    revive_jobs: int = 0,
) -> list[dict[str, Any]]:
    """`dvc exp show --json` of HEAD's experiments (stdout only: warnings go to stderr).

    While the queue sets up or cleans up an executor, `dvc exp show` can fail on the queue's own
    half-made or half-removed files under .dvc/tmp/exps/ ("directory .../.dvc/tmp/exps/tmp.../.dvc
    does not exist", "No such file or directory: .../.dvc/tmp/exps/run/<rev>/<rev>.run"). Such a
    failure is retried `pause_s` apart for up to `settle_s`; any other, `attempts` times.

    One such failure does not pass by itself. A worker that stops (DVC stops an idle one after
    10 s) while a task is queued can take the task and hand it back: the message it took stays
    in DVC's list of running tasks, with no info file, and a copy is queued again. Every `dvc exp
    show` then fails on that info file until a worker runs the copy (seen in CI: for 300 s, with
    no worker left to run it). With no worker running, `revive_jobs` > 0 starts the queue
    (`dvc queue start --jobs revive_jobs`) and waits; with 0, the failure counts like any other,
    and the error says how to run the task.
    """
    command, env = dvc_command(["exp", "show", "--json"])
    started, attempt = time.monotonic(), 0
    while True:
        attempt += 1
        try:
            done = subprocess.run(
                command, cwd=root, env=env, capture_output=True, text=True, timeout=EXP_SHOW_TIMEOUT_S
            )
        except subprocess.TimeoutExpired:  # seen once under load: blocked on a futex for minutes
            done = subprocess.CompletedProcess(command, -9, "", f"timed out after {EXP_SHOW_TIMEOUT_S:.0f} s")
        if done.returncode == 0:
            try:
                return json.loads(done.stdout)
            except ValueError:
                pass
        output = (done.stdout + done.stderr)[-2000:]
        shown = output.replace(os.sep, "/")
        in_transition = QUEUE_TMP in shown
        handed_back = HANDED_BACK.search(shown)
        if handed_back and not queue_workers(root):
            rev = handed_back["rev"][:7]
            if revive_jobs:
                sys.stderr.write(
                    f"note: task {rev} was handed back to the queue and no worker runs it: starting one\n"
                )
                start_queue(root, revive_jobs)
            else:
                in_transition = False
                output += (
                    f"\ntask {rev} is listed as running without its info file and no queue worker runs: "
                    "a stopping worker handed it back. `dvc queue start` runs it, and `dvc exp show` "
                    "works again once it started"
                )
        if time.monotonic() - started >= settle_s or (attempt >= attempts and not in_transition):
            failed = f"`dvc exp show --json` failed {attempt} times (exit {done.returncode})"
            raise SweepError(f"{failed}:\n{output}")
        time.sleep(pause_s)


def experiment_rows(show: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Flatten `dvc exp show --json` to one row per experiment of the shown baselines.

    Each row: name, task_id (the queue task, i.e. the stash commit; None for experiments
    not run by the queue), state (queued/running/success/failed), rev (the experiment
    commit once it succeeded) and metrics ({path: data} as DVC parsed them).
    """
    rows = []
    for baseline in show:
        for exp in baseline.get("experiments") or []:
            revs = exp.get("revs") or [{}]
            executor = exp.get("executor") or {}
            data = revs[0].get("data") or {}
            rows.append(
                {
                    "name": exp.get("name") or revs[0].get("name"),
                    "task_id": (executor.get("local") or {}).get("task_id"),
                    "state": executor.get("state"),
                    "rev": revs[0].get("rev"),
                    "metrics": {
                        path: entry.get("data")
                        for path, entry in (data.get("metrics") or {}).items()
                        if isinstance(entry, Mapping)
                    },
                }
            )
    return rows


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def missing_numbers(metrics: Mapping[str, Any], methods: Sequence[str], layout: Layout) -> list[str]:
    """`path:key` of every headline number that is absent or not a finite number in one row.

    Each method needs its numbers in every seed's metrics file the experiment holds (the seeds its
    own params list), and at least one such file.
    """
    summary = layout.metrics_summary.relative_to(layout.root).as_posix()
    missing = []
    for method in methods:
        owns = sorted(k for k in metrics if (own := SEEDED_METRICS.fullmatch(k)) and own["method"] == method)
        blocks = [(path, metrics.get(path), f"{path}:") for path in owns] or [
            (f"reports/metrics/{method}/seed-<k>.json", None, f"reports/metrics/{method}/seed-<k>.json:")
        ]
        blocks.append((summary, (metrics.get(summary) or {}).get(method), f"{summary}:{method}."))
        for _, block, prefix in blocks:
            missing += [f"{prefix}{key}" for key in HEADLINE if not _is_number((block or {}).get(key))]
    return missing


def check_experiments(
    rows: Sequence[Mapping[str, Any]], tasks: Mapping[str, str], methods: Sequence[str], layout: Layout
) -> dict[str, dict[str, Any]]:
    """This sweep's finished rows by name; raise unless each succeeded with all its numbers."""
    by_task = {row["task_id"]: row for row in rows if row["task_id"]}
    done, problems = {}, []
    for name, task in tasks.items():
        row = by_task.get(task)
        if row is None:
            problems.append(f"{name}: task {task[:7]} is not in `dvc exp show` any more")
        elif row["state"] != "success":
            problems.append(f"{name}: {row['state']}")
        elif missing := missing_numbers(row["metrics"], methods, layout):
            problems.append(f"{name} ({row['rev'][:7]}): no numeric {', '.join(missing)} in `dvc exp show`")
        else:
            done[name] = dict(row)
    if problems:
        raise SweepError("experiments without results:\n  " + "\n  ".join(problems))
    return done


def queue_point(root: Path, point: Mapping[str, str], copies: Sequence[str]) -> str:
    name = experiment_name(point)
    args = ["exp", "run", "--queue", "--name", name]
    for key, value in point.items():
        args += ["-S", f"{key}={value}"]
    for path in copies:
        args += ["-C", path]
    run_dvc(root, [*args, TARGET])
    return name


def queue_points(
    root: Path, points: Sequence[Mapping[str, str]], copies: Sequence[str], jobs: int = 1
) -> dict[str, str]:
    """Queue every point; return {experiment name: queue task id}.

    A point whose name is still queued or running (an interrupted sweep) is refused rather
    than run twice; a finished experiment of that name on HEAD is replaced. Task ids are
    the ones new in `dvc exp show` after queueing, so older failed tasks that share a name
    never stand in for this sweep's. `jobs` is what `exp_show` starts the queue with if it finds
    a task handed back (a previous sweep's worker, stopping as this one queues, can take one).
    """
    names = [experiment_name(p) for p in points]
    before = experiment_rows(exp_show(root, revive_jobs=jobs))
    busy = sorted({r["name"] for r in before if r["name"] in names and r["state"] in ("queued", "running")})
    if busy:
        raise SweepError(
            f"{', '.join(busy)}: already queued or running (see `dvc queue status`); wait for the queue "
            f"or drop them with `dvc queue remove {' '.join(busy)}`, then sweep again"
        )
    for name in names:
        if experiment_ref(root, name):
            run_dvc(root, ["exp", "remove", name])
    known = {r["task_id"] for r in before}
    for point in points:
        queue_point(root, point, copies)
    rows = experiment_rows(exp_show(root, revive_jobs=jobs))
    tasks = {r["name"]: r["task_id"] for r in rows if r["task_id"] and r["task_id"] not in known}
    lost = [name for name in names if name not in tasks]
    if lost:
        raise SweepError(
            f"queued {', '.join(lost)}, but `dvc exp show --json` lists no new task by that name"
        )
    return {name: tasks[name] for name in names}


def _task_log(root: Path, task: str) -> str:
    try:
        return run_dvc(root, ["queue", "logs", task], echo=False)
    except SweepError as err:
        return str(err)


def wait_for_queue(
    root: Path, tasks: Mapping[str, str], poll_s: float = POLL_S, wait_s: float = WAIT_S, jobs: int = 1
) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """Poll `dvc exp show --json` until every task succeeded, failed or was removed; echo each one's log.

    Returns the last rows and {name: `dvc queue logs` output}. Past `wait_s` the sweep
    stops waiting (the queue itself keeps running) and says how to follow it. A task of the
    sweep's still queued when no worker runs (two polls in a row) gets the queue started again
    with `jobs` workers: nothing else would run it. (`start_queue` starts none while a previous
    sweep's idle worker still holds the worker's name, and that worker may stop without taking
    the task.)
    """
    deadline = time.monotonic() + wait_s
    logs: dict[str, str] = {}
    unlisted = dict.fromkeys(tasks, 0)
    unserved = 0
    while True:
        rows = experiment_rows(exp_show(root, revive_jobs=jobs))
        states = {row["task_id"]: row["state"] for row in rows}
        queued = [name for name, task in tasks.items() if states.get(task) == "queued"]
        unserved = unserved + 1 if queued and not queue_workers(root) else 0
        if unserved >= 2:
            sys.stderr.write(f"note: {', '.join(queued)} queued and no queue worker runs: starting one\n")
            start_queue(root, jobs)
            unserved = 0
        for name, task in tasks.items():
            unlisted[name] = 0 if task in states else unlisted[name] + 1
        gone = [name for name in tasks if name not in logs and unlisted[name] >= GONE_POLLS]
        if gone:
            raise SweepError(
                f"{', '.join(gone)}: no longer listed by `dvc exp show` (removed with `dvc queue remove` "
                "or `dvc exp remove`, or the queue was cleared), so no result will come; "
                "sweep again to rerun it"
            )
        for name, task in tasks.items():
            if name not in logs and states.get(task) in DONE_STATES:
                logs[name] = _task_log(root, task)
                sys.stderr.write(f"--- experiment {name}: {states[task]} (dvc queue logs {task[:7]}) ---\n")
                sys.stderr.write(logs[name])
        if len(logs) == len(tasks):
            return rows, logs
        if time.monotonic() > deadline:
            pending = ", ".join(f"{n} ({states.get(t)})" for n, t in tasks.items() if n not in logs)
            raise SweepError(
                f"gave up waiting after {wait_s / 3600:g} h for {pending}; the queue keeps running: "
                "follow it with `dvc queue status` and `dvc queue logs <name>`, stop it with "
                "`dvc queue kill <name>`"
            )
        time.sleep(poll_s)


def _cwd(pid: int) -> Path | None:
    try:
        return Path(os.readlink(f"/proc/{pid}/cwd").removesuffix(" (deleted)"))
    except OSError:
        return None


def _is_queue_daemon(argv: Sequence[str]) -> bool:
    """`dvc queue start` (which stays as the workers' parent) or `dvc exp queue-worker`."""
    words = [Path(a).name for a in argv[:4]]
    return "dvc" in words and ("queue-worker" in argv or ("queue" in argv and "start" in argv))


def queue_processes(root: Path) -> dict[int, tuple[str, str]]:
    """pid → (start time, command line) of every process this project's DVC queue runs.

    Read from /proc: the queue's daemons (`dvc queue start`, `dvc exp queue-worker`, working in
    the project root), every process working in an executor's copy under .dvc/tmp/exps (the
    experiments and their stages, also once DVC deleted that copy), and all their descendants.
    A shell that merely sits in the project root is none of these.
    """
    root = root.resolve()
    executors = root / ".dvc" / "tmp" / "exps"
    table = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (info := proc_info(int(entry.name))) is not None:
            table[int(entry.name)] = info
    found = {
        pid
        for pid, (_, _, argv) in table.items()
        if (cwd := _cwd(pid)) is not None
        and (cwd.is_relative_to(executors) or (cwd == root and _is_queue_daemon(argv)))
    }
    while grown := {pid for pid, (parent, _, _) in table.items() if parent in found} - found:
        found |= grown
    found.discard(os.getpid())
    return {pid: (table[pid][1], _shown_command(table[pid][2])) for pid in sorted(found) if not _zombie(pid)}


def _daemons(processes: Mapping[int, tuple[str, str]]) -> dict[int, tuple[str, str]]:
    return {pid: info for pid, info in processes.items() if _is_queue_daemon(info[1].split())}


def queue_workers(root: Path) -> dict[int, tuple[str, str]]:
    """The project's queue daemons alone (`queue_processes` without experiments and stages)."""
    return _daemons(queue_processes(root))


def _shown_command(argv: Sequence[str]) -> str:
    """A command line as a person reads it: `dvc exp exec-run ...`, not the interpreter's path."""
    if len(argv) > 1 and Path(argv[0]).name.startswith("python"):
        argv = [Path(argv[1]).name, *argv[2:]]
    return " ".join(argv)[:100]


def _alive(pid: int, started: str) -> bool:
    info = proc_info(pid)
    return info is not None and info[1] == started and not _zombie(pid)


def _zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat[stat.rindex(")") + 2] == "Z"


def _signal_and_wait(processes: Mapping[int, tuple[str, str]], sig: int, wait_s: float) -> list[int]:
    """Send `sig` to each process still alive (the same pid and start time: never a reused pid);
    return the ones still alive after up to `wait_s` seconds."""
    alive = [pid for pid, (started, _) in processes.items() if _alive(pid, started)]
    for pid in alive:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
    deadline = time.monotonic() + wait_s
    while alive and time.monotonic() < deadline:
        time.sleep(0.2)
        alive = [pid for pid in alive if _alive(pid, processes[pid][0])]
    return alive


def _end_processes(processes: Mapping[int, tuple[str, str]], grace_s: float) -> list[int]:
    """SIGTERM, then SIGKILL for what outlives `grace_s`; return the pids that needed the SIGKILL."""
    stubborn = _signal_and_wait(processes, signal.SIGTERM, grace_s)
    _signal_and_wait({pid: processes[pid] for pid in stubborn}, signal.SIGKILL, grace_s)
    return stubborn


def _dvc_quiet(root: Path, args: Sequence[str]) -> tuple[int, str]:
    """(exit status, what it said) of a dvc command whose failure is reported, not raised:
    stopping carries on past it."""
    command, env = dvc_command(args)
    shown = f"`dvc {' '.join(args)}`"
    try:
        done = subprocess.run(
            command, cwd=root, env=env, capture_output=True, text=True, timeout=STOP_COMMAND_S
        )
    except subprocess.TimeoutExpired:
        return -1, f"{shown} did not answer within {STOP_COMMAND_S:.0f} s"
    said = " ".join((done.stdout + done.stderr).split())
    return done.returncode, f"{shown}: {said or 'done'}" + (
        f" (exit {done.returncode})" if done.returncode else ""
    )


def _listed(processes: Mapping[int, tuple[str, str]]) -> str:
    return ", ".join(f"{pid} ({command})" for pid, (_, command) in processes.items())


def _after_workers_stop(root: Path, wait_s: float = STOP_SETTLE_S) -> dict[int, tuple[str, str]]:
    """The queue's processes once its workers exited by themselves (`dvc queue stop` returns while
    they are still stopping), or once `wait_s` passed: a worker cut short may leave a task marked
    running."""
    deadline = time.monotonic() + wait_s
    while True:
        left = queue_processes(root)
        if time.monotonic() > deadline or not _daemons(left):
            return left
        time.sleep(0.5)


def stop_queue(root: Path, names: Sequence[str], grace_s: float = STOP_GRACE_S) -> list[str]:
    """Stop this project's queue and everything it runs; return what was done, line by line.

    `dvc queue stop --kill` stops the workers and interrupts the running experiments, but the
    stage commands of a killed experiment live on (seen: a training process, orphaned), so every
    process of the queue still alive after it is ended here (`queue_processes`). The sweep's tasks
    are then killed (a task DVC still counts as running) and removed from the queue, so it holds
    nothing of the sweep and a new sweep of the same points is not refused as a duplicate.
    """
    before = queue_processes(root)
    lines = [_dvc_quiet(root, ["queue", "stop", "--kill"])[1]]
    left = _after_workers_stop(root)
    if gone := {pid: info for pid, info in before.items() if pid not in left}:
        lines.append(f"stopped with the queue: {_listed(gone)}")
    if left:
        forced = _end_processes(left, grace_s)
        lines.append(f"left running by DVC, ended here: {_listed(left)}")
        if forced:
            lines.append(f"(SIGKILL after {grace_s:.0f} s for {', '.join(map(str, forced))})")
    if not before and not left:
        lines.append("no queue process was running")
    code, said = _dvc_quiet(root, ["queue", "kill", *names])
    if code == 0:
        lines.append(said)
    lines.append(_dvc_quiet(root, ["queue", "remove", *names])[1])
    if still := queue_processes(root):
        lines.append(f"still running, stop them by hand: {_listed(still)}")
    return lines


def collect(root: Path, experiment: Mapping[str, Any], methods: Sequence[str], layout: Layout) -> list[Path]:
    """Write reports/sweeps/<method>__<key>=<value>__seed=<k>.json per method and replicate seed
    (the seeds the experiment's params list) from the experiment commit. `seed` in the record is the
    replicate seed, so the report's ablation tables average a point over its seeds."""
    rev = experiment["rev"]
    params = read_yaml(run_git(root, "show", f"{rev}:params.yaml"), f"{rev[:7]}:params.yaml")
    sweep = {key: _dotted(params, key, f"{rev[:7]}:params.yaml") for key in experiment["point"]}
    written = []
    for seed in params.get("seeds") or [0]:
        record = sweep if "seed" in sweep else {**sweep, "seed": seed}
        for method in methods:
            rel = layout.for_seed(seed).metrics(method).relative_to(layout.root).as_posix()
            try:
                metrics = json.loads(run_git(root, "show", f"{rev}:{rel}"))
            except json.JSONDecodeError as err:
                raise SweepError(f"{rev[:7]}:{rel}: not valid JSON ({err})") from None
            path = layout.sweeps_dir / sweep_filename(method, record)
            write_json(path, {**metrics, "sweep": record})
            written.append(path)
    return written


def run(
    root: Path,
    specs: Sequence[str],
    methods: Sequence[str] = SWEEP_METHODS,
    report: bool = True,
    jobs: int = 1,
    poll_s: float = POLL_S,
    wait_s: float = WAIT_S,
) -> dict[str, Any]:
    """Queue every grid point as an experiment, run the queue, check and file its results, then the report."""
    return run_points(root, grid_points(parse_grid(specs)), methods, report, jobs, poll_s, wait_s)


def checked_methods(methods: Sequence[str]) -> list[str]:
    methods = [check_method(m) for m in methods]
    if not methods or len(set(methods)) != len(methods):
        raise SweepError(f"--methods {','.join(methods)!r}: name each method to collect once, e.g. naive")
    return methods


def run_points(
    root: Path,
    points: Sequence[Mapping[str, str]],
    methods: Sequence[str] = SWEEP_METHODS,
    report: bool = True,
    jobs: int = 1,
    poll_s: float = POLL_S,
    wait_s: float = WAIT_S,
) -> dict[str, Any]:
    """`run` for points given as such (a grid file's, see sweep_grid_file)."""
    root = Path(root)
    methods = checked_methods(methods)
    if jobs < 1:
        raise SweepError(f"--jobs {jobs}: run at least one experiment at a time")
    check_distinct(root / "params.yaml", points)
    copies, skipped = copy_paths(root)
    if skipped:
        sys.stderr.write(
            f"note: {len(skipped)} untracked `cache: false` output(s) cannot be carried into the experiments "
            f"({', '.join(skipped)}); commit them (with dvc.lock) so their stages do not rerun\n"
        )
    uncommitted = uncommitted_baseline(root)
    if uncommitted:
        sys.stderr.write(
            "note: HEAD does not hold these as they are in the workspace: "
            f"{', '.join(uncommitted)}. The experiments carry their own metrics regardless, but "
            "`dvc exp show` shows the baseline row without them (so `--only-changed` keeps every column) "
            "and `dvc exp diff` has no baseline to compare with until you commit it, before sweeping:\n"
            f"  {commit_command(uncommitted)}\n"
        )
    try:
        with signals_as_exceptions():
            tasks = queue_points(root, points, copies, jobs)
            start_queue(root, jobs)
            rows, logs = wait_for_queue(root, tasks, poll_s, wait_s, jobs)
    except (Terminated, KeyboardInterrupt) as stop:
        signum = stop_signal(stop)
        with signals_ignored():
            sys.stderr.write(f"sweep: stopped by {signal.Signals(signum).name}; stopping what it started\n")
            for line in stop_queue(root, [experiment_name(p) for p in points]):
                sys.stderr.write(f"  {line}\n")
        raise SystemExit(exit_code(signum)) from stop
    states = {row["task_id"]: row["state"] for row in rows}
    failed = [name for name, task in tasks.items() if states[task] != "success"]
    if failed:
        raise SweepError(
            "experiment(s) failed; their `dvc queue logs`:\n"
            + "\n".join(f"--- {name} ---\n{logs[name][-3000:]}" for name in failed)
        )
    done = check_experiments(rows, tasks, methods, Layout(root))
    return file_results(root, points, done, logs, methods, report)


def file_results(
    root: Path,
    points: Sequence[Mapping[str, str]],
    done: Mapping[str, Mapping[str, Any]],
    logs: Mapping[str, str],
    methods: Sequence[str],
    report: bool,
) -> dict[str, Any]:
    """File each checked experiment in reports/sweeps/ (see `collect`), then rebuild the report.

    `done` holds the experiments' rows by name (`check_experiments`), `logs` their run logs, from
    which the stages each one ran are read. Every executor ends here."""
    layout = Layout(root)
    experiments = []
    for point in points:
        experiment = {**done[experiment_name(point)], "point": dict(point)}
        experiment["stages"] = ran_stages(logs[experiment["name"]])
        experiment["files"] = [str(p) for p in collect(root, experiment, methods, layout)]
        experiment.pop("metrics")
        experiments.append(experiment)
    if report:
        from prefshift.pipeline.stages import report as report_stage

        report_stage.run(load_params(root / "params.yaml"), layout)
    return {"experiments": experiments, "report": str(layout.summary) if report else None}
