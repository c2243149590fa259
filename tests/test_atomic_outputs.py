"""Stages killed with SIGKILL never leave an output that looks complete but is not (issue 8, item 2).

Each stage runs as a real `prefshift` process on a copy of the tiny pipeline, with its
outputs removed first (as `dvc repro` removes a stage's outs before running it), and
is killed either as soon as one of its temporary paths appears (mid-write) or after a
random delay. Afterwards every output path is either absent or complete: parquet
files read back with the manifest's count and hash, a model directory loads, JSON
parses. Temporaries left behind are hidden `.<name>.*.tmp` siblings that no reader
opens, and a rerun of the stage completes over them.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from prefshift.core.paths import Layout
from prefshift.data.schema import read_pairs
from prefshift.data.splits import file_sha256
from prefshift.models.reward import load_reward_model
from prefshift.pipeline.output_set import manifest_of, verify
from tiny_project import copy_project, pipeline_root

PREFSHIFT = str(Path(sys.executable).parent / "prefshift")


def _kill(
    layout: Layout,
    args: list[str],
    due: Callable[[float], bool],
    timeout: float = 120,
    sig: signal.Signals = signal.SIGKILL,
) -> int:
    """Run `prefshift ARGS`, send `sig` once `due(seconds since start)` holds; return its exit status.

    -SIGKILL: killed; anything else: it ended first (a fast stage may beat the trigger) or,
    for SIGINT, it handled the interrupt (exit status 1, "Aborted!").
    """
    cmd = [PREFSHIFT, *args, "--root", str(layout.root), "--params", str(layout.root / "params.yaml")]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    sink = subprocess.DEVNULL
    proc = subprocess.Popen(cmd, env=env, stdout=sink, stderr=sink, preexec_fn=_ctrl_c_as_at_a_terminal)
    start = time.time()
    try:
        while proc.poll() is None and time.time() - start < timeout:
            if due(time.time() - start):
                proc.send_signal(sig)
                proc.wait(timeout=timeout)  # SIGINT: let it clean up
                break
            time.sleep(0.005)
    finally:
        proc.kill()
        proc.wait()
    return proc.returncode


def _ctrl_c_as_at_a_terminal() -> None:
    """Give the stage the SIGINT disposition a terminal gives it, whatever this test inherited.

    A shell starts a background job (`make test &`, a CI runner's script) with SIGINT
    ignored, and Python then installs no KeyboardInterrupt handler: the stage ran on
    through every "Ctrl-C" and the backbone test failed with "no attempt was interrupted",
    in exactly the CI-like runs that were launched in the background.
    """
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _mid_write(under: Path) -> Callable[[float], bool]:
    """True once a temporary that was not there at the start holds a file: the kill lands mid-write."""
    stale = set(_temporaries(under))
    return lambda _: any(_holds_a_file(t) for t in set(_temporaries(under)) - stale)


def _temporaries(under: Path) -> list[Path]:
    """Hidden `.<name>.*.tmp` paths under `under`, found while the stage renames and deletes beside us.

    os.walk skips a directory that vanishes between listing and entering it (the trainer
    removing a checkpoint, a swap renaming a temporary), where Path.rglob raised
    FileNotFoundError inside the test: the race that made this suite flaky under load.
    """
    found = []
    for directory, subdirs, files in os.walk(under):
        found += [Path(directory) / n for n in subdirs + files if n.startswith(".") and n.endswith(".tmp")]
    return found


def _holds_a_file(temporary: Path) -> bool:
    return any(files for _, _, files in os.walk(temporary))  # empty once renamed into place or removed


def _assert_only_hidden_temporaries(root: Path) -> None:
    for path in root.rglob("*"):
        if ".tmp" in path.name and not any(
            part.startswith(".") and part.endswith(".tmp") for part in path.parts
        ):
            raise AssertionError(f"temporary output outside a hidden .tmp path: {path}")


def _split_sets(layout: Layout) -> list[Path]:
    """The directories split swaps in whole, each with its own manifest: the source's, each target's."""
    ood = layout.splits_dir / "ood"
    targets = sorted(p for p in ood.iterdir() if p.is_dir()) if ood.exists() else []
    return [d for d in [layout.source_splits_dir, *targets] if d.exists()]


def _manifests(layout: Layout) -> dict[Path, bytes]:
    return {d: (d / "manifest.json").read_bytes() for d in _split_sets(layout)}


def _assert_splits_complete_or_absent(layout: Layout) -> None:
    """Every split directory on disk is whole: exactly the files its manifest lists, as it lists them."""
    for directory in _split_sets(layout):
        manifest = json.loads((directory / "manifest.json").read_text())  # written last, inside the swap
        for name, entry in manifest["splits"].items():
            path = layout.root / entry["path"]
            assert file_sha256(path) == entry["sha256"], name
            if not name.startswith("groups/"):
                assert len(read_pairs(path)) == entry["count"], name
        listed = {layout.root / e["path"] for e in manifest["splits"].values()}
        assert {p for p in directory.rglob("*") if p.is_file()} == listed | {directory / "manifest.json"}


def _assert_model_complete_or_absent(directory: Path, log: Path) -> None:
    if directory.exists():
        model, _ = load_reward_model(directory)
        assert model.num_layers == 1
    if log.exists():
        assert json.loads(log.read_text())["steps"]


@pytest.fixture
def project(tmp_path_factory, tmp_path) -> Layout:
    return copy_project(pipeline_root(tmp_path_factory), tmp_path / "project")


@pytest.mark.slow
def test_killed_split_leaves_old_or_new_splits_never_a_mix(project):
    layout, rng = project, random.Random(0)
    before = _manifests(layout)
    delay = rng.uniform(1.0, 6.0)
    for due in (_mid_write(layout.root / "data"), lambda elapsed: elapsed >= delay):
        _kill(layout, ["split"], due)  # a fast split may finish first: its outputs are checked all the same
        _assert_splits_complete_or_absent(layout)
        _assert_only_hidden_temporaries(layout.root)
        for directory, manifest in _manifests(layout).items():
            assert manifest == before[directory]  # same params: same splits, byte for byte
    shutil.rmtree(layout.splits_dir, ignore_errors=True)
    _kill(layout, ["split"], _mid_write(layout.root / "data"))
    _assert_splits_complete_or_absent(layout)


@pytest.mark.slow
def test_killed_teacher_leaves_no_half_written_model(project):
    layout = project
    for _attempt in range(4):  # the write window is short: under load a finished run beats the trigger
        shutil.rmtree(layout.teacher_dir, ignore_errors=True)
        layout.train_log("teacher").unlink(missing_ok=True)
        status = _kill(layout, ["teacher"], _mid_write(layout.root / "models"))
        _assert_model_complete_or_absent(layout.teacher_dir, layout.train_log("teacher"))
        if status == -signal.SIGKILL:
            break
    assert status == -signal.SIGKILL, "no attempt was killed mid-write"
    _assert_only_hidden_temporaries(layout.root)
    last = layout.checkpoint_dir("teacher") / "last"
    assert not last.exists() or {"model.safetensors", "trainer_state.json"} <= {
        p.name for p in last.iterdir()
    }


@pytest.mark.slow
def test_killed_train_leaves_the_previous_model_scores_and_log_together(project):
    layout = project
    params = yaml.safe_load((layout.root / "params.yaml").read_text())
    params["student"]["lr"] /= 2  # new weights, so a new model beside the old scores would show
    (layout.root / "params.yaml").write_text(yaml.safe_dump(params))
    before = {p: p.read_bytes() for p in sorted(layout.student_dir("naive").rglob("*")) if p.is_file()}
    # killed once its first staged score file exists: the new model is staged by then, and
    # neither it nor the scores nor the training log may replace the previous ones
    assert _kill(layout, ["train", "-m", "naive"], _mid_write(layout.root / "data")) == -signal.SIGKILL
    _assert_only_hidden_temporaries(layout.root)
    after = {p: p.read_bytes() for p in sorted(layout.student_dir("naive").rglob("*")) if p.is_file()}
    assert after == before
    manifest = verify(layout.root, manifest_of(layout.scores_dir("naive")), [layout.scores_dir("naive")], "x")
    assert manifest["files"]["reports/train/naive/seed-0.json"] == file_sha256(layout.train_log("naive"))
    weights = layout.student_dir("naive") / "model.safetensors"
    assert manifest["files"][weights.relative_to(layout.root).as_posix()] == file_sha256(weights)
    assert not manifest_of(layout.student_dir("naive")).exists()  # a model directory holds the model alone


@pytest.mark.slow
def test_interrupted_backbone_never_leaves_a_new_weak_beside_an_old_strong(project):
    layout = project
    params = yaml.safe_load((layout.root / "params.yaml").read_text())
    for attempt in range(4):  # strong pretrains in about a second; under load it may finish first
        params["seed"] = attempt + 1  # new weights for both models, so an old/new mix would show
        (layout.root / "params.yaml").write_text(yaml.safe_dump(params))
        before = {p: p.read_bytes() for p in sorted(layout.base_dir.rglob("*")) if p.is_file()}
        status = _kill(layout, ["backbone"], _mid_write(layout.root / "models"), sig=signal.SIGINT)  # Ctrl-C
        for which in ("weak", "strong"):
            verify(layout.root, manifest_of(layout.base_dir), [layout.base_model(which)], "backbone")
        if status != 0:
            break
    assert status != 0, "no attempt was interrupted mid-write"
    assert {p: p.read_bytes() for p in sorted(layout.base_dir.rglob("*")) if p.is_file()} == before
    assert not _temporaries(layout.root / "models")  # KeyboardInterrupt removed the staged set
