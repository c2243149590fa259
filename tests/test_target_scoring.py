"""A target is scored, not trained for (issue 47), under real DVC on the reproduced end-to-end project.

The protocol is zero-shot: no model sees a target, so a model's only tie to one is being scored on
it. On the shrunken embedded default after one full `dvc repro` (tests/e2e_project.py), a third
target is added (the RewardBench fixture in its published parquet format, read from a local path)
and `dvc repro` runs: that target is prepared and split alone, every model and the best-of-n judge
are scored on it, its own best-of-n prompts are sampled, judged and ranked, and what reads scores
runs again; no teacher, label, targets, train or judge stage runs, no probe, no best-of-n stage of
another split, and no model file changes. Dropping it again runs only what reads scores (a stage
whose inputs are back to those of the first repro may be restored from DVC's run cache instead of
run; either counts).

And a trained model is restored from DVC's run cache where no dvc.lock entry records it (another
clone sharing the cache, a sweep point run before): DVC saves no run-cache entry for a stage with
a `cache: false` output that is not a metric or plot, so every output of the training stages is
cached.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import yaml

from e2e_project import SEEDS, STUDENTS, copy_reproduced, per_method, ran_stages, run

NEW = "rewardbench_chat"
TRAINING = ("backbone", "plan", "reference", "seam_principles", "teacher@", "label@", "targets@", "train@")
"""Stages that build or train a model, or what a model trains on: none may run for a target."""
READ_SCORES = {
    "report",
    "promote",
    *per_method(("evaluate",), STUDENTS),
    *(f"evaluate_teacher@{k}" for k in SEEDS),
}
NOT_FOR_A_TARGET = {"probe", "judge", "policy_samples", "gold_judge", "downstream"}
"""They read no target (the probe reads the source's splits; the judge trains on the source; the
best-of-n stages without a target are id_test's), so a target added or dropped is none of theirs."""


def per_target(target: str) -> set[str]:
    """What a target brings of its own past prepare, split and scoring: the judge's accuracy on it,
    and its best-of-n prompts, their gold scores and every proxy's picks."""
    stages = ("judge_target", "policy_samples_target", "gold_judge_target", "downstream_target")
    return {f"{stage}@{target}" for stage in stages}


def _models(root: Path) -> dict[str, str]:
    """sha256 of every file of the pretrained bases, the teachers, the students and the best-of-n
    judge, byte for byte."""
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for kind in ("base", "teacher", "students", "judge")
        for p in sorted((root / "models" / kind).rglob("*"))
        if p.is_file()
    }


def _restored(output: str) -> set[str]:
    """Stages DVC restored from its run cache instead of running: their deps and params are back
    to a state it has run before (a dropped target's, say), so it checks out the outputs it kept."""
    return {line.split("'")[1] for line in output.splitlines() if "is cached - skipping run" in line}


def _set_targets(root: Path, targets: list[str], sources: dict) -> None:
    path = root / "params.yaml"
    params = yaml.safe_load(path.read_text())
    params["data"].update(targets=targets, sources=sources)
    path.write_text(yaml.safe_dump(params, sort_keys=False))


@pytest.mark.slow
def test_a_new_target_is_scored_and_a_dropped_one_unscored_and_no_model_is_retrained(
    tmp_path_factory, fixtures_dir
):
    root, env = copy_reproduced(tmp_path_factory, "target-added")
    before = _models(root)
    old = yaml.safe_load((root / "params.yaml").read_text())["data"]
    fixture = fixtures_dir / "benchmarks" / "rewardbench" / "filtered-00000-of-00001.parquet"
    _set_targets(root, [*old["targets"], NEW], {**old["sources"], NEW: {"path": str(fixture)}})

    added = ran_stages(run(["dvc", "repro"], root, env))
    scoring = {f"score_teacher@{NEW}", *{f"score_target@{m}-{NEW}" for m in STUDENTS}}
    expected = {"inputs", f"prepare_target@{NEW}", f"split_target@{NEW}", *scoring, *READ_SCORES}
    expected |= per_target(NEW)
    assert added == expected, sorted(added ^ expected)
    assert not [stage for stage in added if stage.startswith(TRAINING)]
    assert not added & NOT_FOR_A_TARGET
    assert _models(root) == before  # no model file was rewritten, the judge's included
    summary = (root / "reports" / "summary.md").read_text(encoding="utf-8")
    assert f"| {NEW} | OOD |" in summary  # the judge's accuracy on it, from judge_target@NEW
    assert f"| teacher | {NEW} |" in summary  # its best-of-n row, from downstream_target@NEW
    for method in ("naive", "ceiling"):
        for seed in SEEDS:
            metrics = json.loads((root / "reports" / "metrics" / method / f"seed-{seed}.json").read_text())
            assert NEW in metrics["targets"] and metrics["benchmarks"]["targets"][NEW]["n"] > 0
    promotion = json.loads((root / "reports" / "promotion.json").read_text())
    assert promotion  # promote decided again on metrics that hold the new target

    _set_targets(root, old["targets"], old["sources"])
    output = run(["dvc", "repro"], root, env)
    dropped, restored = ran_stages(output), _restored(output)
    assert dropped | restored == {"inputs", *READ_SCORES}, sorted(dropped | restored)
    assert not [stage for stage in dropped | restored if stage.startswith(TRAINING)]
    assert _models(root) == before
    summary = (root / "reports" / "summary.md").read_text(encoding="utf-8")
    assert f"| {NEW} |" not in summary  # a dropped target's lingering files are never read
    metrics = json.loads((root / "reports" / "metrics" / "naive" / f"seed-{SEEDS[0]}.json").read_text())
    assert set(metrics["targets"]) == set(old["targets"])
    # The registry re-decided on the same versions (no model changed) and says what moved.
    again = {
        p["method"]: p for p in json.loads((root / "reports" / "promotion.json").read_text())["promoted"]
    }
    first = {p["method"]: p for p in promotion["promoted"]}
    assert again and {m: p["version"] for m, p in again.items()} == {
        m: p["version"] for m, p in first.items()
    }
    for method, promoted in again.items():
        assert promoted["changes"][f"aog.{NEW}"][1] is None, method  # the dropped target's numbers went
        assert "mean_aog" in promoted["changes"], method


def _lock_without(root: Path, stages: list[str]) -> None:
    """dvc.lock as a clone that never ran `stages` holds it: no entry records their outputs."""
    path = root / "dvc.lock"
    lock = yaml.safe_load(path.read_text())
    for stage in stages:
        del lock["stages"][stage]
    path.write_text(yaml.safe_dump(lock, sort_keys=False))


@pytest.mark.slow
def test_a_trained_model_is_restored_from_the_run_cache(tmp_path_factory):
    """With its dvc.lock entry and its outputs gone (a clone sharing the cache, a sweep point run
    before), a training stage whose deps and params DVC has seen is checked out from the run cache,
    not trained again: every output of train@M, teacher@k and judge is cached (DVC writes no
    run-cache entry for a stage with a `cache: false` out that is not a metric or plot)."""
    root, env = copy_reproduced(tmp_path_factory, "run-cache")
    before = _models(root)
    stages = ["train@naive", f"teacher@{SEEDS[0]}", "judge"]
    outputs = [
        "models/students/naive",
        "data/scores/naive",
        "reports/train/naive",
        f"models/teacher/seed-{SEEDS[0]}",
        f"data/scores/teacher/seed-{SEEDS[0]}",
        f"reports/train/teacher/seed-{SEEDS[0]}.json",
        "models/judge",
        "reports/judge.json",
    ]
    logs = {path: (root / path).read_bytes() for path in outputs if (root / path).is_file()}
    _lock_without(root, stages)
    for path in outputs:
        target = root / path
        shutil.rmtree(target) if target.is_dir() else target.unlink()

    output = run(["dvc", "repro", "--single-item", *stages], root, env)
    assert not ran_stages(output), output[-2000:]
    assert _restored(output) == set(stages), output[-2000:]
    assert _models(root) == before
    assert {path: (root / path).read_bytes() for path in logs} == logs  # the logs came back too
    assert run(["dvc", "status", *stages], root, env).strip().endswith("Data and pipelines are up to date.")
