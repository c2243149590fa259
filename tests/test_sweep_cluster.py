"""Sweeps whose points run in clones of their own: through a real one-node SLURM cluster, and on
the GPUs of one machine (a fake device list: no GPU here). The pipeline is a trivial two-stage
DVC project (seconds per point); the sweep's code path, git, DVC, SLURM and MLflow are real."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

import pytest
import yaml

from e2e_project import REPO
from mlflow_support import free_port, running_server
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
import json, os, pathlib, sys, time, yaml
trace = pathlib.Path(sys.argv[1])
lam = yaml.safe_load(open("params.yaml"))["anchor"]["lambda"]
checkpoint = pathlib.Path("models/checkpoints/evaluate/step")
seen = {"lambda": lam, "pid": os.getpid(), "devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "resumed": checkpoint.exists(), "start": time.time()}
(trace / f"start-{lam}-{os.getpid()}.json").write_text(json.dumps(seen))
checkpoint.parent.mkdir(parents=True, exist_ok=True)
checkpoint.write_text("1")  # as training leaves its resumable checkpoint (no DVC output)
deadline = time.time() + 120
while (trace / f"hold-{lam}").exists() and time.time() < deadline:
    time.sleep(0.2)
barrier = trace / "barrier"  # wait (bounded) until this many points have started: they overlap
deadline = time.time() + 300
while barrier.exists() and len(list(trace.glob("start-*"))) < int(barrier.read_text()):
    if time.time() > deadline:
        break
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
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    env.update({f"GIT_{w}_{x}": "t" for w in ("AUTHOR", "COMMITTER") for x in ("NAME", "EMAIL")})
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    return {**env, **extra}


def _run(args, cwd, env) -> str:
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True)
    assert done.returncode == 0, f"{args}: {done.stdout}\n{done.stderr}"
    return done.stdout


def _project(tmp: Path, env: dict[str, str], remotes: bool) -> tuple[Path, Path]:
    """A committed two-stage project (prepare → report) reproduced once; with `remotes`, a bare git
    origin holding the baseline and a local DVC remote. Returns (project, trace folder)."""
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
            "cmd": f"{sys.executable} prepare.py {trace}",
            "deps": ["prepare.py"],
            "outs": ["data/base.txt"],
        },
        "report": {
            "cmd": f"{sys.executable} evaluate.py {trace}",
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
    _run(["dvc", "repro"], root, env)
    for baseline_trace in [*trace.glob("start-*"), *trace.glob("end-*")]:
        baseline_trace.unlink()  # the traces left are the sweep's own
    _run(["git", "add", "-A"], root, env)
    _run(["git", "commit", "-qm", "baseline"], root, env)
    if remotes:
        _run(["git", "push", "-q", "origin", "main"], root, env)
    return root, trace


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


@pytest.mark.slow
def test_a_slurm_sweep_resumes_only_its_cancelled_point_and_gathers_both(tmp_path, monkeypatch):
    reason = why_not()
    if reason:
        pytest.skip(reason)
    from mlflow import MlflowClient

    from prefshift.pipeline import sweep_clones
    from prefshift.pipeline.sweep_record import load

    env = _env()
    for key in ("PATH", *(k for k in env if k.startswith("GIT_"))):
        monkeypatch.setenv(key, env[key])  # sbatch hands this process's environment to the tasks
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    with ExitStack() as stack:
        building = stack.enter_context(ThreadPoolExecutor(1)).submit(_project, tmp_path, env, True)
        # The MLflow server starts while the project builds.
        uri = stack.enter_context(running_server(tmp_path / "mlflow", free_port()))
        root, trace = building.result()
        scratch = tmp_path / "scratch"
        sweep = ["sweep", "-S", "anchor.lambda=0.5,2", "--methods", "anchor_last", "--no-report"]
        sweep += ["--root", str(root), "--executor", "slurm", "--scratch", str(scratch), "--time", "10:00"]
        sweep.append("--no-wait")

        # No tracking URI set: the project's sqlite file would take writers from every node. Refused,
        # with the server to start named; nothing is submitted.
        refused = _cli(*sweep, code=2).stderr
        assert (
            "cannot log to a sqlite file" in refused and "mlflow server" in refused and not scratch.exists()
        )

        slurm = stack.enter_context(running_cluster(tmp_path / "slurm"))
        monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
        monkeypatch.setenv("SLURM_CONF", slurm["SLURM_CONF"])
        MlflowClient(uri).create_experiment("cluster-sweep")
        (trace / "hold-2").write_text("")  # point 1 (lambda 2) waits mid-run until the test cancels it
        sweep_id = _cli(*sweep).stdout.strip().splitlines()[-1]
        record = load(scratch, sweep_id)
        script = record.script(1).read_text()
        assert "#SBATCH --array=0-1" in script and "#SBATCH --time=10:00" in script
        assert f"export MLFLOW_TRACKING_URI={uri}" in script

        _wait(lambda: any(t["lambda"] == 2 for t in _traces(trace, "start")), "point 1 to start")
        _run(["scancel", f"{record.data['jobs'][0]['job']}_1"], root, {**env, **slurm})
        _wait(
            lambda: sorted(sweep_clones.point_states(record).values()) == ["stopped", "success"],
            "point 0 to finish and point 1 to stop",
        )
        status = _cli("sweep", "status", sweep_id, "--scratch", str(scratch), "--root", str(root)).stdout
        assert "0  sweep-anchor.lambda-0.5  success" in status
        assert "1  sweep-anchor.lambda-2  stopped" in status and f"log: {record.log(1)}" in status
        early = _cli(
            "sweep", "collect", sweep_id, "--scratch", str(scratch), "--root", str(root), code=2
        ).stderr
        assert f"prefshift sweep resume {sweep_id}" in early

        (trace / "hold-2").unlink()
        resumed = sweep_clones.resume(root, sweep_id, scratch, poll_s=1.0)  # the command, polling faster
        assert resumed["resubmitted"] == [1]  # never point 0, which finished
        assert "#SBATCH --array=1\n" in load(scratch, sweep_id).script(2).read_text()
        client = MlflowClient(uri)
        runs = client.search_runs([client.get_experiment_by_name("cluster-sweep").experiment_id])
        assert sorted((r.data.params["lambda"], r.info.status) for r in runs) == [
            ("0.5", "FINISHED"),
            ("2", "FINISHED"),
        ]

    starts = _traces(trace, "start")
    assert sorted(t["lambda"] for t in starts) == [0.5, 2, 2]  # 0.5 never reran
    assert max((t for t in starts if t["lambda"] == 2), key=lambda t: t["start"])["resumed"], (
        "the resumed point found its checkpoint in its clone"
    )
    assert (trace / "prepare-runs").read_text() == "prepare\n", (
        "tasks pulled prepare's output, never reran it"
    )
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


@pytest.mark.slow
def test_local_gpus_give_each_running_point_its_own_devices(tmp_path, monkeypatch):
    """Before, `--jobs 8` on an 8-GPU machine trained every experiment on the first GPU. (That a
    device set given back goes to the next point is test_device_sets_are_disjoint_and_come_back's.)"""
    env = _env()
    for key in ("PATH", *(k for k in env if k.startswith("GIT_"))):
        monkeypatch.setenv(key, env[key])
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    root, trace = _project(tmp_path, env, remotes=False)
    (trace / "barrier").write_text("2")  # each point waits for the other: disjointness is tested, not granted
    sweep = [
        "sweep",
        "-S",
        "anchor.lambda=0.5,2",
        "--methods",
        "anchor_last",
        "--no-report",
        "--root",
        str(root),
    ]
    _cli(*sweep, "--executor", "local-gpus", "--gpus", "0,1", "--scratch", str(tmp_path / "scratch"))
    runs = _traces(trace, "end")
    assert sorted(t["lambda"] for t in runs) == [0.5, 2]
    assert {t["devices"] for t in runs} == {"0", "1"}
    overlapping = [
        (a, b)
        for i, a in enumerate(runs)
        for b in runs[i + 1 :]
        if a["start"] < b["end"] and b["start"] < a["end"]
    ]
    assert overlapping, "two points ran at once"
    assert all(a["devices"] != b["devices"] for a, b in overlapping)
    # The experiments came back into the workspace itself (its own git remote, on one machine).
    names = _run(["dvc", "exp", "list", "--name-only"], root, env).split()
    assert sorted(names) == ["sweep-anchor.lambda-0.5", "sweep-anchor.lambda-2"]
    assert (root / "reports" / "sweeps" / "anchor_last__anchor.lambda=2__seed=0.json").is_file()


def test_device_sets_are_disjoint_and_come_back():
    from prefshift.pipeline.sweep_local_gpus import DeviceError, DevicePool, parse_devices

    pool = DevicePool(parse_devices("0, 1,2,3,4"), per_task=2)
    first, second = pool.take(), pool.take()
    assert (first, second, pool.take()) == (("0", "1"), ("2", "3"), None)  # one device left: not a set
    pool.give(first)
    assert set(pool.take()) == {"4", "0"}
    for text, message in (
        ("0,0", "listed twice"),
        ("0,,1", "separated by commas"),
        ("", "separated by commas"),
    ):
        with pytest.raises(DeviceError, match=message):
            parse_devices(text)
    with pytest.raises(DeviceError, match="give 1 to 2"):
        DevicePool(["0", "1"], per_task=3)


def test_a_point_state_reads_silence_after_running_as_stopped():
    from prefshift.pipeline.sweep_record import point_state

    assert point_state({"state": "success"}, "running") == "success"  # a requeued finished task
    assert point_state({"state": "running"}, "running") == "running"
    assert point_state({}, "pending") == "pending"
    assert point_state({"state": "running"}, None) == "stopped"  # killed before it could say more
    assert point_state({"state": "failed"}, None) == "failed"
    assert point_state({}, None) == "missing"  # cancelled while pending


def test_the_sbatch_script_carries_resources_then_the_users_template(tmp_path):
    from prefshift.pipeline.sweep_record import SweepRecord
    from prefshift.pipeline.sweep_slurm import (
        SlurmError,
        SlurmResources,
        _array_indices,
        array_spec,
        render_script,
    )

    template = tmp_path / "extra.sh"
    template.write_text("#SBATCH --qos=long\nmodule load cuda\n")
    resources = SlurmResources(
        gpus_per_task=2, partition="gpu", time="1-00:00:00", account="lab", template=template
    )
    resources.check()
    record = SweepRecord(tmp_path / "s1", {"id": "s1", "points": [{}] * 5, "names": [], "jobs": []})
    script = render_script(record, [0, 1, 2, 4], resources, {"MLFLOW_TRACKING_URI": "http://h:5000"})
    lines = script.splitlines()
    assert (
        "#SBATCH --array=0-2,4" in lines
        and "#SBATCH --gres=gpu:2" in lines
        and "#SBATCH --account=lab" in lines
    )
    # Every #SBATCH line comes before the first command, or sbatch would ignore it.
    first_command = lines.index("module load cuda")
    assert lines.index("#SBATCH --qos=long") < first_command < lines.index("set -euo pipefail")
    assert lines[-1].endswith(f'sweep task {tmp_path / "s1"} "$SLURM_ARRAY_TASK_ID"')
    assert array_spec([3, 1, 2, 7]) == "1-3,7" and _array_indices("[0-2,5%4]") == [0, 1, 2, 5]
    with pytest.raises(SlurmError, match="SLURM's form"):
        SlurmResources(time="12h").check()
    with pytest.raises(SlurmError, match="no such file"):
        SlurmResources(template=tmp_path / "absent.sh").check()


def test_a_long_point_gets_a_short_stable_name():
    from prefshift.pipeline.sweep import MAX_NAME, experiment_name

    point = {f"backbone.strong.option_{i}": "meta-llama/Llama-3.1-8B" for i in range(6)}
    name = experiment_name(point)
    assert len(name) <= MAX_NAME and name == experiment_name(dict(point))
    assert name != experiment_name({**point, "seed": "2"})


def test_status_names_each_unfinished_point_with_why_and_its_log(tmp_path):
    import socket

    from prefshift.core.atomic import write_json
    from prefshift.pipeline.sweep_clones import status_lines
    from prefshift.pipeline.sweep_record import create

    names = [f"sweep-seed-{i}" for i in range(4)]
    record = create(tmp_path, {"points": [{"seed": str(i)} for i in range(4)], "names": names})
    record.data["executor"] = {"kind": "local-gpus"}
    here = socket.gethostname()
    error = "`dvc exp run ...` failed (exit 1):\nRunning stage 'report':\nERROR: failed to reproduce 'report'"
    write_json(record.state_file(0), {"state": "success"})
    write_json(
        record.state_file(1), {"state": "failed", "step": "run", "error": error, "host": here, "pid": 1}
    )
    write_json(record.state_file(2), {"state": "running", "step": "run", "host": here, "pid": 2**22 + 1})
    lines = status_lines(record)
    assert lines[0] == "0  sweep-seed-0  success"
    assert lines[1] == (
        "1  sweep-seed-1  failed  (failed during run: ERROR: failed to reproduce 'report')  "
        f"log: {record.log(1)}"
    )
    assert lines[2].startswith(
        "2  sweep-seed-2  stopped  (ended during run without a word: cancelled, preempted"
    )
    assert lines[3] == f"3  sweep-seed-3  missing  (never started)  log: {record.log(3)}"
