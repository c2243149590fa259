"""Clean lifecycles (issue 30, item 7): writers lock their outputs, unlisted methods and busy ports are
refused, and nothing a command starts outlives it. Real processes throughout; a stopped sweep's
tasks are test_sweep_executors.py's and MLflow's run states test_tracking.py's."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from prefshift.cli import app
from prefshift.core import locks
from prefshift.core.paths import Layout
from tiny_project import copy_project, pipeline_root, tiny_params, write_params

PREFSHIFT = str(Path(sys.executable).parent / "prefshift")
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
BOUND_S = 600.0
"""Generous: a tiny training takes seconds alone, but this machine may be shared and loaded."""


@pytest.fixture
def project(tmp_path_factory, tmp_path) -> Layout:
    return copy_project(pipeline_root(tmp_path_factory), tmp_path / "project")


def _prefshift(layout: Layout, *args: str, **kwargs) -> subprocess.Popen:
    cmd = [PREFSHIFT, *args, "--root", str(layout.root), "--params", str(layout.root / "params.yaml")]
    return subprocess.Popen(cmd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)


def _wait_for_holder(lock: Path, proc: subprocess.Popen) -> None:
    """Poll until `proc` has recorded itself in `lock` (it holds it then), or fail with its output."""
    deadline = time.monotonic() + BOUND_S
    while time.monotonic() < deadline:
        try:
            if json.loads(lock.read_text())["pid"] == proc.pid:
                return
        except (OSError, ValueError, KeyError):
            pass
        if proc.poll() is not None:
            pytest.fail(f"the first writer ended before it held {lock}: {proc.communicate()}")
        time.sleep(0.05)
    pytest.fail(f"{proc.args} did not take {lock} within {BOUND_S:.0f} s")


def _finish(proc: subprocess.Popen) -> tuple[int, str]:
    try:
        _, err = proc.communicate(timeout=BOUND_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return proc.returncode, err


def test_a_second_training_of_one_student_fails_at_once_naming_the_first(project):
    """Before, both ran and shared models/checkpoints/naive; one run was left holding half a checkpoint."""
    lock = locks.lock_file(project.root, project.student_dir("naive"))
    first = _prefshift(project, "train", "--method", "naive")
    try:
        _wait_for_holder(lock, first)
        first.send_signal(signal.SIGSTOP)  # holds the lock for as long as the second needs, under any load
        code, err = _finish(_prefshift(project, "train", "--method", "naive"))
        assert code == 2, err
        named = err.split("error: ", 1)[-1].split(" is being written by ")[0]
        assert named in (str(project.student_dir("naive")), str(project.checkpoint_dir("naive"))), err
        assert f"is being written by process {first.pid} (`prefshift train --method naive`" in err
        assert "Traceback" not in err
    finally:
        first.send_signal(signal.SIGCONT)
    code, err = _finish(first)
    assert code == 0, err  # the first writer was not disturbed
    assert (project.student_dir("naive") / "model.safetensors").is_file()
    assert not project.checkpoint_dir("naive").exists()  # its checkpoint was its own to remove
    assert ".prefshift" not in {p.name for p in project.student_dir("naive").parents}


HOLD_METRICS = """
import sys, time
from pathlib import Path
from prefshift.pipeline.output_set import output_set
from prefshift.core.paths import Layout
layout = Layout(Path(sys.argv[1]), seed=0)
with output_set(layout.root, "prefshift evaluate --method naive", files=[layout.metrics("naive")]):
    print("holding", flush=True)
    time.sleep(600)
"""


def test_every_output_set_is_locked_and_a_killed_holder_leaves_no_lock(project):
    """A stage that writes through an output set (here: evaluate's metrics) is refused while another
    process writes that output; SIGKILL of the holder frees it, with nothing to clean up by hand."""
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_METRICS, str(project.root)], env=ENV, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "holding"
        code, err = _finish(_prefshift(project, "evaluate", "--method", "naive"))
        assert code == 2, err
        assert f"{project.metrics('naive')} is being written by process {holder.pid}" in err
    finally:
        holder.kill()
        holder.wait()
    code, err = _finish(_prefshift(project, "evaluate", "--method", "naive"))
    assert code == 0, err
    assert json.loads(project.metrics("naive").read_text())["method"] == "naive"


def test_locks_nest_within_one_process_and_live_outside_the_outputs(tmp_path):
    output = tmp_path / "models" / "students" / "naive"
    with locks.hold(tmp_path, [output], "outer"), locks.hold(tmp_path, [output], "inner"):
        assert locks.lock_file(tmp_path, output) == tmp_path / ".prefshift/locks/models/students/naive.lock"
    assert (tmp_path / ".prefshift" / ".gitignore").read_text() == "*\n"
    assert not output.exists()
    with locks.hold(tmp_path, [output]):  # released: free again
        pass


def test_the_private_folder_is_never_made_over_a_user_s_file_or_through_a_link(tmp_path):
    """`.prefshift` as a file failed every writing command with "file exists" and no way out; a
    dangling `.prefshift/.gitignore` link was written through, making a file where it pointed."""
    from prefshift.core.errors import PrefshiftError

    (tmp_path / "a").mkdir()
    (tmp_path / "a" / ".prefshift").write_text("mine")
    with pytest.raises(PrefshiftError, match=r"\.prefshift: not a folder; .*: move it away"):
        locks.hold(tmp_path / "a", [tmp_path / "a" / "out.json"]).__enter__()
    assert (tmp_path / "a" / ".prefshift").read_text() == "mine"
    (tmp_path / "b" / ".prefshift").mkdir(parents=True)
    (tmp_path / "b" / ".prefshift" / ".gitignore").symlink_to(tmp_path / "elsewhere")
    with locks.hold(tmp_path / "b", [tmp_path / "b" / "out.json"]):
        assert not (tmp_path / "elsewhere").exists()


@pytest.mark.parametrize("kind", ["link", "dangling link", "fifo"])
def test_a_lock_path_holding_a_link_or_fifo_is_refused_by_a_stage_and_left_as_it_was(project, kind, tmp_path):
    """A writer's lock file was opened through whatever stood at its path, truncated and rewritten: a
    link there had `prefshift evaluate` overwrite the file it named with its pid (as root, any file).
    The stage now refuses in one line naming the lock's path, and what stands there is untouched; a
    probe (`held`) neither follows the link nor waits on the FIFO."""
    lock, mine = locks.lock_file(project.root, project.metrics("naive")), tmp_path / "mine.txt"
    lock.parent.mkdir(parents=True, exist_ok=True)
    lock.unlink(missing_ok=True)  # the lock file the build left
    if kind == "fifo":
        os.mkfifo(lock)
    else:
        lock.symlink_to(mine)
        if kind == "link":
            mine.write_text("my notes\n")
    assert not locks.held(lock)
    code, err = _finish(_prefshift(project, "evaluate", "--method", "naive"))
    assert code == 2, err
    shown = "FIFO (named pipe)" if kind == "fifo" else "link"
    assert f"{lock}: a {shown}, where prefshift keeps a lock file it rewrites; move it away" in err
    assert "Traceback" not in err
    assert (mine.read_text() == "my notes\n") if kind == "link" else not mine.exists()
    assert lock.is_symlink() or kind == "fifo"


def test_a_probe_tells_a_held_lock_and_never_fails_a_patient_taker(tmp_path):
    """`held` answers for any holder, this process's other descriptors included, and leaves nothing
    behind; a `take` with PROBE_GRACE_S waits out probes that a tight loop keeps taking, and an
    impatient one is refused with the holder named."""
    import threading

    lock = tmp_path / "points" / "0.lock"
    assert not locks.held(lock) and not lock.exists()
    fd = locks.take(lock, "first", lambda holder: f"taken by {holder}")
    assert locks.held(lock)
    with pytest.raises(locks.LockedError, match=rf"taken by process {os.getpid()} \(`first`, since "):
        locks.take(lock, "second", lambda holder: f"taken by {holder}")
    os.close(fd)
    assert not locks.held(lock)

    probing = True

    def probe() -> None:
        while probing:
            locks.held(lock)

    prober = threading.Thread(target=probe)
    prober.start()
    try:
        for _ in range(200):
            os.close(locks.take(lock, "patient", lambda holder: f"taken by {holder}", locks.PROBE_GRACE_S))
    finally:
        probing = False
        prober.join()


HANDS_DOWN = """
import subprocess, sys
from pathlib import Path
from prefshift.core import locks
fd = locks.take(Path(sys.argv[1]), "task", lambda holder: "taken")
with locks.handed_down(fd):  # a worker started with Python's defaults: every other descriptor closed
    worker = subprocess.Popen([sys.executable, "-c", "import sys, time; print(flush=True); time.sleep(120)"],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
worker.stdout.readline()
print(worker.pid, flush=True)
"""


def test_a_lock_handed_down_is_held_until_the_last_process_started_under_it_ends(tmp_path):
    """A sweep task hands its point's lock down to its dvc and the stages dvc runs, which close every
    other descriptor they inherit: the task killed alone, what it started still holds the point (it
    still works in the point's clone). Inside, stdin is the lock; after, this process's own again."""
    lock, before = tmp_path / "points" / "0.lock", os.fstat(0)
    task = subprocess.run([sys.executable, "-c", HANDS_DOWN, str(lock)], capture_output=True, text=True)
    assert task.returncode == 0, task.stderr
    worker = int(task.stdout)
    try:
        assert locks.held(lock), "the task is gone, the worker it started holds the point"
    finally:
        os.kill(worker, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while locks.held(lock):
        assert time.monotonic() < deadline, "the lock outlived its last holder"
        time.sleep(0.05)
    fd = locks.take(lock, "here", lambda holder: "taken")
    try:
        with locks.handed_down(fd):
            assert os.path.sameopenfile(0, fd)
    finally:
        os.close(fd)
    after = os.fstat(0)
    assert (after.st_dev, after.st_ino) == (before.st_dev, before.st_ino) and not locks.held(lock)


@pytest.mark.parametrize("command", ["train", "evaluate", "targets", "downstream"])
def test_a_method_params_do_not_list_is_refused(tmp_path, command):
    """Before, `train --method ceiling` trained a student no DVC stage owns when methods left it out."""
    params = write_params(tmp_path, tiny_params(methods=["naive", "anchor_last"]))
    result = CliRunner().invoke(app, [command, "-m", "ceiling", "-p", str(params), "--root", str(tmp_path)])
    assert result.exit_code == 2, result.output
    assert "method 'ceiling' is not listed in params `methods` (naive, anchor_last)" in result.stderr
    assert "add it to `methods` in params.yaml" in result.stderr
    assert "methods=[naive, anchor_last, ceiling]" in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["params.yaml"]  # nothing was started


def test_ui_on_a_busy_port_fails_at_once_naming_it(tmp_path):
    """Before: the URL was printed, then MLflow exited 0 about 50 s later."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        started = time.monotonic()
        done = subprocess.run(
            [PREFSHIFT, "ui", "--port", str(port), "--root", str(tmp_path)],
            cwd=tmp_path,
            env=ENV,
            capture_output=True,
            text=True,
            timeout=BOUND_S,
        )
    assert done.returncode == 2, done.stderr
    assert f"port {port} on 127.0.0.1 is not available (another process listens there)" in done.stderr
    assert "pass another --port" in done.stderr
    assert "MLflow UI on" not in done.stderr  # no URL of someone else's service
    assert time.monotonic() - started < 60  # no server was started (mlflow's own start takes longer)


def test_ui_on_an_address_of_no_local_interface_fails_at_once_naming_it(tmp_path):
    done = subprocess.run(
        [PREFSHIFT, "ui", "--host", "192.0.2.1", "--port", "5000", "--root", str(tmp_path)],  # TEST-NET-1
        cwd=tmp_path,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=BOUND_S,
    )
    assert done.returncode == 2, done.stderr
    assert "port 5000 on 192.0.2.1 is not available (Cannot assign requested address)" in done.stderr


HOLD_DIRECTORY = """
import sys, time
from pathlib import Path
from prefshift.core import locks
with locks.hold(Path(sys.argv[1]), [Path(sys.argv[2])], "another writer"):
    print("holding", flush=True)
    time.sleep(600)
"""


@pytest.mark.parametrize(
    ("stage", "output"),
    [
        (["split"], lambda layout: layout.source_splits_dir),
        (["split", "--dataset", "syn_help_chat"], lambda layout: layout.target_split_dir("syn_help_chat")),
        (["plan"], lambda layout: layout.plan_dir),
        (["reference"], lambda layout: layout.reference_dir),
        (["targets", "--method", "naive"], lambda layout: layout.targets_dir("naive")),
    ],
    ids=["split", "split a target", "plan", "reference", "targets"],
)
def test_stages_that_replace_a_directory_whole_take_its_lock(project, stage, output):
    """The stages outside output sets (one directory, one rename) are refused while another process
    writes their directory, and leave it as it was; before, both writers ran and the last rename won."""
    directory = output(project)
    before = sorted(p.relative_to(directory) for p in directory.rglob("*"))
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_DIRECTORY, str(project.root), str(directory)],
        env=ENV,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "holding"
        code, err = _finish(_prefshift(project, *stage))
        assert code == 2, err
        assert f"{directory} is being written by process {holder.pid}" in err and "Traceback" not in err
    finally:
        holder.kill()
        holder.wait()
    assert sorted(p.relative_to(directory) for p in directory.rglob("*")) == before
