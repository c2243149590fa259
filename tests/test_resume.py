"""`prefshift train` killed with SIGKILL resumes from its checkpoint to the same result (issue 8, item 1).

The student is trained twice from the same project state: once without interruption,
once killed after a checkpoint exists and started again with the same command. The
saved weights must be bitwise equal and the training logs (loss per logged step,
drift) identical. Checkpoints every 3 steps and logs every 4 steps, so the kill
lands inside a logging window and the resumed run must restore it too.

LP-FT trains in two phases, each with a checkpoint of its own (issue 33): killed inside the
head-only phase, or after it finished and the full fine-tuning began, the resumed run must
neither repeat a finished phase nor lose a step of an unfinished one.
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

STUDENT = {"epochs": 2, "batch_size": 4, "checkpoint_every": 3, "log_every": 4, "drift_every": 5}
TOTAL = 2 * 20  # 80 student pairs / 4 per batch, 2 epochs
PROBE_TOTAL = 20  # lp_ft's head-only phase: one epoch


def _project(source: Path, root: Path, method: str) -> Layout:
    from prefshift.pipeline.stages import plan, targets

    layout = copy_project(source, root)
    for path in (layout.student_dir("naive"), layout.checkpoint_dir("naive")):
        shutil.rmtree(path, ignore_errors=True)
    params = tiny_params(student=STUDENT, methods=["naive", "anchor_last", "lp_ft"])
    write_params(root, params)
    if method == "lp_ft":  # the shared tiny project built targets for its own methods only
        plan.run(params, layout)
        targets.run(params, layout, method)
    return layout


def _train_cmd(root: Path, method: str) -> list[str]:
    return [str(Path(sys.executable).parent / "prefshift"), "train", "--method", method, "--root", str(root),
            "--params", str(root / "params.yaml")]  # fmt: skip


def _env() -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}


def _kill_after_checkpoint(root: Path, method: str, run: str, min_step: int, timeout: float = 240.0) -> int:
    """Start training `method`, SIGKILL it once its run `run` (the method, or `<method>-<phase>`)
    has a checkpoint at step >= min_step; return that run's last checkpointed step."""
    state = Layout(root, seed=0).checkpoint_dir(run) / "last" / STATE_FILE
    proc = subprocess.Popen(
        _train_cmd(root, method), env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
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


def _run_to_end(root: Path, method: str) -> str:
    done = subprocess.run(_train_cmd(root, method), env=_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stderr


KILLS = [
    pytest.param("anchor_last", [("anchor_last", 6, TOTAL)], id="anchor_last"),
    # Killed inside the head-only phase, then, resumed, killed again inside the fine-tuning phase
    # (the probe's checkpoint must then read as finished, not be trained again).
    pytest.param("lp_ft", [("lp_ft-probe", 3, PROBE_TOTAL), ("lp_ft", 3, TOTAL)], id="lp_ft-in-each-phase"),
]


REPRODUCIBLE = ("steps", "drift", "drift_mse", "total_steps", "pairs", "reference")
"""A run's log keys that a resume must restore exactly; the others are timings, memory and what
this process computed (`pair_forward`'s forward and token counts)."""


@pytest.mark.slow
@pytest.mark.parametrize(("method", "kills"), KILLS)
def test_sigkilled_training_resumes_to_identical_weights_and_log(tmp_path_factory, tmp_path, method, kills):
    source = pipeline_root(tmp_path_factory)
    whole = _project(source, tmp_path / "whole", method)
    killed = _project(source, tmp_path / "killed", method)
    _run_to_end(whole.root, method)

    for run, min_step, run_total in kills:
        step = _kill_after_checkpoint(killed.root, method, run, min_step)
        assert min_step <= step < run_total
        assert not killed.student_dir(method).exists() and not killed.train_log(method).exists()
    resumed_stderr = _run_to_end(killed.root, method)
    assert f"resuming from step {step} of" in resumed_stderr

    a = load_file(whole.student_dir(method) / "model.safetensors")
    b = load_file(killed.student_dir(method) / "model.safetensors")
    assert a.keys() == b.keys()
    different = [k for k in a if not (a[k].dtype == b[k].dtype and a[k].equal(b[k]))]
    assert not different, f"tensors differ after resume: {different}"
    log_a = json.loads(whole.train_log(method).read_text())
    log_b = json.loads(killed.train_log(method).read_text())
    assert log_a["steps"][-1]["step"] == TOTAL
    phases_a, phases_b = log_a.get("phases", {}), log_b.get("phases", {})
    assert phases_a.keys() == phases_b.keys()
    for name, a_log, b_log in (("the run", log_a, log_b), *((p, phases_a[p], phases_b[p]) for p in phases_a)):
        differ = [key for key in REPRODUCIBLE if a_log.get(key) != b_log.get(key)]
        assert not differ, f"{name}'s log differs after resume in {differ}"
    if method == "lp_ft":
        assert log_a["phases"]["probe"]["steps"][-1]["step"] == PROBE_TOTAL
    seed_dir = killed.checkpoint_dir(method).name  # no checkpoint of the run or its phases is left
    assert not list((killed.root / "models" / "checkpoints").glob(f"{method}*/{seed_dir}"))
