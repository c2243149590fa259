"""One set of tests for every executor: `local` (a pool), `local-gpus` (a fake device list: no GPU
here) and `slurm` (a real one-node cluster). The pipeline is a trivial two-stage DVC project
(seconds per point); the sweep's code path, git, DVC, SLURM, tmux, pipes and signals are real.

Each test runs a two-point grid whose second point holds mid-run, stops the sweep with SIGINT
(through a pipe whose reader has gone, or Ctrl-C in a tmux terminal), checks that nothing it
started is left and that the record says what it stopped, then resumes it: only the stopped
point reruns, and `dvc exp show` then carries both points."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest
import yaml

from e2e_project import REPO
from mlflow_support import free_port, running_server
from prefshift.core.host import core_share
from proc_support import processes
from slurm_support import controller_down, restart_controller, running_cluster, why_not

BIN = Path(sys.executable).parent
PREPARE = """\
import pathlib, sys
trace = pathlib.Path(sys.argv[1])
trace.mkdir(exist_ok=True)
with open(trace / "prepare-runs", "a") as runs:
    runs.write("prepare\\n")
pathlib.Path("data").mkdir(exist_ok=True)
pathlib.Path("data/base.txt").write_text("base 3\\n")
"""
EVALUATE = """\
import json, os, pathlib, sys, time, yaml
trace = pathlib.Path(sys.argv[1])
lam = yaml.safe_load(open("params.yaml"))["anchor"]["lambda"]
if lam == 13:
    sys.exit(f"evaluate.py: no result for lambda {lam}")
checkpoint = pathlib.Path("models/checkpoints/evaluate/step")
seen = {"lambda": lam, "pid": os.getpid(), "devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "threads": os.environ.get("OMP_NUM_THREADS"), "resumed": checkpoint.exists(), "start": time.time()}
(trace / f"start-{lam}-{os.getpid()}.json").write_text(json.dumps(seen))
checkpoint.parent.mkdir(parents=True, exist_ok=True)
checkpoint.write_text("1")  # as training leaves its resumable checkpoint (no DVC output)
deadline = time.time() + 600
while (trace / f"hold-{lam}").exists() and time.time() < deadline:
    time.sleep(0.2)
base = float(pathlib.Path("data/base.txt").read_text().split()[1])
headline = {"wrg": 2.0 * lam, "mean_aog": base * lam, "mean_nts": -1.0 * lam}
uri = os.environ.get("MLFLOW_TRACKING_URI", "")
if uri.startswith("http"):  # MLflow's REST API: a stage's run without the seconds of `import mlflow`
    import urllib.parse, urllib.request
    def call(path, body=None):
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json"}
        request = urllib.request.Request(f"{uri}/api/2.0/mlflow/{path}", data, headers)
        return json.load(urllib.request.urlopen(request, timeout=60))
    name = urllib.parse.quote("cluster-sweep")
    experiment = call(f"experiments/get-by-name?experiment_name={name}")["experiment"]["experiment_id"]
    now = int(time.time() * 1000)
    run = call("runs/create", {"experiment_id": experiment, "run_name": f"lambda={lam}", "start_time": now})
    run_id = run["run"]["info"]["run_id"]
    call("runs/log-parameter", {"run_id": run_id, "key": "lambda", "value": str(lam)})
    metric = {"key": "wrg", "value": headline["wrg"], "timestamp": now, "step": 0}
    call("runs/log-metric", {"run_id": run_id, **metric})
    call("runs/update", {"run_id": run_id, "status": "FINISHED", "end_time": int(time.time() * 1000)})
own = pathlib.Path("reports/metrics/anchor_last")
own.mkdir(parents=True, exist_ok=True)
(own / "seed-0.json").write_text(json.dumps({"method": "anchor_last", **headline}))
pathlib.Path("reports/metrics.json").write_text(json.dumps({"anchor_last": headline}))
(trace / f"end-{lam}-{os.getpid()}.json").write_text(json.dumps({**seen, "end": time.time()}))
"""


def _env(**extra: str) -> dict[str, str]:
    """The test's environment for a sweep, without the tracking URI and torch's thread count (tests/
    conftest.py sets that): a local sweep gives each task its share of the cores."""
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "OMP_NUM_THREADS")}
    env.update({f"GIT_{w}_{x}": "t" for w in ("AUTHOR", "COMMITTER") for x in ("NAME", "EMAIL")})
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    return {**env, **extra}


def _in_sweep_env(monkeypatch) -> dict[str, str]:
    """`_env()`, also set in this process (its PATH and git identity): `resume` and the CLI run
    here, and sbatch hands its environment on."""
    env = _env()
    for key in ("PATH", *(k for k in env if k.startswith("GIT_"))):
        monkeypatch.setenv(key, env[key])
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return env


def _started(root: Path, env: dict[str, str], log: Path, *command: str) -> subprocess.Popen:
    """`prefshift <command>` in the background, its output into `log`, Ctrl-C taken (not ignored)."""
    with open(log, "w") as out:
        return subprocess.Popen(
            [str(BIN / "prefshift"), *command], cwd=root, env=env, stdout=out, stderr=out,
            preexec_fn=_take_ctrl_c,
        )  # fmt: skip


def _run(args, cwd, env) -> str:
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True)
    assert done.returncode == 0, f"{args}: {done.stdout}\n{done.stderr}"
    return done.stdout


def _project(tmp: Path, env: dict[str, str], remotes: bool, committed: bool = True) -> tuple[Path, Path]:
    """A two-stage project (prepare → report) reproduced once, committed with its results (or, not
    `committed`, its sources alone); with `remotes`, a bare git origin holding the baseline and a
    local DVC remote. Returns (project, trace folder)."""
    root, trace = tmp / "project", tmp / "trace"
    root.mkdir()
    trace.mkdir()
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    (root / "params.yaml").write_text(yaml.safe_dump({**params, "seeds": [0]}, sort_keys=False))
    (root / "prepare.py").write_text(PREPARE)
    (root / "evaluate.py").write_text(EVALUATE)
    (root / ".gitignore").write_text("models/checkpoints/\n")
    metrics = [
        {p: {"cache": False}} for p in ("reports/metrics/anchor_last/seed-0.json", "reports/metrics.json")
    ]
    stages = {
        "prepare": {
            "cmd": f"{sys.executable} prepare.py {shlex.quote(str(trace))}",
            "deps": ["prepare.py"],
            "outs": ["data/base.txt"],
        },
        "report": {
            "cmd": f"{sys.executable} evaluate.py {shlex.quote(str(trace))}",
            "deps": ["evaluate.py", "data/base.txt"],
            "params": ["anchor.lambda"],
            "metrics": metrics,
        },
    }
    (root / "dvc.yaml").write_text(yaml.safe_dump({"stages": stages}))
    _run(["git", "init", "-q", "-b", "main"], root, env)
    _run(["dvc", "init", "-q"], root, env)
    if remotes:
        _run(["git", "init", "-q", "--bare", str(tmp / "origin.git")], tmp, env)
        _run(["git", "remote", "add", "origin", str(tmp / "origin.git")], root, env)
        _run(["dvc", "remote", "add", "-d", "shared", str(tmp / "dvc-remote")], root, env)
    if not committed:
        _run(["git", "add", "-A"], root, env)
        _run(["git", "commit", "-qm", "sources"], root, env)
    _run(["dvc", "repro"], root, env)
    for baseline_trace in [*trace.glob("start-*"), *trace.glob("end-*")]:
        baseline_trace.unlink()  # the traces left are the sweep's own
    if committed:
        _run(["git", "add", "-A"], root, env)
        _run(["git", "commit", "-qm", "baseline"], root, env)
    if remotes:
        _run(["git", "push", "-q", "origin", "main"], root, env)
    return root, trace


def _on_a_cluster(stack: ExitStack, tmp: Path, env: dict[str, str], monkeypatch) -> str:
    """A one-node SLURM and an MLflow server (with the stages' experiment) for the rest of `stack`,
    reached from `env` and from this process; returns the server's URI."""
    uri = stack.enter_context(running_server(tmp / "mlflow", free_port()))
    env.update(stack.enter_context(running_cluster(tmp / "slurm")), MLFLOW_TRACKING_URI=uri)
    for key in ("SLURM_CONF", "MLFLOW_TRACKING_URI"):
        monkeypatch.setenv(key, env[key])
    from mlflow import MlflowClient

    MlflowClient(uri).create_experiment("cluster-sweep")
    return uri


@contextmanager
def _a_cluster_project(tmp: Path, monkeypatch) -> Iterator[tuple[Path, Path, dict[str, str]]]:
    """(project with remotes, trace folder, environment) on a one-node SLURM with an MLflow server,
    for the body; the test is skipped where SLURM cannot run."""
    if reason := why_not():
        pytest.skip(reason)
    env = _in_sweep_env(monkeypatch)
    with ExitStack() as stack:
        root, trace = _project(tmp, env, remotes=True)
        _on_a_cluster(stack, tmp, env, monkeypatch)
        yield root, trace, env


@contextmanager
def _a_project(tmp: Path, monkeypatch, executor: str) -> Iterator[tuple[Path, Path, dict[str, str]]]:
    """(project, trace folder, environment) for `executor`: on a one-node SLURM with remotes (as
    _a_cluster_project), else on this machine alone."""
    if executor == "slurm":
        with _a_cluster_project(tmp, monkeypatch) as made:
            yield made
    else:
        env = _in_sweep_env(monkeypatch)
        yield (*_project(tmp, env, remotes=False), env)


def _waits_or_runs(trace: Path, logs: Path, waiting: str) -> Callable[[], bool]:
    """Whether a second task of the point says `waiting` in its log (`logs`: a scratch folder), or
    has started the point's stage beside the first: what a test of the wait waits for."""

    def seen() -> bool:
        said = "".join(log.read_text() for log in logs.glob("*/logs/0.log"))
        return len(_traces(trace, "start")) > 1 or waiting in said

    return seen


def _traces(trace: Path, kind: str) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(trace.glob(f"{kind}-*.json"))]


def _wait(condition, what: str, timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.3)


def _cli(*args: str, code: int = 0):
    """A prefshift command in this process (its subprocesses are real: git, dvc, sbatch)."""
    from typer.testing import CliRunner

    from prefshift.cli import app

    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == code, (result.exit_code, result.stdout, result.stderr, result.exception)
    return result


def _alive(pid: int) -> bool:
    """A process that runs (a zombie waiting to be reaped does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def _in_group(pgid: int) -> list[int]:
    """Live processes of process group `pgid` (zombies waiting to be reaped are not)."""
    return [pid for pid, state, _, group in processes() if group == pgid and state != "Z"]


def _take_ctrl_c() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # a background job of a script inherits it ignored


def _through_pipe(command: list[str], root: Path, env: dict) -> tuple[callable, callable]:
    """Start the sweep with stdout and stderr into a pipe whose reader exits at once (as
    `prefshift sweep ... | head -c 0`); return (stop it with SIGINT, its exit status)."""
    read, write = os.pipe()
    proc = subprocess.Popen(command, cwd=root, env=env, stdout=write, stderr=write, preexec_fn=_take_ctrl_c)
    os.close(write)
    os.close(read)  # the reader is gone before the sweep writes its first line

    def status() -> int | None:
        return proc.poll()

    def stop() -> int:
        proc.send_signal(signal.SIGINT)
        return proc.wait(timeout=300)

    return stop, status


def _through_tmux(command: list[str], root: Path, env: dict, tmp: Path) -> tuple[callable, callable]:
    """Start the sweep in a tmux terminal of its own (a private server); Ctrl-C is typed into it."""
    script, code = tmp / "run.sh", tmp / "exit-code"
    exports = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in env.items())
    script.write_text(f"{exports}cd {shlex.quote(str(root))}\n{shlex.join(command)}\necho $? > {code}\n")
    server = ["tmux", "-L", f"prefshift-{os.getpid()}-{tmp.name}"]
    subprocess.run([*server, "new-session", "-d", "-x", "160", "-y", "40", "bash", str(script)], check=True)

    def status() -> int | None:
        return int(code.read_text()) if code.exists() and code.read_text().strip() else None

    def stop() -> int:
        subprocess.run([*server, "send-keys", "C-c"], check=True)
        try:
            _wait(lambda: status() is not None, "the sweep to exit after Ctrl-C", 300)
        finally:
            subprocess.run([*server, "kill-server"], capture_output=True)
        return status()

    return stop, status


EXECUTORS = {
    "local": ["--jobs", "2"],
    "local-gpus": ["--executor", "local-gpus", "--gpus", "0,1"],
    "slurm": ["--executor", "slurm", "--time", "10:00"],
}
RESUMED_WITH = {"local": ["--jobs", "1"], "local-gpus": ["--gpus", "0"], "slurm": ["--time", "20:00"]}
"""What each executor's resume asks anew: fewer slots, another device (point 1 ran on 1), more time."""


@pytest.mark.slow
@pytest.mark.parametrize("via", ["pipe", "tmux"])
@pytest.mark.parametrize("executor", list(EXECUTORS))
def test_a_stopped_sweep_leaves_no_process_and_resume_finishes_only_what_stopped(
    tmp_path, monkeypatch, executor, via
):
    from prefshift.pipeline.sweep.record import load
    from prefshift.pipeline.sweep.run import point_states

    cluster = executor == "slurm"
    if cluster and (reason := why_not()):
        pytest.skip(reason)
    if via == "tmux" and shutil.which("tmux") is None:
        pytest.skip("tmux not installed (apt-get install tmux)")
    env = _in_sweep_env(monkeypatch)
    with ExitStack() as stack:
        root, trace = _project(tmp_path, env, remotes=cluster)
        if cluster:
            uri = _on_a_cluster(stack, tmp_path, env, monkeypatch)
        scratch = tmp_path / "scratch"
        command = [str(BIN / "prefshift"), "sweep", "-S", "anchor.lambda=0.5,2", "--methods", "anchor_last"]
        command += ["--no-report", "--scratch", str(scratch), *EXECUTORS[executor]]
        if cluster:  # a user's template and environment that rename the job, move its logs, widen its
            # array: sbatch's command line, where the sweep's own options go, wins over them all
            template = tmp_path / "extra.sh"
            lines = ["--job-name=mine", f"--output={tmp_path}/elsewhere-%a.log", "--array=0-7"]
            template.write_text("".join(f"#SBATCH {line}\n" for line in lines))
            command += ["--sbatch-template", str(template)]
            env["SBATCH_JOB_NAME"] = "theirs"
            for tool in ("SQUEUE", "SCANCEL"):  # a user's filters: they hid the tasks from squeue
                env[f"{tool}_PARTITION"] = "elsewhere"
        (trace / "hold-2").write_text("")  # point 1 (lambda 2) holds mid-run until the sweep is stopped
        if via == "pipe":
            stop, status = _through_pipe(command, root, env)
        else:
            stop, status = _through_tmux(command, root, env, tmp_path)

        def point_0_done_and_1_running() -> bool:
            assert status() is None, f"the sweep ended early (exit {status()})"
            folders = list(scratch.glob("*/sweep.json"))
            if not folders or not any(t["lambda"] == 2 for t in _traces(trace, "start")):
                return False
            return load(scratch, folders[0].parent.name).read_state(0).get("state") == "success"

        _wait(point_0_done_and_1_running, "point 0 to finish while point 1 runs", 600)
        record = load(scratch, next(scratch.glob("*/sweep.json")).parent.name)
        refused = _cli("sweep", "resume", record.id, "--scratch", str(scratch), "--root", str(root), code=2)
        assert f"sweep {record.id} is being run by process" in refused.stderr, "a second driver is refused"
        task_pid = record.read_state(1)["pid"]
        (stage,) = [t for t in _traces(trace, "start") if t["lambda"] == 2]
        assert stop() == 128 + signal.SIGINT

        assert not _alive(stage["pid"]) and not _alive(task_pid), "the stage and its task are gone"
        if not cluster:
            assert _in_group(task_pid) == [], "nothing of the task's process group is left"
        record = load(scratch, record.id)
        assert record.data["stops"][-1]["signal"] == "SIGINT" and record.data["stops"][-1]["points"] == [1]
        assert point_states(record) == {0: "success", 1: "stopped"}
        status_lines = _cli(
            "sweep", "status", record.id, "--scratch", str(scratch), "--root", str(root)
        ).stdout
        assert "stopped by SIGINT" in status_lines and "1  sweep-anchor.lambda-2  stopped" in status_lines

        (trace / "hold-2").unlink()
        # from another folder: the experiments still go to the project the sweep ran from
        where = ["--scratch", str(scratch), "--root", str(tmp_path)]
        resumed = _cli("sweep", "resume", record.id, *RESUMED_WITH[executor], *where)
        assert "rerunning point 1 (sweep-anchor.lambda-2, stopped)" in resumed.stderr
        if cluster:
            from mlflow import MlflowClient

            client = MlflowClient(uri)
            runs = client.search_runs([client.get_experiment_by_name("cluster-sweep").experiment_id])
            assert sorted(
                (r.data.params["lambda"], r.info.status) for r in runs if r.info.status == "FINISHED"
            ) == [
                ("0.5", "FINISHED"),
                ("2", "FINISHED"),
            ]

    starts = _traces(trace, "start")
    assert sorted(t["lambda"] for t in starts) == [0.5, 2, 2], "point 0 never reran"
    last = max((t for t in starts if t["lambda"] == 2), key=lambda t: t["start"])
    assert last["resumed"], "the resumed point found its checkpoint in its clone"
    if executor == "local":
        assert f"sweep {record.id}: 1 point(s) at a time" in resumed.stderr, "the resume took --jobs 1"
    elif executor == "local-gpus":
        assert last["devices"] == "0", "the resume ran the point with --gpus 0"
    else:
        assert "--time=20:00" in (record.folder / "job-2.sbatch").read_text()
    assert (trace / "prepare-runs").read_text() == "prepare\n", "the tasks restored prepare's output"
    first_two = sorted(starts, key=lambda t: t["start"])[:2]  # ran at once (slurm: one after the other)
    if executor == "local-gpus":
        assert sorted(t["devices"] for t in first_two) == ["0", "1"], "one device each"
    if not cluster:  # two slots: each task gets half the cores for torch's threads (OMP_NUM_THREADS)
        assert [t["threads"] for t in first_two] == [str(core_share(2))] * 2
    show = json.loads(_run(["dvc", "exp", "show", "--json"], root, env))
    rows = {
        exp["name"]: exp["revs"][0]["data"]["metrics"]["reports/metrics.json"]["data"]["anchor_last"]["wrg"]
        for baseline in show
        for exp in baseline.get("experiments") or []
    }
    assert rows == {"sweep-anchor.lambda-0.5": 1.0, "sweep-anchor.lambda-2": 4.0}
    filed = json.loads(
        (root / "reports" / "sweeps" / "anchor_last__anchor.lambda=2__seed=0.json").read_text()
    )
    assert filed["wrg"] == 4.0 and filed["sweep"] == {"anchor.lambda": 2, "seed": 0}
    assert sorted(p.name for p in record.log(0).parent.iterdir()) == ["0.log", "1.log"]
    assert not list(tmp_path.glob("elsewhere-*")), "the template's --output and --array did not win"


@pytest.mark.slow
def test_a_local_sweep_refuses_an_uncommitted_workspace_as_slurm_does_and_names_a_failed_point(
    tmp_path, monkeypatch
):
    """A fresh clone after `dvc repro`: dvc.lock and the metrics untracked, and here a source file
    changed too. Each point clones the baseline commit on one machine as on a cluster, so the
    sweep refuses before anything runs and prints the command that commits it all. Once that ran,
    the points start from the commit (the shared stage is restored, the changed source is used); a
    failed point is named with why and its log. A later sweep of a finished point reuses its
    experiment instead of running it (test_sweep.py tries what else an experiment ref may hold)."""
    env = _in_sweep_env(monkeypatch)
    root, trace = _project(tmp_path, env, remotes=False, committed=False)
    (root / "evaluate.py").write_text(EVALUATE.replace("2.0 * lam", "3.0 * lam"))  # not committed
    sweep = ["sweep", "--methods", "anchor_last", "--no-report", "--root", str(root)]
    refused = _cli(*sweep, "-S", "anchor.lambda=0.5,13", code=2).stderr
    missing = "dvc.lock evaluate.py reports/metrics.json reports/metrics/anchor_last/seed-0.json"
    assert f"not committed: {missing.replace(' ', ', ')};" in refused
    command = f'git add {missing} && git commit -m "Baseline results for the sweep"'
    assert command in refused
    assert not (root / ".prefshift" / "sweeps").exists() and not _traces(trace, "start")

    _run(["bash", "-c", command], root, env)
    failed = _cli(*sweep, "-S", "anchor.lambda=0.5,13", code=2).stderr
    assert (
        "1 point(s) without a result" in failed
        and "1  sweep-anchor.lambda-13  failed  (failed during run:" in failed
    )
    log = Path(failed.split("log: ")[1].split()[0])
    assert "evaluate.py: no result for lambda 13" in log.read_text()

    again = _cli(*sweep, "-S", "anchor.lambda=0.5").stderr
    filed = json.loads(
        (root / "reports" / "sweeps" / "anchor_last__anchor.lambda=0.5__seed=0.json").read_text()
    )
    assert filed["wrg"] == 1.5, "the committed evaluate.py ran"
    assert (trace / "prepare-runs").read_text() == "prepare\n", "prepare's output was restored"
    assert [t["lambda"] for t in _traces(trace, "start")] == [0.5], "the finished point was reused"
    assert "experiment sweep-anchor.lambda-0.5 is on this baseline already" in again
    assert "dvc exp run" not in again  # the task's log, printed when it ends
    names = _run(["dvc", "exp", "list", "--name-only"], root, env).split()
    assert sorted(names) == ["sweep-anchor.lambda-0.5"]  # one experiment, not two
    assert _run(["git", "status", "--porcelain", "--untracked-files=no"], root, env) == ""


DIRECTORY_METRICS = """\
import json, pathlib, yaml
params = yaml.safe_load(open("params.yaml"))
headline = {"wrg": 2.0 * params["anchor"]["lambda"], "mean_aog": 0.5, "mean_nts": -0.5}
for method in ("anchor_last", "anchor_mid"):
    folder = pathlib.Path("reports/metrics") / method
    folder.mkdir(parents=True, exist_ok=True)
    for seed in params["seeds"]:
        (folder / f"seed-{seed}.json").write_text(json.dumps({"method": method, **headline}))
summary = {m: headline for m in ("anchor_last", "anchor_mid")}
pathlib.Path("reports/metrics.json").write_text(json.dumps(summary))
"""


@pytest.mark.slow
def test_a_project_whose_path_holds_a_space_a_hash_and_a_comma_shares_its_dvc_cache(tmp_path, monkeypatch):
    """The clones' config.local got the project's cache path bare: after a space it was relative
    (every point recomputed the shared stages), after `#` cut short (DVC cached outside the project)
    and with `,` a list (every point failed)."""
    env = _in_sweep_env(monkeypatch)
    (odd := tmp_path / "my work#2,final").mkdir()
    root, trace = _project(odd, env, remotes=False)
    _cli("sweep", "-S", "anchor.lambda=0.5", "--methods", "anchor_last", "--no-report", "--root", str(root))
    assert (trace / "prepare-runs").read_text() == "prepare\n", "prepare's output came from the cache"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["my work#2,final"], "no cache outside it"
    filed = json.loads(
        (root / "reports" / "sweeps" / "anchor_last__anchor.lambda=0.5__seed=0.json").read_text()
    )
    assert filed["wrg"] == 1.0


@pytest.mark.slow
@pytest.mark.parametrize("executor", ["local", "slurm"])
def test_one_grid_swept_twice_at_once_trains_each_point_once(tmp_path, monkeypatch, executor):
    """Two sweeps of one grid started side by side each trained the point, and the second's push
    replaced the first's experiment. A task now holds the experiment's lock in the project: the
    other sweep's task waits for it, then reuses the experiment. A SLURM task took no such lock."""
    with _a_project(tmp_path, monkeypatch, executor) as (root, trace, env):
        sweep = ["sweep", "-S", "anchor.lambda=2", "--methods", "anchor_last", "--no-report"]
        sweep += EXECUTORS[executor]
        (trace / "hold-2").write_text("")
        first = _started(root, env, tmp_path / "first.log", *sweep)
        _wait(lambda: len(_traces(trace, "start")) == 1, "the first sweep to run the point's stage", 300)
        second = _started(root, env, tmp_path / "second.log", *sweep)
        waits = _waits_or_runs(
            trace, root / ".prefshift" / "sweeps", "a task of another sweep; waiting for it to end"
        )
        _wait(waits, "the second sweep's task to wait for the experiment, or to run it")
        assert len(_traces(trace, "start")) == 1, "the second sweep did not train the point beside the first"
        (trace / "hold-2").unlink()
        assert first.wait(timeout=300) == 0, (tmp_path / "first.log").read_text()
        assert second.wait(timeout=300) == 0, (tmp_path / "second.log").read_text()
    assert len(_traces(trace, "start")) == 1, "the point trained once"
    said = "".join(log.read_text() for log in (root / ".prefshift" / "sweeps").glob("*/logs/0.log"))
    assert "experiment sweep-anchor.lambda-2 is on this baseline already" in said
    names = _run(["dvc", "exp", "list", "--name-only"], root, env).split()
    assert names == ["sweep-anchor.lambda-2"]


@pytest.mark.slow
def test_a_second_sweep_waits_for_the_work_a_killed_sweep_left_on_the_same_point(tmp_path, monkeypatch):
    """Sweep and task killed (`kill -9`, the OOM killer): the experiment's lock went with the task,
    while its dvc and stage trained on, so another sweep of the point started it again beside them.
    The task that takes the experiment's lock now waits for the point lock its last holder wrote
    down, which that work holds."""
    from prefshift.pipeline.sweep.record import load

    env = _in_sweep_env(monkeypatch)
    root, trace = _project(tmp_path, env, remotes=False)
    sweep = ["sweep", "-S", "anchor.lambda=2", "--methods", "anchor_last", "--no-report", "--root", str(root)]
    (trace / "hold-2").write_text("")
    first = _started(root, env, tmp_path / "first.log", *sweep, "--scratch", str(tmp_path / "a"))
    _wait(lambda: len(_traces(trace, "start")) == 1, "the first sweep to run the point's stage", 300)
    task = load(tmp_path / "a", next((tmp_path / "a").iterdir()).name).read_state(0)["pid"]
    stage = _traces(trace, "start")[0]["pid"]
    for pid in (first.pid, task):
        os.kill(pid, signal.SIGKILL)
    first.wait()
    assert _alive(stage)
    second = _started(root, env, tmp_path / "second.log", *sweep, "--scratch", str(tmp_path / "b"))
    waits = _waits_or_runs(trace, tmp_path / "b", "killed task of another sweep runs on; waiting")
    _wait(waits, "the second sweep's task to wait for the killed sweep's work, or to run")
    assert len(_traces(trace, "start")) == 1, "the second sweep did not train the point beside that work"
    (trace / "hold-2").unlink()
    assert second.wait(timeout=300) == 0, (tmp_path / "second.log").read_text()
    (orphan,) = [t for t in _traces(trace, "end") if t["pid"] == stage]
    assert all(t["start"] > orphan["end"] for t in _traces(trace, "start")[1:]), "none ran beside it"


@pytest.mark.slow
def test_the_documented_baseline_commit_then_a_sweep_runs(tmp_path, monkeypatch):
    """docs/sweeps.md's commit line, verbatim, on a project whose metrics are directories, as the
    embedded default's are (`reports/metrics/<method>`). Before, the sweep then stopped with a
    StopIteration traceback (a committed `cache: false` directory left no untracked ancestor to
    carry). The full workflow, report included, runs on the real pipeline in test_pipeline_e2e.py."""
    env = _in_sweep_env(monkeypatch)
    root = tmp_path / "project"
    root.mkdir()
    shutil.copy2(REPO / "params.yaml", root / "params.yaml")
    (root / "evaluate.py").write_text(DIRECTORY_METRICS)
    outputs = ["reports/metrics/anchor_last", "reports/metrics/anchor_mid", "reports/metrics.json"]
    stage = {"cmd": f"{sys.executable} evaluate.py", "deps": ["evaluate.py"], "params": ["anchor.lambda"]}
    stage["metrics"] = [{path: {"cache": False}} for path in outputs]
    (root / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"report": stage}}))
    _run(["git", "init", "-q"], root, env)
    _run(["dvc", "init", "-q"], root, env)
    _run(["git", "add", "-A"], root, env)
    _run(["git", "commit", "-qm", "sources"], root, env)
    _run(["dvc", "repro"], root, env)
    page = (REPO / "docs" / "sweeps.md").read_text()
    commit, sweep = (
        page.split("### The baseline workflow", 1)[1].split("```bash\n", 1)[1].split("```")[0].split("\n")[:2]
    )
    _run(["bash", "-c", commit], root, env)
    assert _run(["git", "status", "--porcelain", "--untracked-files=no"], root, env) == ""
    _run(["bash", "-c", f"{sweep} --no-report"], root, env)  # the toy project has no report to rebuild
    seeds = yaml.safe_load((root / "params.yaml").read_text())["seeds"]
    filed = sorted(p.name for p in (root / "reports" / "sweeps").iterdir())
    lambdas = ("0.5", "2")
    assert filed == sorted(
        f"{m}__anchor.lambda={v}__seed={k}.json"
        for m in ("anchor_last", "anchor_mid")
        for v in lambdas
        for k in seeds
    )


@pytest.mark.slow
def test_a_task_killed_alone_leaves_its_point_running_until_its_work_ends(tmp_path, monkeypatch):
    """`kill -9` of a task's pid alone (by hand, or the OOM killer) leaves its dvc and stage training
    on in the point's clone. The point counted as stopped at once: the sweep freed its slot beside
    them, and a resume started a second dvc in the same clone. With the sweep alive, the sweep now
    ends what the task left. With the sweep killed too, the point counts as running while any of it
    runs (the point's lock is handed down), so a resume waits for it instead of starting it again,
    and reruns it once that work has ended without a result."""
    from prefshift.pipeline.sweep.record import load
    from prefshift.pipeline.sweep.run import point_states

    env = _in_sweep_env(monkeypatch)
    root, trace = _project(tmp_path, env, remotes=False)
    scratch, log = tmp_path / "scratch", tmp_path / "sweep.log"
    sweep = ["sweep", "-S", "anchor.lambda=2", "--methods", "anchor_last", "--no-report"]
    at = ["--scratch", str(scratch), "--root", str(root)]
    (trace / "hold-2").write_text("")  # the point's stage holds until this goes

    def running(attempt: int) -> tuple[str, int, int]:
        """(sweep id, task pid, stage pid) once attempt `attempt` of the point runs its stage."""
        _wait(lambda: len(_traces(trace, "start")) == attempt, f"attempt {attempt} to run its stage", 300)
        record = load(scratch, next(scratch.glob("*/sweep.json")).parent.name)
        return record.id, record.read_state(0)["pid"], _traces(trace, "start")[-1]["pid"]

    driver = _started(root, env, log, *sweep, *at)
    sweep_id, task, stage = running(1)
    os.kill(task, signal.SIGKILL)
    assert driver.wait(timeout=300) == 2, log.read_text()  # no result for the point
    assert not _alive(stage) and _in_group(task) == [], "the sweep ended what the task left"
    assert "point 0: its task ended and left processes of its group; ended them" in log.read_text()
    assert point_states(load(scratch, sweep_id)) == {0: "stopped"}

    driver = _started(root, env, log, "sweep", "resume", sweep_id, *at)
    _, task, stage = running(2)
    for pid in (driver.pid, task):  # the sweep, then its task: the task's dvc and stage work on
        os.kill(pid, signal.SIGKILL)
    driver.wait()
    assert _alive(stage) and point_states(load(scratch, sweep_id)) == {0: "running"}
    (trace / "hold-2").unlink()  # the orphaned attempt may now end, without a result (its task is gone)
    waited = _cli("sweep", "resume", sweep_id, *at).stderr
    assert "waiting for point 0 (sweep-anchor.lambda-2, running)" in waited
    assert "point 0: the work left by its earlier task ended without a result; rerunning it" in waited
    assert not _alive(stage) and _in_group(task) == []
    assert point_states(load(scratch, sweep_id)) == {0: "success"}
    (orphan,) = [t for t in _traces(trace, "end") if t["pid"] == stage]
    starts = _traces(trace, "start")
    assert all(t["start"] > orphan["end"] for t in starts[2:]), "no attempt beside the orphaned one"
    assert all(t["resumed"] for t in starts[1:]), "each later attempt went on"
    filed = json.loads(
        (root / "reports" / "sweeps" / "anchor_last__anchor.lambda=2__seed=0.json").read_text()
    )
    assert filed["wrg"] == 4.0


@pytest.mark.slow
def test_a_resume_waiting_for_a_dead_task_s_work_gives_it_a_slot_and_its_stop_ends_that_work(
    tmp_path, monkeypatch
):
    """Sweep and task of point 0 killed (`kill -9`), its stage still working. A resume waits for
    that work, as the test above shows. It started point 1 beside it, past `--jobs 1`; and Ctrl-C on
    the resume ended point 1 alone, leaving point 0's work running, which no command could then stop.
    The awaited work now holds a slot, and a stop ends it as it ends the tasks the resume started."""
    from prefshift.pipeline.sweep.record import load
    from prefshift.pipeline.sweep.run import point_states

    env = _in_sweep_env(monkeypatch)
    root, trace = _project(tmp_path, env, remotes=False)
    scratch, log = tmp_path / "scratch", tmp_path / "sweep.log"
    at = ["--scratch", str(scratch), "--root", str(root)]
    (trace / "hold-2").write_text("")  # point 0 (lambda 2) holds mid-run until this goes

    driver = _started(
        root, env, log, "sweep", "-S", "anchor.lambda=2,3", "--methods", "anchor_last", "--no-report", *at
    )
    _wait(lambda: len(_traces(trace, "start")) == 1, "point 0 to run its stage", 300)
    record = load(scratch, next(scratch.glob("*/sweep.json")).parent.name)
    task, stage = record.read_state(0)["pid"], _traces(trace, "start")[0]["pid"]
    for pid in (driver.pid, task):
        os.kill(pid, signal.SIGKILL)
    driver.wait()
    assert _alive(stage) and point_states(record) == {0: "running", 1: "missing"}

    resumed = _started(root, env, log, "sweep", "resume", record.id, *at)
    _wait(lambda: "rerunning point 1" in log.read_text(), "the resume to take its points")
    time.sleep(4)  # four of the pool's polls: time enough to start point 1, were a slot free
    assert [t["lambda"] for t in _traces(trace, "start")] == [2], "point 1 waits for the slot"
    resumed.send_signal(signal.SIGINT)
    assert resumed.wait(timeout=120) == 130, log.read_text()
    assert not _alive(stage) and _in_group(task) == [], "the stop ended point 0's work"
    said = log.read_text()
    assert f"point 0: ended process group {task}" in said
    assert load(scratch, record.id).data["stops"][-1]["points"] == [0]
    assert point_states(load(scratch, record.id)) == {0: "stopped", 1: "missing"}

    (trace / "hold-2").unlink()
    _cli("sweep", "resume", record.id, *at)
    assert point_states(load(scratch, record.id)) == {0: "success", 1: "success"}


@pytest.mark.slow
def test_a_slurm_sweep_says_why_a_point_waits_a_resume_asks_less_and_it_outlives_a_controller_restart(
    tmp_path, monkeypatch
):
    """A point asking for more than any node has waited in silence, `pending` for good; and a
    waiting sweep ended at the first squeue that failed (a controller restart of some seconds),
    while its jobs ran on. A sweep asking too much once had to start again to ask less: a resume
    now takes the resources its points ask for."""
    from prefshift.pipeline.sweep.record import load
    from prefshift.pipeline.sweep.run import point_states

    with _a_cluster_project(tmp_path, monkeypatch) as (root, trace, env):
        scratch = tmp_path / "scratch"
        at = ["--methods", "anchor_last", "--no-report", "--scratch", str(scratch), "--root", str(root)]
        at += ["--executor", "slurm"]

        # A task asking for 3 CPUs of a 2-CPU cluster: status says what SLURM says of it.
        unschedulable = _cli("sweep", "-S", "anchor.lambda=0.25", "--cpus-per-task", "3", "--no-wait", *at)
        sweep_id = unschedulable.stdout.strip().splitlines()[-1]
        waiting = _cli("sweep", "status", sweep_id, "--scratch", str(scratch), "--root", str(root)).stdout
        assert "0  sweep-anchor.lambda-0.25  pending (" in waiting, waiting
        subprocess.run(["scancel", f"--name=prefshift-{sweep_id}"], env=env, check=True)
        # It asks for less on resume: the point runs, and the sweep keeps what it now asks for.
        _wait(lambda: point_states(load(scratch, sweep_id)) == {0: "missing"}, "squeue to let go of it")
        where = ["--scratch", str(scratch), "--root", str(root)]
        resumed = _cli("sweep", "resume", sweep_id, "--cpus-per-task", "1", *where)
        assert "the points it reruns now run with --cpus-per-task=1" in resumed.stderr
        record = load(scratch, sweep_id)
        assert point_states(record) == {0: "success"}
        assert record.data["executor"]["resources"]["cpus_per_task"] == 1
        assert "--cpus-per-task=1" in (record.folder / "job-2.sbatch").read_text()

        (trace / "hold-2").write_text("")
        log = tmp_path / "sweep.log"
        sweep = _started(root, env, log, "sweep", "-S", "anchor.lambda=2", *at)
        _wait(lambda: any(t["lambda"] == 2 for t in _traces(trace, "start")), "the point to run", 300)
        restart_controller(tmp_path / "slurm", env, down_s=40)  # past squeue's own retries
        _wait(lambda: "trying again for up to" in log.read_text(), "the sweep to notice the outage", 120)
        (trace / "hold-2").unlink()
        assert sweep.wait(timeout=300) == 0, log.read_text()
    said = log.read_text()
    assert "point 0 (sweep-anchor.lambda-2): success" in said, said


@pytest.mark.slow
def test_a_resumed_slurm_point_waits_for_the_work_its_killed_task_left(tmp_path, monkeypatch):
    """`kill -9` of a SLURM task alone ends its job, and on a cluster that tracks processes by
    parentage (proctrack/linuxproc, as this one) its dvc and stage work on in the point's clone.
    A resume resubmitted the point and its task started a second dvc beside them, in the same clone,
    after deleting DVC's locks there. The resumed task now waits for the point's lock, which that
    work holds, and runs once it has ended."""
    from prefshift.pipeline.sweep.record import load
    from prefshift.pipeline.sweep.run import point_states

    with _a_cluster_project(tmp_path, monkeypatch) as (root, trace, env):
        scratch, log = tmp_path / "scratch", tmp_path / "resume.log"
        at = ["--scratch", str(scratch), "--root", str(root)]
        (trace / "hold-2").write_text("")
        submitted = _cli(
            "sweep", "-S", "anchor.lambda=2", "--methods", "anchor_last", "--no-report", "--executor",
            "slurm", "--no-wait", *at,
        )  # fmt: skip
        record = load(scratch, submitted.stdout.strip().splitlines()[-1])
        _wait(lambda: len(_traces(trace, "start")) == 1, "the point to run its stage", 300)
        task, stage = record.read_state(0)["pid"], _traces(trace, "start")[0]["pid"]
        os.kill(task, signal.SIGKILL)
        _wait(lambda: point_states(record) == {0: "stopped"}, "SLURM to end the killed task's job")
        assert _alive(stage), "the cluster let the task's stage outlive its job"

        resumed = _started(root, env, log, "sweep", "resume", record.id, *at)
        waiting = "or what it started; waiting for it to end"
        _wait(
            lambda: waiting in record.last_attempt(0) or len(_traces(trace, "start")) > 1,
            "the resumed task to wait for the point's lock, or to run",
        )
        assert len(_traces(trace, "start")) == 1, "no second attempt beside the first one's work"
        (trace / "hold-2").unlink()  # the orphaned work may now end
        assert resumed.wait(timeout=300) == 0, log.read_text()
        assert point_states(load(scratch, record.id)) == {0: "success"}
        assert "now run with" not in log.read_text(), "a resume asking nothing new changes nothing"
    (orphan,) = [t for t in _traces(trace, "end") if t["pid"] == stage]
    assert all(t["start"] > orphan["end"] for t in _traces(trace, "start")[1:]), "none ran beside it"
    filed = json.loads(
        (root / "reports" / "sweeps" / "anchor_last__anchor.lambda=2__seed=0.json").read_text()
    )
    assert filed["wrg"] == 4.0


@pytest.mark.slow
def test_a_slurm_sweep_stopped_while_its_controller_is_down_says_its_tasks_may_run_on(tmp_path, monkeypatch):
    """Ctrl-C while squeue failed (a controller restart): the stop's own squeue raised, so the sweep
    ended in that error (exit 2), its record silent on the stop and its tasks running on. It now
    exits as a stop does and records it, saying the tasks may run on and how to cancel them."""
    from prefshift.pipeline.sweep.record import load

    with _a_cluster_project(tmp_path, monkeypatch) as (root, trace, env):
        scratch, log = tmp_path / "scratch", tmp_path / "sweep.log"
        (trace / "hold-2").write_text("")
        sweep = _started(
            root, env, log, "sweep", "-S", "anchor.lambda=2", "--methods", "anchor_last", "--no-report",
            "--executor", "slurm", "--scratch", str(scratch),
        )  # fmt: skip
        _wait(lambda: len(_traces(trace, "start")) == 1, "the point to run its stage", 300)
        with controller_down(tmp_path / "slurm", env):
            sweep.send_signal(signal.SIGINT)
            assert sweep.wait(timeout=300) == 130, log.read_text()
        record = load(scratch, next(scratch.glob("*/sweep.json")).parent.name)
        (trace / "hold-2").unlink()
    stop = record.data["stops"][-1]
    assert stop["signal"] == "SIGINT" and stop["points"] == [0]
    (said,) = stop["done"]
    assert said.startswith("SLURM did not answer (") and said.endswith(
        f"the sweep's tasks may run on: `scancel --name=prefshift-{record.id}` once it answers"
    )
    assert f"  {said}" in log.read_text()


@pytest.mark.slow
def test_a_task_tells_the_stages_dvc_recomputed_for_want_of_their_outputs_on_the_remote(
    tmp_path, monkeypatch
):
    """A cluster task pulls the shared stages' outputs from the DVC remote (`dvc exp run --pull`);
    one that cannot (a remote the node does not reach) recomputes them and says so in one log line,
    which the task keeps for status. Read from real DVC output, with and without the remote's data."""
    from prefshift.pipeline.sweep.commands import run_dvc
    from prefshift.pipeline.sweep.task import UNPULLED

    env = _in_sweep_env(monkeypatch)
    root, trace = _project(tmp_path, env, remotes=True)
    said = []
    for attempt in ("empty remote", "pushed"):
        clone = tmp_path / attempt.replace(" ", "-")
        _run(["git", "clone", "-q", "-b", "main", str(tmp_path / "origin.git"), str(clone)], tmp_path, env)
        output = run_dvc(clone, ["exp", "run", "--pull", "-S", "anchor.lambda=0.5", "report"], echo=False)
        said.append(UNPULLED.findall(output))
        _run(["dvc", "push", "-q"], root, env)
    assert said == [["prepare"], []]
    assert (trace / "prepare-runs").read_text() == "prepare\nprepare\n", "recomputed once, then pulled"


@pytest.mark.slow
def test_an_sbatch_that_fails_after_queueing_leaves_no_job_behind_and_no_false_word(tmp_path, monkeypatch):
    """sbatch can fail talking to the controller after it queued the job (a timeout on send/recv).
    The sweep said nothing was submitted and deleted its folder, while the job ran on without its
    log folder. It now cancels any job by the sweep's name and keeps its folder where one was
    queued. And a resume whose sbatch failed said the sweep's jobs went on, with none queued by it.
    (sbatch here is the real one behind a script that then reports that failure.)"""
    from prefshift.pipeline.sweep.record import load
    from prefshift.pipeline.sweep.run import point_states

    with _a_cluster_project(tmp_path, monkeypatch) as (root, trace, _):
        (wrapped := tmp_path / "bin").mkdir()
        failing = (
            "echo 'sbatch: error: Batch job submission failed: Socket timed out on send/recv operation' >&2"
        )
        sbatch = f'#!/bin/sh\n{shutil.which("sbatch")} "$@"\n{failing}\nexit 1\n'
        (wrapped / "sbatch").write_text(sbatch)
        (wrapped / "sbatch").chmod(0o755)
        monkeypatch.setenv("PATH", f"{wrapped}{os.pathsep}{os.environ['PATH']}")
        scratch = tmp_path / "scratch"
        at = ["--methods", "anchor_last", "--no-report", "--scratch", str(scratch), "--root", str(root)]
        (trace / "hold-2").write_text("")
        failed = _cli("sweep", "-S", "anchor.lambda=2", "--executor", "slurm", *at, code=2).stderr
        record = load(scratch, next(scratch.glob("*/sweep.json")).parent.name)
        kept = f"sweep {record.id}: sbatch failed; its folder is kept: scancel --name=prefshift-{record.id}: "
        assert f"{kept}points 0" in failed
        assert point_states(record)[0] in ("missing", "stopped"), "the job it queued was cancelled"

        resumed = _cli("sweep", "resume", record.id, *at[-4:], code=2).stderr
        assert "Socket timed out on send/recv operation" in resumed and "go on" not in resumed
        (trace / "hold-2").unlink()
