"""`prefshift score-target --model M --target T`: one model's margins on one target, per seed.

Training never reads a target: the protocol is zero-shot, so a model's only tie to a target is
being scored on it. That scoring is its own stage, keyed by model (`teacher` or a method) and
target (DVC's `score_target@<M>-<T>`, `score_teacher@<T>`), reading the saved model directory and
the target's split alone. Adding a target runs these stages for it and retrains nothing; dropping
one runs none. The files (data/target_scores/<M>/<T>/seed-<k>/) carry the target's split version,
and evaluate checks that split alone.
"""

from __future__ import annotations

from pathlib import Path

from prefshift.config.params import ConfigError, Params, check_method
from prefshift.core.errors import PrefshiftError
from prefshift.core.paths import Layout
from prefshift.pipeline.heldout_scores import score_target
from prefshift.pipeline.output_set import output_set

TEACHER = "teacher"


def model_dir(layout: Layout, model: str) -> Path:
    return layout.teacher_dir if model == TEACHER else layout.student_dir(model)


def run(params: Params, layout: Layout, model: str, target: str) -> dict:
    if model != TEACHER:
        check_method(model)
    if target not in params.data.targets:
        raise ConfigError(f"--target {target}: not one of data.targets ({', '.join(params.data.targets)})")
    directory = model_dir(layout, model)
    if not directory.exists():
        stage = "prefshift teacher" if model == TEACHER else f"prefshift train --method {model}"
        raise PrefshiftError(f"{directory}: no trained model to score; run `{stage}`")
    command = f"prefshift score-target --model {model} --target {target}"
    with output_set(layout.root, command, directories=[layout.target_scores_dir(model, target)]) as out:
        scored = score_target(directory, params, layout, model, target, out)
    return {"skips": scored["skips"], "truncation": scored["truncation"]}
