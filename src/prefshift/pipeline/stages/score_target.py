"""`prefshift score-target --model M --target T`: one model's margins on one target, per seed.

Training never reads a target: the protocol is zero-shot, so a model's only tie to a target is
being scored on it. That scoring is its own stage, keyed by model (`teacher` or a method) and
target (DVC's `score_target@<M>-<T>`, `score_teacher@<T>`), reading the saved model directory and
the target's split alone. Adding a target runs these stages for it and retrains nothing; dropping
one runs none. The files (data/target_scores/<M>/<T>/seed-<k>/) carry the target's split version,
and evaluate checks that split alone. A method with an `on_target` hook records what it reads on
the target there too (`on_target.json`; WiSE-FT: its α grid's accuracy on the target, the α
curve's OOD row, which training could not record without reading a target).
"""

from __future__ import annotations

from pathlib import Path

from prefshift.config.params import ConfigError, Params, check_method
from prefshift.core.atomic import write_json
from prefshift.core.errors import PrefshiftError
from prefshift.core.paths import Layout
from prefshift.pipeline.heldout_scores import score_target
from prefshift.pipeline.output_set import OutputSet, output_set

TEACHER = "teacher"
ON_TARGET_FILE = "on_target.json"
"""A method's own record on the target (its `on_target` hook), beside the scores."""


def on_target_path(layout: Layout, model: str, target: str) -> Path:
    return layout.target_scores_dir(model, target) / ON_TARGET_FILE


def _on_target(
    params: Params, layout: Layout, method: str, target: str, directory: Path, out: OutputSet
) -> None:
    """Run the method's `on_target` hook on its saved model, with the target as its one held-out
    split, and stage what it returns; nothing for a method without one."""
    from prefshift.engine.scoring import load_for_scoring
    from prefshift.methods import registry
    from prefshift.pipeline.method_tools import StageTools

    spec = registry.get(method)
    if spec.on_target is None:
        return
    model, tokenizer = load_for_scoring(directory, params)
    tools = StageTools(params, layout, method, tokenizer, (), heldout=(target,), model_dir=directory)
    built = registry.build(method, params, model.num_layers, layout.base_model("strong"), tools)
    record = registry.call_hook(spec, "on_target hook", spec.on_target, model, built)
    hook = f"{spec.on_target.__module__}.{spec.on_target.__qualname__}"
    write_json(out.path(on_target_path(layout, method, target)), {"hook": hook, **record})


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
        if model != TEACHER:
            _on_target(params, layout, model, target, directory, out)
    return {"skips": scored["skips"], "truncation": scored["truncation"]}
