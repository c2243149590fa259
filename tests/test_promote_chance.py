"""The promotion gate knows chance: a student below 50% on a target is refused unless params allow it."""

from __future__ import annotations

import json
from pathlib import Path

from prefshift.config.params import Params
from prefshift.core.paths import Layout
from prefshift.pipeline.output_set import output_set
from prefshift.pipeline.stages import promote


def _metrics(layout: Layout, targets: dict[str, float]) -> None:
    """The keys the gate reads, as evaluate writes them: a student 20 pp above a teacher at 17.8%
    on one target still sits at 38.5%, below a coin."""
    payload = {
        "method": "naive",
        "id": {"acc": 80.0},
        "teacher": {"id": {"acc": 79.0}},
        "wrg": 1.0,
        "mean_aog": 20.7,
        "mean_nts": 20.7,
        "targets": {t: {"acc": acc, "aog": 20.7, "nts": 20.7} for t, acc in targets.items()},
        "data_hashes": {},
        "split_version": "v1",
    }
    path = layout.metrics("naive")
    with output_set(layout.root, "prefshift evaluate --method naive", files=[path]) as out:
        out.path(path).write_text(json.dumps(payload))


def _gate(tmp_path: Path, targets: dict[str, float], **promote_params) -> dict:
    layout = Layout(tmp_path, seed=0)
    layout.student_dir("naive").mkdir(parents=True)
    _metrics(layout, targets)
    params = Params(methods=["naive"], promote={"min_mean_aog": 0.0, **promote_params})
    return promote.gate(params, layout, "naive")


def test_a_student_below_chance_on_a_target_fails_the_gate_and_says_how_to_allow_it(tmp_path: Path):
    decision = _gate(tmp_path, {"real_target": 38.5, "other": 71.0})
    assert decision["status"] == promote.FAIL and not decision["passed"]
    assert decision["reasons"] == [
        "below chance (50%) on real_target 38.5%; promote.allow_below_chance: true would allow it"
    ]


def test_params_may_allow_a_student_below_chance_and_the_decision_records_it(tmp_path: Path):
    decision = _gate(tmp_path, {"real_target": 38.5}, allow_below_chance=True)
    assert decision["status"] == promote.PASS and decision["below_chance_allowed"] == ["real_target"]


def test_at_chance_is_not_below_it(tmp_path: Path):
    assert _gate(tmp_path, {"real_target": 50.0})["status"] == promote.PASS
