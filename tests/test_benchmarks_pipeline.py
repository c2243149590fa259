"""A RewardBench section as an OOD target of the tiny pipeline: official score and AOG/NTS, end to end.

The finished tiny project is copied and `rewardbench_chat` (the RewardBench fixture, read from a
local path) is added as a third target: it is prepared and split alone, and the trained teacher
and student are scored on it (`score-target`), as `dvc repro` would do; no model is retrained.
The official Chat score in reports/metrics/naive/seed-0.json is then recomputed here from the score
files the stages wrote, with the benchmark's published example counts.
"""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest
from mlflow import MlflowClient

from prefshift.data.schema import read_pairs
from tiny_project import copy_project, pipeline_root, tiny_params, write_params

CHAT_COUNTS = {"alpacaeval-easy": 100, "alpacaeval-length": 95, "alpacaeval-hard": 95, "mt-bench-easy": 28,
               "mt-bench-med": 40}  # fmt: skip


def official_chat(scores_path, pairs):
    """RewardBench's Chat section from a score file: strict wins per subset, count-weighted."""
    subset_of = {p.pair_id: p.meta["subset"] for p in pairs}
    wins: dict[str, list[float]] = {}
    for row in pq.read_table(scores_path).to_pylist():
        wins.setdefault(subset_of[row["pair_id"]], []).append(1.0 if row["delta"] > 0 else 0.0)
    total = sum(CHAT_COUNTS[s] for s in wins)
    return sum(100 * sum(w) / len(w) * CHAT_COUNTS[s] for s, w in wins.items()) / total


@pytest.mark.slow
def test_rewardbench_chat_target_reports_its_official_score_and_gains(
    tmp_path_factory, fixtures_dir, monkeypatch
):
    from prefshift.pipeline.stages import evaluate, evaluate_teacher, prepare, report, score_target, split
    from prefshift.tracking import runs as tracking

    layout = copy_project(pipeline_root(tmp_path_factory), tmp_path_factory.mktemp("bench-project"))
    weights = layout.student_dir("naive") / "model.safetensors"
    trained = weights.read_bytes()
    fixture = fixtures_dir / "benchmarks" / "rewardbench" / "filtered-00000-of-00001.parquet"
    params = tiny_params(
        data={
            "targets": ["syn_help_instruct", "syn_help_chat", "rewardbench_chat"],
            "sources": {"rewardbench_chat": {"path": str(fixture)}},
        },
        methods=["naive"],
    )
    write_params(layout.root, params)
    pipeline_id = f"pr-rewardbench-{layout.root.name}"  # this test's runs, whatever else the database holds
    monkeypatch.setenv(tracking.PIPELINE_ENV, pipeline_id)
    prepare.run(params, layout, "rewardbench_chat")
    split.run(params, layout, "rewardbench_chat")
    for model in ("teacher", "naive"):
        score_target.run(params, layout, model, "rewardbench_chat")
    evaluate_teacher.run(params, layout)
    evaluate.run(params, layout, "naive")  # the models were trained before the target existed
    summary = report.run(params, layout)
    assert weights.read_bytes() == trained

    metrics = json.loads(layout.metrics("naive").read_text(encoding="utf-8"))
    pairs = read_pairs(layout.split("rewardbench_chat"))
    assert len(pairs) == 3  # the fixture's three valid Chat rows
    cell, teacher = metrics["benchmarks"]["targets"]["rewardbench_chat"], metrics["teacher"]["benchmarks"]
    assert (cell["benchmark"], cell["section"], cell["n"]) == ("rewardbench", "Chat", 3)
    student_score = official_chat(layout.scores("naive", "rewardbench_chat"), pairs)
    teacher_score = official_chat(layout.scores("teacher", "rewardbench_chat"), pairs)
    assert cell["score"] == pytest.approx(student_score, abs=1e-4)
    assert teacher["targets"]["rewardbench_chat"]["score"] == pytest.approx(teacher_score, abs=1e-4)
    regression = max(0.0, metrics["teacher"]["id"]["acc"] - metrics["id"]["acc"])
    assert cell["aog"] == pytest.approx(student_score - teacher_score, abs=1e-3)
    assert cell["nts"] == pytest.approx(student_score - teacher_score - regression, abs=1e-3)
    # The plain pairwise accuracy is still there, next to the official score.
    assert "acc" in metrics["targets"]["rewardbench_chat"]

    headline = summary["naive"]["benchmarks"]["targets"]["rewardbench_chat"]
    assert headline == {"score": cell["score"], "aog": cell["aog"], "nts": cell["nts"]}
    text = layout.summary.read_text(encoding="utf-8")
    assert "## Benchmark targets (official scoring)" in text and "rewardbench_chat official" in text

    uri = tracking.tracking_uri(layout)  # where the stages logged (the process-wide default may differ)
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name(params.tracking.experiment)
    mine = f"tags.stage = 'evaluate' and tags.method = 'naive' and tags.`{tracking.PIPELINE_TAG}` = "
    mine += f"'{pipeline_id}'"
    runs = client.search_runs([experiment.experiment_id], mine)
    assert len(runs) == 1, f"{len(runs)} evaluate@naive runs of pipeline {pipeline_id} in {uri}"
    logged = runs[0]
    assert logged.data.metrics["benchmarks.targets.rewardbench_chat.score"] == pytest.approx(
        cell["score"], abs=1e-3
    )
