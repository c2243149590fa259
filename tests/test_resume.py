"""`prefshift train` killed with SIGKILL resumes from its checkpoint to the same result (issue 8, item 1).

The student is trained twice from the same project state: once without interruption,
once killed after a checkpoint exists and started again with the same command. The
saved weights must be bitwise equal and the training logs (loss per logged step,
drift) identical. Checkpoints every 3 steps and logs every 4 steps, so the kill
lands inside a logging window and the resumed run must restore it too.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file

from prefshift.core.atomic import recover_interrupted_swap
from prefshift.core.paths import Layout
from prefshift.engine.train import STATE_FILE
from tiny_project import copy_project, pipeline_root, tiny_params, write_params

METHOD = "anchor_last"
STUDENT = {"epochs": 2, "batch_size": 4, "checkpoint_every": 3, "log_every": 4, "drift_every": 5}


def _project(source: Path, root: Path) -> Layout:
    layout = copy_project(source, root)
    for path in (layout.student_dir("naive"), layout.checkpoint_dir("naive")):
        shutil.rmtree(path, ignore_errors=True)
    write_params(root, tiny_params(student=STUDENT))
    return layout


def _train_cmd(root: Path) -> list[str]:
    return [str(Path(sys.executable).parent / "prefshift"), "train", "--method", METHOD, "--root", str(root),
            "--params", str(root / "params.yaml")]  # fmt: skip


def _env() -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}


def _kill_after_checkpoint(root: Path, min_step: int, timeout: float = 240.0) -> int:
    """Start training, SIGKILL it once a checkpoint at step >= min_step exists; return the last one's step."""
    state = Layout(root, seed=0).checkpoint_dir(METHOD) / "last" / STATE_FILE
    proc = subprocess.Popen(_train_cmd(root), env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + timeout
    try:
        while time.time() < deadline and proc.poll() is None:
            try:
                step = json.loads(state.read_text())["step"]
            except (FileNotFoundError, json.JSONDecodeError):
                step = -1
            if step >= min_step:
                proc.send_signal(signal.SIGKILL)
                break
            time.sleep(0.02)
    finally:
        proc.kill()
        stderr = proc.communicate()[1].decode()
    assert proc.returncode == -signal.SIGKILL, f"training ended before it could be killed:\n{stderr[-3000:]}"
    recover_interrupted_swap(state.parent)  # as the resumed run will: the kill may land between two renames
    return json.loads(state.read_text())["step"]  # a later checkpoint may have landed before the signal


def _run_to_end(root: Path) -> str:
    done = subprocess.run(_train_cmd(root), env=_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stderr


@pytest.mark.slow
def test_sigkilled_training_resumes_to_identical_weights_and_log(tmp_path_factory, tmp_path):
    source = pipeline_root(tmp_path_factory)
    whole, killed = _project(source, tmp_path / "whole"), _project(source, tmp_path / "killed")
    _run_to_end(whole.root)

    step = _kill_after_checkpoint(killed.root, min_step=6)
    total = 2 * 20  # 80 student pairs / 4 per batch, 2 epochs
    assert 6 <= step < total
    assert not killed.student_dir(METHOD).exists() and not killed.train_log(METHOD).exists()
    resumed_stderr = _run_to_end(killed.root)
    assert f"resuming from step {step} of" in resumed_stderr

    a = load_file(whole.student_dir(METHOD) / "model.safetensors")
    b = load_file(killed.student_dir(METHOD) / "model.safetensors")
    assert a.keys() == b.keys()
    different = [k for k in a if not (a[k].dtype == b[k].dtype and a[k].equal(b[k]))]
    assert not different, f"tensors differ after resume: {different}"
    log_a = json.loads(whole.train_log(METHOD).read_text())
    log_b = json.loads(killed.train_log(METHOD).read_text())
    assert log_a["steps"][-1]["step"] == total
    for key in ("steps", "drift", "drift_mse", "total_steps", "pairs", "reference"):
        assert log_a[key] == log_b[key], f"train log {key!r} differs after resume"
    assert not killed.checkpoint_dir(METHOD).exists()  # removed once the model is saved
