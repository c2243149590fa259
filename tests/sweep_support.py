"""The sweep tests' toy project and how they drive it: a trivial two-stage DVC project (seconds per
point) whose stage holds while a `hold-<lambda>` file exists and leaves a trace of each start and
end, a one-node SLURM with an MLflow server, and a sweep started through a pipe or a tmux terminal.
Shared by the executor tests (test_sweep_executors.py) and the cluster's own (test_sweep_slurm.py)."""

from __future__ import annotations

import json
import os
import shlex
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
from proc_support import processes
from slurm_support import running_cluster, why_not

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
import importlib.util, json, os, pathlib, sys, time, yaml
trace = pathlib.Path(sys.argv[1])
lam = yaml.safe_load(open("params.yaml"))["anchor"]["lambda"]
if lam == 13:
    sys.exit(f"evaluate.py: no result for lambda {lam}")
checkpoint = pathlib.Path("models/checkpoints/evaluate/step")
seen = {"lambda": lam, "pid": os.getpid(), "devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "threads": os.environ.get("OMP_NUM_THREADS"), "resumed": checkpoint.exists(), "start": time.time(),
        "links": os.stat("data/base.txt").st_nlink, "prefshift": importlib.util.find_spec("prefshift").origin}
def put(name, record):  # whole or not at all: a test polls these files while the stage writes them
    (part := trace / f".{name}.part").write_text(json.dumps(record))
    os.replace(part, trace / name)
put(f"start-{lam}-{os.getpid()}.json", seen)
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
put(f"end-{lam}-{os.getpid()}.json", {**seen, "end": time.time()})
"""


def sweep_env(**extra: str) -> dict[str, str]:
    """The test's environment for a sweep, without the tracking URI and torch's thread count (tests/
    conftest.py sets that): a local sweep gives each task its share of the cores."""
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "OMP_NUM_THREADS")}
    env.update({f"GIT_{w}_{x}": "t" for w in ("AUTHOR", "COMMITTER") for x in ("NAME", "EMAIL")})
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    return {**env, **extra}


def in_sweep_env(monkeypatch) -> dict[str, str]:
    """`sweep_env()`, also set in this process (its PATH and git identity): `resume` and the CLI run
    here, and sbatch hands its environment on."""
    env = sweep_env()
    for key in ("PATH", *(k for k in env if k.startswith("GIT_"))):
        monkeypatch.setenv(key, env[key])
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return env


def start_prefshift(root: Path, env: dict[str, str], log: Path, *command: str) -> subprocess.Popen:
    """`prefshift <command>` in the background, its output into `log`, Ctrl-C taken (not ignored)."""
    with open(log, "w") as out:
        return subprocess.Popen(
            [str(BIN / "prefshift"), *command], cwd=root, env=env, stdout=out, stderr=out,
            preexec_fn=take_ctrl_c,
        )  # fmt: skip


def run_ok(args, cwd, env) -> str:
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True)
    assert done.returncode == 0, f"{args}: {done.stdout}\n{done.stderr}"
    return done.stdout


def toy_project(
    tmp: Path, env: dict[str, str], remotes: bool, committed: bool = True, subdir: str = ""
) -> tuple[Path, Path]:
    """A two-stage project (prepare → report) reproduced once, committed with its results (or, not
    `committed`, its sources alone); with `remotes`, a bare git origin holding the baseline and a
    local DVC remote; with `subdir`, in that folder of its git repository, as in a monorepo.
    Returns (project, trace folder)."""
    top, trace = tmp / "project", tmp / "trace"
    (root := top / subdir).mkdir(parents=True)
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
    run_ok(["git", "init", "-q", "-b", "main"], top, env)
    run_ok(["dvc", "init", "-q", *(["--subdir"] if subdir else [])], root, env)
    if remotes:
        run_ok(["git", "init", "-q", "--bare", str(tmp / "origin.git")], tmp, env)
        run_ok(["git", "remote", "add", "origin", str(tmp / "origin.git")], root, env)
        run_ok(["dvc", "remote", "add", "-d", "shared", str(tmp / "dvc-remote")], root, env)
    if not committed:
        run_ok(["git", "add", "-A"], root, env)
        run_ok(["git", "commit", "-qm", "sources"], root, env)
    run_ok(["dvc", "repro"], root, env)
    for baseline_trace in [*trace.glob("start-*"), *trace.glob("end-*")]:
        baseline_trace.unlink()  # the traces left are the sweep's own
    if committed:
        run_ok(["git", "add", "-A"], root, env)
        run_ok(["git", "commit", "-qm", "baseline"], root, env)
    if remotes:
        run_ok(["git", "push", "-q", "origin", "main"], root, env)
    return root, trace


def on_a_cluster(stack: ExitStack, tmp: Path, env: dict[str, str], monkeypatch) -> str:
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
def a_cluster_project(
    tmp: Path, monkeypatch, subdir: str = ""
) -> Iterator[tuple[Path, Path, dict[str, str]]]:
    """(project with remotes, trace folder, environment) on a one-node SLURM with an MLflow server,
    for the body; the test is skipped where SLURM cannot run. `subdir` as for toy_project."""
    if reason := why_not():
        pytest.skip(reason)
    env = in_sweep_env(monkeypatch)
    with ExitStack() as stack:
        root, trace = toy_project(tmp, env, remotes=True, subdir=subdir)
        on_a_cluster(stack, tmp, env, monkeypatch)
        yield root, trace, env


@contextmanager
def a_project(
    tmp: Path, monkeypatch, executor: str, subdir: str = ""
) -> Iterator[tuple[Path, Path, dict[str, str]]]:
    """(project, trace folder, environment) for `executor`: on a one-node SLURM with remotes (as
    a_cluster_project), else on this machine alone. `subdir` as for toy_project."""
    if executor == "slurm":
        with a_cluster_project(tmp, monkeypatch, subdir) as made:
            yield made
    else:
        env = in_sweep_env(monkeypatch)
        yield (*toy_project(tmp, env, remotes=False, subdir=subdir), env)


def waits_or_runs(trace: Path, logs: Path, waiting: str) -> Callable[[], bool]:
    """Whether a second task of the point says `waiting` in its log (`logs`: a scratch folder), or
    has started the point's stage beside the first: what a test of the wait waits for."""

    def seen() -> bool:
        said = "".join(log.read_text() for log in logs.glob("*/logs/0.log"))
        return len(trace_records(trace, "start")) > 1 or waiting in said

    return seen


def trace_records(trace: Path, kind: str) -> list[dict]:
    """The stage's `kind` records (start, end) in the order they happened. Not in their files' name
    order: a name ends in the pid, and pid 977 sorted after 1003, so a test read an attempt that a
    kill had already ended as the one running."""
    records = [json.loads(p.read_text()) for p in trace.glob(f"{kind}-*.json")]
    return sorted(records, key=lambda record: record[kind])


def wait_until(condition, what: str, timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.3)


def run_cli(*args: str, code: int = 0):
    """A prefshift command in this process (its subprocesses are real: git, dvc, sbatch)."""
    from typer.testing import CliRunner

    from prefshift.cli import app

    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == code, (result.exit_code, result.stdout, result.stderr, result.exception)
    return result


def is_alive(pid: int) -> bool:
    """A process that runs (a zombie waiting to be reaped does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def in_group(pgid: int) -> list[int]:
    """Live processes of process group `pgid` (zombies waiting to be reaped are not)."""
    return [pid for pid, state, _, group in processes() if group == pgid and state != "Z"]


def take_ctrl_c() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # a background job of a script inherits it ignored


def through_pipe(command: list[str], root: Path, env: dict) -> tuple[callable, callable]:
    """Start the sweep with stdout and stderr into a pipe whose reader exits at once (as
    `prefshift sweep ... | head -c 0`); return (stop it with SIGINT, its exit status)."""
    read, write = os.pipe()
    proc = subprocess.Popen(command, cwd=root, env=env, stdout=write, stderr=write, preexec_fn=take_ctrl_c)
    os.close(write)
    os.close(read)  # the reader is gone before the sweep writes its first line

    def status() -> int | None:
        return proc.poll()

    def stop() -> int:
        proc.send_signal(signal.SIGINT)
        return proc.wait(timeout=300)

    return stop, status


def through_tmux(
    command: list[str], root: Path, env: dict, tmp: Path, close: bool = False
) -> tuple[callable, callable]:
    """Start the sweep in a tmux terminal of its own (a private server). Stopping types Ctrl-C into
    it and returns the exit status; with `close`, the sweep runs as the terminal's own process and
    stopping closes the terminal (SIGHUP), returning None once the sweep has exited."""
    script, code, pid = tmp / "run.sh", tmp / "exit-code", tmp / "sweep-pid"
    exports = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in env.items())
    run = (
        f"echo $$ > {pid}\nexec {shlex.join(command)}\n"
        if close
        else f"{shlex.join(command)}\necho $? > {code}\n"
    )
    script.write_text(f"{exports}cd {shlex.quote(str(root))}\n{run}")
    server = ["tmux", "-L", f"prefshift-{os.getpid()}-{tmp.name}"]
    subprocess.run([*server, "new-session", "-d", "-x", "160", "-y", "40", "bash", str(script)], check=True)

    def status() -> int | None:
        return int(code.read_text()) if code.exists() and code.read_text().strip() else None

    def stop() -> int | None:
        if close:
            sweep = int(pid.read_text())
            subprocess.run([*server, "kill-server"], check=True)
            wait_until(lambda: not is_alive(sweep), "the sweep to exit once its terminal closed", 300)
            return None
        subprocess.run([*server, "send-keys", "C-c"], check=True)
        try:
            wait_until(lambda: status() is not None, "the sweep to exit after Ctrl-C", 300)
        finally:
            subprocess.run([*server, "kill-server"], capture_output=True)
        return status()

    return stop, status


def first_done_second_running(
    scratch: Path, trace: Path, status: Callable[[], int | None]
) -> Callable[[], bool]:
    """Whether a two-point sweep in `scratch` has finished point 0 while point 1 (lambda 2) runs:
    the moment the stop tests stop it at. `status` is the sweep's exit status, None while it runs."""
    from prefshift.pipeline.sweep.record import load

    def seen() -> bool:
        assert status() is None, f"the sweep ended early (exit {status()})"
        folders = list(scratch.glob("*/sweep.json"))
        if not folders or not any(t["lambda"] == 2 for t in trace_records(trace, "start")):
            return False
        return load(scratch, folders[0].parent.name).read_state(0).get("state") == "success"

    return seen
