"""`prefshift train --method M`: one strong student (or the gold ceiling) from the strong backbone.

`fit` is shared with the teacher stage: load → encode → train → save a plain HF
directory and the training log. Students refuse weak labels made from another
version of the splits.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path

from prefshift.atomic import write_json
from prefshift.config import Params, TrainConfig, check_method
from prefshift.data.encode import Encoder
from prefshift.data.schema import Pair, SkipCounter, read_pairs
from prefshift.methods import build_objective, label_source
from prefshift.models.reward import load_reward_model, save_reward_model
from prefshift.paths import Layout
from prefshift.stages.label import StaleLabelsError, read_labels
from prefshift.train import seed_everything, train_reward_model


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
    """Train one reward model from `base_dir` on (pairs, targets) and save it to `out_dir`."""
    seed_everything(params.seed)
    model, tokenizer = load_reward_model(base_dir, trust_remote_code=params.backbone.trust_remote_code)
    objective = build_objective(method, params, model.num_layers)
    skips = SkipCounter()
    items = Encoder(tokenizer, params.encode).encode_pairs(pairs, targets, skips)
    ckpt = layout.checkpoint_dir(name)
    model, log = train_reward_model(
        model,
        tokenizer,
        items,
        objective,
        cfg,
        seed=params.seed,
        name=name,
        anchor=params.anchor,
        checkpoint_dir=ckpt,
    )
    save_reward_model(model, tokenizer, out_dir)
    log["skips"] = skips.as_dict()
    write_json(layout.train_log(name), log)
    shutil.rmtree(ckpt, ignore_errors=True)
    return log


def _targets(params: Params, layout: Layout, method: str, pairs: Sequence[Pair]) -> list[float]:
    source = label_source(method)
    if source == "gold":
        return [p.gold for p in pairs]
    path = layout.weak_labels if source == "weak" else layout.seam_labels
    labels = read_labels(path, layout)
    missing = [p.pair_id for p in pairs if p.pair_id not in labels]
    if missing:
        raise StaleLabelsError(
            f"{path}: no label for {len(missing)} student_train pairs (e.g. {missing[0]}); rerun label"
        )
    return [labels[p.pair_id] for p in pairs]


def run(params: Params, layout: Layout, method: str) -> dict:
    check_method(method)
    pairs = read_pairs(layout.split("student_train"))
    targets = _targets(params, layout, method, pairs)
    return fit(
        params,
        layout,
        name=method,
        method=method,
        base_dir=layout.base_model("strong"),
        pairs=pairs,
        targets=targets,
        cfg=params.student,
        out_dir=layout.student_dir(method),
    )
