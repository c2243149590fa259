"""The SLURM executor's own cases on a real one-node cluster (tests/slurm_support.py): what squeue
says of a waiting point, a controller restart ridden out or met by a stop, a resume asking other
resources, a task killed alone, an sbatch that fails after queueing. The cases every executor
shares are in test_sweep_executors.py; the toy project and its helpers in sweep_support.py."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess

import pytest

from slurm_support import controller_down, restart_controller
from sweep_support import (
    a_cluster_project,
    is_alive,
    run_cli,
    start_prefshift,
    trace_records,
    wait_until,
)


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

    with a_cluster_project(tmp_path, monkeypatch) as (root, trace, env):
        scratch = tmp_path / "scratch"
        at = ["--methods", "anchor_last", "--no-report", "--scratch", str(scratch), "--root", str(root)]
        at += ["--executor", "slurm"]

        # A task asking for 3 CPUs of a 2-CPU cluster: status says what SLURM says of it.
        unschedulable = run_cli("sweep", "-S", "anchor.lambda=0.25", "--cpus-per-task", "3", "--no-wait", *at)
        sweep_id = unschedulable.stdout.strip().splitlines()[-1]
        waiting = run_cli("sweep", "status", sweep_id, "--scratch", str(scratch), "--root", str(root)).stdout
        assert "0  sweep-anchor.lambda-0.25  pending (" in waiting, waiting
        subprocess.run(["scancel", f"--name=prefshift-{sweep_id}"], env=env, check=True)
        # It asks for less on resume: the point runs, and the sweep keeps what it now asks for.
        wait_until(lambda: point_states(load(scratch, sweep_id)) == {0: "missing"}, "squeue to let go of it")
        where = ["--scratch", str(scratch), "--root", str(root)]
        resumed = run_cli("sweep", "resume", sweep_id, "--cpus-per-task", "1", *where)
        assert "the points it reruns now run with --cpus-per-task=1" in resumed.stderr
        record = load(scratch, sweep_id)
        assert point_states(record) == {0: "success"}
        assert record.data["executor"]["resources"]["cpus_per_task"] == 1
        assert "--cpus-per-task=1" in (record.folder / "job-2.sbatch").read_text()

        (trace / "hold-2").write_text("")
        log = tmp_path / "sweep.log"
        sweep = start_prefshift(root, env, log, "sweep", "-S", "anchor.lambda=2", *at)
        wait_until(
            lambda: any(t["lambda"] == 2 for t in trace_records(trace, "start")), "the point to run", 300
        )
        restart_controller(tmp_path / "slurm", env, down_s=40)  # past squeue's own retries
        wait_until(lambda: "trying again for up to" in log.read_text(), "the sweep to notice the outage", 120)
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

    with a_cluster_project(tmp_path, monkeypatch) as (root, trace, env):
        scratch, log = tmp_path / "scratch", tmp_path / "resume.log"
        at = ["--scratch", str(scratch), "--root", str(root)]
        (trace / "hold-2").write_text("")
        submitted = run_cli(
            "sweep", "-S", "anchor.lambda=2", "--methods", "anchor_last", "--no-report", "--executor",
            "slurm", "--no-wait", *at,
        )  # fmt: skip
        record = load(scratch, submitted.stdout.strip().splitlines()[-1])
        wait_until(lambda: len(trace_records(trace, "start")) == 1, "the point to run its stage", 300)
        task, stage = record.read_state(0)["pid"], trace_records(trace, "start")[0]["pid"]
        os.kill(task, signal.SIGKILL)
        wait_until(lambda: point_states(record) == {0: "stopped"}, "SLURM to end the killed task's job")
        assert is_alive(stage), "the cluster let the task's stage outlive its job"

        resumed = start_prefshift(root, env, log, "sweep", "resume", record.id, *at)
        waiting = "or what it started; waiting for it to end"
        wait_until(
            lambda: waiting in record.last_attempt(0) or len(trace_records(trace, "start")) > 1,
            "the resumed task to wait for the point's lock, or to run",
        )
        assert len(trace_records(trace, "start")) == 1, "no second attempt beside the first one's work"
        (trace / "hold-2").unlink()  # the orphaned work may now end
        assert resumed.wait(timeout=300) == 0, log.read_text()
        assert point_states(load(scratch, record.id)) == {0: "success"}
        assert "now run with" not in log.read_text(), "a resume asking nothing new changes nothing"
    (orphan,) = [t for t in trace_records(trace, "end") if t["pid"] == stage]
    assert all(t["start"] > orphan["end"] for t in trace_records(trace, "start")[1:]), "none ran beside it"
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

    with a_cluster_project(tmp_path, monkeypatch) as (root, trace, env):
        scratch, log = tmp_path / "scratch", tmp_path / "sweep.log"
        (trace / "hold-2").write_text("")
        sweep = start_prefshift(
            root, env, log, "sweep", "-S", "anchor.lambda=2", "--methods", "anchor_last", "--no-report",
            "--executor", "slurm", "--scratch", str(scratch),
        )  # fmt: skip
        wait_until(lambda: len(trace_records(trace, "start")) == 1, "the point to run its stage", 300)
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
def test_an_sbatch_that_fails_after_queueing_leaves_no_job_behind_and_no_false_word(tmp_path, monkeypatch):
    """sbatch can fail talking to the controller after it queued the job (a timeout on send/recv).
    The sweep said nothing was submitted and deleted its folder, while the job ran on without its
    log folder. It now cancels any job by the sweep's name and keeps its folder where one was
    queued. And a resume whose sbatch failed said the sweep's jobs went on, with none queued by it.
    (sbatch here is the real one behind a script that then reports that failure.)"""
    from prefshift.pipeline.sweep.record import load
    from prefshift.pipeline.sweep.run import point_states

    with a_cluster_project(tmp_path, monkeypatch) as (root, trace, _):
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
        failed = run_cli("sweep", "-S", "anchor.lambda=2", "--executor", "slurm", *at, code=2).stderr
        record = load(scratch, next(scratch.glob("*/sweep.json")).parent.name)
        kept = f"sweep {record.id}: sbatch failed; its folder is kept: scancel --name=prefshift-{record.id}: "
        assert f"{kept}points 0" in failed
        assert point_states(record)[0] in ("missing", "stopped"), "the job it queued was cancelled"

        # The points log to the server the sweep started with: one that no longer answers is named.
        uri, record.data["tracking_uri"] = record.data["tracking_uri"], "http://127.0.0.1:9"
        record.save()
        refused = run_cli("sweep", "resume", record.id, *at[-4:], code=2).stderr
        assert "MLflow tracking URI http://127.0.0.1:9: the server does not answer" in refused
        assert "its points log there: start it at that address, before sweeping" in refused
        record.data["tracking_uri"] = uri
        record.save()

        resumed = run_cli("sweep", "resume", record.id, *at[-4:], code=2).stderr
        assert "Socket timed out on send/recv operation" in resumed and "go on" not in resumed
        (trace / "hold-2").unlink()
