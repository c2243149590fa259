"""A target is scored, not trained for (issue 47), under real DVC on the reproduced end-to-end project.

The protocol is zero-shot: no model sees a target, so a model's only tie to one is being scored on
it. On the shrunken embedded default after one full `dvc repro` (tests/e2e_project.py), a third
target is added (the RewardBench fixture in its published parquet format, read from a local path)
and `dvc repro` runs: that target is prepared and split alone, every model is scored on it, and
what reads scores runs again; no teacher, label, targets or train stage runs, and no model file
changes. Dropping it again runs only what reads scores (a stage whose inputs are back to those of
the first repro may be restored from DVC's run cache instead of run; either counts). The
diagnostics that read every target (the probe, the best-of-n samples, the judge's accuracy table,
best-of-n) run too: each covers every target, so a new one is new work for them.
"""

from __future__ import annotations

import hashlib
import json
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
DIAGNOSTICS = {"probe", "policy_samples", "judge", "gold_judge", "downstream"}
"""They read every target (probes per split, best-of-n prompts per split, the judge's accuracy on
every test split), so a target added or dropped is theirs to run again."""


def _models(root: Path) -> dict[str, str]:
    """sha256 of every file of the pretrained bases, the teachers and the students, byte for byte
    (the best-of-n judge is retrained by its stage, which also reports its accuracy on every target)."""
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for kind in ("base", "teacher", "students")
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
    assert added == expected | DIAGNOSTICS, sorted(added ^ (expected | DIAGNOSTICS))
    assert not [stage for stage in added if stage.startswith(TRAINING)]
    assert _models(root) == before  # no model file was rewritten
    for method in ("naive", "ceiling"):
        for seed in SEEDS:
            metrics = json.loads((root / "reports" / "metrics" / method / f"seed-{seed}.json").read_text())
            assert NEW in metrics["targets"] and metrics["benchmarks"]["targets"][NEW]["n"] > 0
    promotion = json.loads((root / "reports" / "promotion.json").read_text())
    assert promotion  # promote decided again on metrics that hold the new target

    _set_targets(root, old["targets"], old["sources"])
    output = run(["dvc", "repro"], root, env)
    dropped, restored = ran_stages(output), _restored(output)
    # gold_judge's inputs are those of the first repro again (the judge retrains to the same bytes):
    # DVC restores it from the run cache. The stages with uncached outputs (cache: false) always run.
    assert dropped | restored == {"inputs", *READ_SCORES} | DIAGNOSTICS, sorted(dropped | restored)
    assert not [stage for stage in dropped | restored if stage.startswith(TRAINING)]
    assert _models(root) == before
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
