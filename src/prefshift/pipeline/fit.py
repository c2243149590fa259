"""One training run as a pipeline stage runs it: the bookkeeping around the engine's loop.

`prefshift.engine.train.train_reward_model` trains; this module loads the starting model, builds
the method's objective, links the reference stage's states, opens the stage's MLflow run and
publishes the curves as they grow, then saves the model with its held-out scores as one output
set and removes the resumable checkpoint. The teacher and student stages share it.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from prefshift.config.params import AnchorConfig, Params, TrainConfig
from prefshift.core.atomic import write_json
from prefshift.core.host import process_state
from prefshift.core.paths import Layout
from prefshift.data.encode import EncodedPair, Encoder
from prefshift.data.schema import Pair, SkipCounter, read_pairs
from prefshift.data.splits import current_version
from prefshift.engine.drift import READ_PAIRS, mean_cosine, reading_rows
from prefshift.engine.reference_manifest import (
    FINGERPRINT,
    MANIFEST,
    ReferenceMismatchError,
    fingerprint,
    mean_squares,
    read_manifest,
)
from prefshift.engine.reference_store import StoredReference
from prefshift.engine.train import Observer, seed_everything, train_reward_model
from prefshift.methods import registry
from prefshift.methods.base import Objective
from prefshift.models.reward import load_reward_model, save_reward_model
from prefshift.pipeline.heldout_scores import score_heldout
from prefshift.pipeline.method_tools import StageTools, remove_checkpoint, save_kept
from prefshift.pipeline.output_set import output_set
from prefshift.tracking import runs as tracking


def _save(
    model,
    tokenizer,
    log: dict,
    params: Params,
    layout: Layout,
    *,
    name: str,
    method: str,
    out_dir: Path,
    kept: dict[str, dict] | None = None,
):
    """Model, training log and its scores (id_test and the source's groups; the teacher's also
    student_train, its labels), replaced together or not at all. The log records the versions of
    the splits the model was made from (its training split; id_test, its reward normalisation). The
    reward mean/std of id_test go into the saved config. A kill while scoring leaves the previous
    set whole and the checkpoint in place, so the rerun resumes instead of starting over.
    """
    teacher = method == "teacher"
    command = "prefshift teacher" if teacher else f"prefshift train --method {method}"
    # What the model was made from, and nothing else: evaluation checks these versions alone, so
    # the model is scored on a target that did not exist when it was trained.
    trained_on = ("teacher_train" if teacher else "student_train", "id_test")
    log["split_versions"] = {split: current_version(layout, split) for split in trained_on}
    with output_set(
        layout.root,
        command,
        files=[layout.train_log(name)],
        directories=[layout.scores_dir(name)],
        bare=[out_dir],
    ) as out:
        save_reward_model(model, tokenizer, out.path(out_dir))
        save_kept(out.path(out_dir), kept or {})
        also = ("student_train",) if teacher else ()
        heldout = score_heldout(out.path(out_dir), params, layout, name, out, also)
        log["heldout_skips"], log["reward_stats"] = heldout["skips"], heldout["reward_stats"]
        _record_reward_stats(out.path(out_dir), heldout["reward_stats"])
        write_json(out.path(layout.train_log(name)), log)


def _record_reward_stats(model_dir: Path, stats: dict[str, float]) -> None:
    """Write mean/std into a saved model's config.json in transformers' own layout (indent 2,
    sorted keys). They do not change its rewards, so the scores it was just given stand."""
    path = model_dir / "config.json"
    config = {**json.loads(path.read_text(encoding="utf-8")), **stats}
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _mean_layers(row: dict) -> float:
    values = [v for k, v in row.items() if k.startswith("layer_")]
    return sum(values) / len(values)


def shared_reference(
    params: Params, layout: Layout, objective: Objective, items: Sequence[EncodedPair], cfg: TrainConfig
) -> tuple[StoredReference | None, AnchorConfig]:
    """The reference stage's states for an anchor objective, checked against `items`, and the
    anchor settings the loop should use: when the states were too large to store (or
    anchor.cache is off) the loop runs a frozen forward (with LoRA: the base, adapters
    disabled). normalize=reference takes its per-layer constants from the stage either way.
    Outside the pipeline, with no reference stage output, the loop fills its own in-run cache."""
    if not objective.reference_layers:
        return None, params.anchor
    if not (layout.reference_dir / MANIFEST).exists():
        print(f"reference: no {layout.reference_dir}; filling an in-run cache", file=sys.stderr)
        return None, params.anchor
    manifest = read_manifest(layout.reference_dir)
    recorded = layout.targets_dir(objective.name) / FINGERPRINT
    if recorded.exists() and json.loads(recorded.read_text()) != fingerprint(manifest, objective.layers):
        raise ReferenceMismatchError(
            f"{layout.reference_dir} changed after {recorded} was written; run `dvc repro` (or "
            f"`prefshift targets --method {objective.name}`) so the student trains on the reference it tracks"
        )
    if getattr(objective, "normalize", "none") == "reference":
        objective.set_scale(mean_squares(manifest))
    uncached = params.anchor.model_copy(update={"cache": False})
    if not params.anchor.cache or not manifest["stored"]:
        if not manifest["stored"]:
            print(f"reference: {manifest['reason']}", file=sys.stderr)
        return None, uncached
    reference = StoredReference(layout.reference_dir, objective.layers)
    reference.check(items)
    return reference, params.anchor


def _publish(run) -> Observer:
    """Log each training-log row to the stage's MLflow run as it is written (`train/loss` at its
    step, `drift/layer_2`...), so a long run's curves fill in while it trains, not at its end."""

    def record(series: str, row: dict) -> None:
        run.log_history([row], prefix=f"{series}/")

    return record


def _drift_pairs(layout: Layout) -> list[Pair]:
    """The id_test pairs the finished model's drift is read on (engine.drift), or none without one."""
    path = layout.split("id_test")
    return read_pairs(path)[:READ_PAIRS] if path.exists() else []


_START_ROWS: dict[tuple, Any] = {}
"""Reading states of a start checkpoint, by (base, pairs, settings): see `_start_rows`."""


def _start_rows(model, tokenizer, pairs: Sequence[Pair], params: Params, base_dir: Path):
    """The start's reading states (engine.drift), read once per process: every seed of a method
    starts from the same base, and its fresh head does not change the states it reads, so a stage
    that trains every seed reads them for the first seed and reuses them (bit-identical)."""
    key = (
        str(Path(base_dir).resolve()),
        tuple(p.pair_id for p in pairs),
        params.encode.model_dump_json(),
        params.evaluate.batch_size,
        params.backbone.trust_remote_code,
    )
    if key not in _START_ROWS:
        _START_ROWS[key] = reading_rows(model, tokenizer, pairs, params)
    return _START_ROWS[key]


def _after_training(spec: registry.Method, built: registry.Build, model, log: dict) -> None:
    """The method's step on the trained model, if it has one, recorded in the log by its name."""
    if spec.after_training is None:
        return
    hook = spec.after_training
    result = registry.call_hook(spec, "after_training hook", hook, model, built) or {}
    log["after_training"] = {"hook": f"{hook.__module__}.{hook.__qualname__}", **result}


def fit(
    params: Params,
    layout: Layout,
    *,
    name: str,
    method: str,
    base_dir: Path,
    pairs: Sequence[Pair],
    targets: Sequence[float],
    cfg: TrainConfig,
    out_dir: Path,
) -> dict:
    """Train one reward model from `base_dir` on (pairs, targets), save it to `out_dir`, log the run.

    Shared by the teacher and student stages; the resumable checkpoint is removed once
    the model is saved. Under `accelerate launch` every process trains, but only the main
    one opens the MLflow run and writes the model, log and checkpoint removal.
    """
    state = process_state()
    stage = "teacher" if method == "teacher" else "train"
    opened = (
        tracking.stage_run(params, layout, stage, None if method == "teacher" else method)
        if state.is_main_process
        else nullcontext(None)
    )
    with opened as run:
        seed_everything(params.seed)
        model, tokenizer = load_reward_model(
            base_dir,
            trust_remote_code=params.backbone.trust_remote_code,
            pair_forward=params.encode.pair_forward,
            seed=params.seed,
        )
        drift_pairs = _drift_pairs(layout)
        start_rows = _start_rows(model, tokenizer, drift_pairs, params, base_dir)
        skips = SkipCounter()
        items = Encoder(tokenizer, params.encode).encode_pairs(pairs, targets, skips)
        publish = None if run is None else _publish(run)
        tools = StageTools(params, layout, name, tokenizer, items, publish)
        spec = registry.get(method)
        built = registry.build(method, params, model.num_layers, base_dir, tools)
        objective = registry.objective_of(spec, built)
        ckpt = layout.checkpoint_dir(name)
        reference, anchor = shared_reference(params, layout, objective, items, cfg)
        if spec.prepare is not None:
            registry.call_hook(spec, "prepare hook", spec.prepare, model, objective, built)
        model, log = train_reward_model(
            model,
            tokenizer,
            items,
            objective,
            cfg,
            seed=params.seed,
            name=name,
            anchor=anchor,
            checkpoint_dir=ckpt,
            reference=reference,
            on_record=publish,
        )
        _after_training(spec, built, model, log)
        if tools.logs:
            log["phases"] = tools.logs
        cosine = mean_cosine(start_rows, reading_rows(model, tokenizer, drift_pairs, params))
        log["reward_position"] = {"split": "id_test", "rows": int(start_rows.shape[0]), "cosine": cosine}
        log["skips"] = skips.as_dict()
        state.wait_for_everyone()
        if run is None:
            return log
        _save(
            model,
            tokenizer,
            log,
            params,
            layout,
            name=name,
            method=method,
            out_dir=out_dir,
            kept=tools.kept_state,
        )
        remove_checkpoint(ckpt)
        tools.remove_checkpoints()
        run.log_metrics({"wall_s": log["wall_s"], "peak_rss_mb": log["peak_rss_mb"], "skips": log["skips"]})
        final = log["drift"][-1]
        run.log_metrics({"final_drift_mean_cosine": _mean_layers(final)})
        if "reference" in log:
            run.set_tags({"anchor.reference_route": log["reference"]["route"]})
        run.set_tags({"prefshift.pair_forward": log["pair_forward"]["path"]})
        run.log_artifact(layout.train_log(name), "train")
    return log
