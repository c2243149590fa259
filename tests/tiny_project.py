"""A tiny project root (the embedded default, shrunk) for the reliability tests.

The whole pipeline up to `evaluate --method naive` runs in-process once per session;
tests copy the finished root (or a part of it) so each one starts from real stage
outputs in seconds.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import yaml

from mlflow_support import seed_database
from prefshift.config.params import Params, parse_params
from prefshift.core.paths import Layout

LM = {"num_heads": 2, "pretrain_steps": 3, "pretrain_batch_size": 8, "pretrain_seq_len": 48}
TINY = {
    "seeds": [0],
    "methods": ["naive", "anchor_last"],
    "synthetic": {"train_pairs": 200, "test_pairs": 60, "judge_pairs": 40, "groups": 4, "corpus_docs": 200},
    "data": {"caps": {"teacher_train": 80, "student_train": 80, "id_test": 40, "ood": 40, "groups": 4}},
    "backbone": {
        "vocab_size": 200,
        "weak": {"hidden_size": 32, "num_layers": 1, "intermediate_size": 64, **LM},
        "strong": {"hidden_size": 32, "num_layers": 2, "intermediate_size": 64, **LM},
    },
    "encode": {"max_length": 64},
    "teacher": {"epochs": 1, "batch_size": 16},
    "student": {"epochs": 1, "batch_size": 8, "drift_every": 5},
    "evaluate": {"bootstrap": 20, "batch_size": 64},
}

_BUILT: dict[str, Path] = {}


def tiny_params(**overrides) -> Params:
    raw = yaml.safe_load(yaml.safe_dump(TINY))
    for section, values in overrides.items():
        raw.setdefault(section, {})
        raw[section] = {**raw[section], **values} if isinstance(values, dict) else values
    return parse_params(raw, "tiny params")


def write_params(root: Path, params: Params) -> Path:
    path = root / "params.yaml"
    path.write_text(yaml.safe_dump(params.resolved(), sort_keys=False), encoding="utf-8")
    return path


def run_pipeline(root: Path, params: Params) -> Layout:
    """prepare → split → backbone → teacher → label → the teacher's target scores and metrics →
    plan → reference → targets of every listed method → train, score and evaluate naive, in-process."""
    from prefshift.pipeline.stages import (
        backbone,
        evaluate,
        evaluate_teacher,
        label,
        plan,
        prepare,
        reference,
        split,
        targets,
        teacher,
        train,
    )

    layout = Layout(root, seed=0)
    write_params(root, params)
    prepare.run(params, layout)
    split.run(params, layout)
    backbone.run(params, layout)
    teacher.run(params, layout)
    label.run(params, layout)
    score_on_targets(params, layout, "teacher")
    evaluate_teacher.run(params, layout)
    plan.run(params, layout)
    reference.run(params, layout)
    for method in params.methods:
        targets.run(params, layout, method)
    train.run(params, layout, "naive")
    score_on_targets(params, layout, "naive")
    evaluate.run(params, layout, "naive")
    return layout


def score_on_targets(params: Params, layout: Layout, model: str) -> None:
    """`model` (teacher or a method) scored on every target, as DVC's score stages do after training:
    what evaluate reads besides the training stage's own scores."""
    from prefshift.pipeline.stages import score_target

    for target in params.data.targets:
        score_target.run(params, layout, model, target)


def pipeline_root(tmp_path_factory) -> Path:
    """The finished tiny pipeline, built once per session (treat it as read-only)."""
    if "root" not in _BUILT:
        root = tmp_path_factory.mktemp("tiny-pipeline")
        seed_database(tmp_path_factory, root / "mlflow.db")
        run_pipeline(root, tiny_params())
        _BUILT["root"] = root
    return _BUILT["root"]


def copy_project(source: Path, target: Path) -> Layout:
    shutil.copytree(source, target, dirs_exist_ok=True)
    return Layout(target, seed=0)
