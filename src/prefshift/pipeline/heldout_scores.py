"""A trained reward model's margins on the held-out splits, as score files stamped with their split's version.

The stage that trains a model scores what is part of the model: id_test (whose reward mean/std
go into the saved config), the source's best-of-n groups and, for the teacher, student_train (its
labels), all from the saved directory reloaded, so the scores are the artifact's and not the
in-memory model's (`score_heldout`). Each target is scored apart by `prefshift score-target`
(`score_target`), keyed by model and target: a new target adds scoring and retrains nothing, and a
model is scored on a target that did not exist when it was trained. Every score file carries the
version of the one split it scored (`splits.split_version`), and readers check that split alone.
Label and evaluate work on score files and load no model.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from prefshift.config.params import Params
from prefshift.core.atomic import write_json
from prefshift.core.console import messages
from prefshift.core.paths import Layout
from prefshift.data.schema import SkipCounter, read_groups, read_pairs
from prefshift.data.splits import current_version, noisy_pairs
from prefshift.pipeline.frames import VERSION_KEY, write_frame
from prefshift.pipeline.output_set import OutputSet

SKIPS_FILE = "skips.json"
TRUNCATION_FILE = "truncation.json"


def write_scores(path: Path, frame: pd.DataFrame, version: str) -> None:
    """A score parquet stamped with the version of the split it was computed on."""
    write_frame(path, frame.reset_index(drop=True), {VERSION_KEY: version.encode()})


def _merged(layout: Layout, model: str, targets: Sequence[str], name: str) -> dict[str, dict]:
    """One JSON record of the source's scoring and each target's, merged by split; {} where absent."""
    out: dict[str, dict] = {}
    for where in [layout.scores_dir(model), *(layout.target_scores_dir(model, t) for t in targets)]:
        path = where / name
        if path.exists():
            out.update(json.loads(path.read_text(encoding="utf-8")))
    return out


def read_skips(layout: Layout, model: str, targets: Sequence[str] = ()) -> dict[str, dict]:
    """split (or `groups/<dataset>`) → the skip counts of scoring it (kept, skipped per reason,
    examples: responses that did not survive truncation), for the source's splits and `targets`."""
    return _merged(layout, model, targets, SKIPS_FILE)


def truncation_path(layout: Layout, model: str, target: str | None = None) -> Path:
    where = layout.scores_dir(model) if target is None else layout.target_scores_dir(model, target)
    return where / TRUNCATION_FILE


def read_truncation(layout: Layout, model: str, targets: Sequence[str] = ()) -> dict[str, dict]:
    """split (or `groups/<dataset>`) → `TruncationCount.as_dict()` of scoring it with `model`'s
    tokenizer, for the source's splits and `targets`; {} for scores written before truncation was counted."""
    return _merged(layout, model, targets, TRUNCATION_FILE)


def over_threshold(truncation: dict[str, dict], threshold: float) -> dict[str, float]:
    """split → share of its items truncation cut, for the splits above `threshold`."""
    return {split: counts["share"] for split, counts in truncation.items() if counts["share"] > threshold}


def truncation_warning(model: str, truncation: dict[str, dict], threshold: float) -> str | None:
    """One line naming the splits where truncation cut more than `threshold` of the pairs, or None."""
    over = over_threshold(truncation, threshold)
    if not over:
        return None
    listed = ", ".join(f"{split} {share:.0%}" for split, share in over.items())
    return (
        f"warning: truncation to encode.max_length cut the prompt or a response of more than "
        f"{threshold:.0%} (evaluate.warn_truncated_share) of the pairs or response groups scored by "
        f"{model}: {listed}; raise encode.max_length to score whole texts"
    )


def with_annotator_noise(frame: pd.DataFrame, share: float, seed: int) -> pd.DataFrame:
    """The teacher's scores of one split with its judgement of `noisy_pairs` reversed (Δ negated,
    the two rewards swapped): the weak teacher as an inconsistent annotator (`data.teacher_noise`).
    Swapping keeps the rewards' mean and std, so the saved model's normalisation is unchanged."""
    if share == 0:
        return frame
    flip = frame["pair_id"].isin(noisy_pairs(frame["pair_id"].tolist(), share, seed)).to_numpy()
    out = frame.copy()
    out.loc[flip, "delta"] = -frame.loc[flip, "delta"]
    out.loc[flip, "reward_chosen"] = frame.loc[flip, "reward_rejected"]
    out.loc[flip, "reward_rejected"] = frame.loc[flip, "reward_chosen"]
    return out


def score_heldout(
    model_dir: Path, params: Params, layout: Layout, name: str, out: OutputSet, also: Sequence[str] = ()
) -> dict:
    """Score id_test, the splits in `also` and the source's best-of-n groups with the model in
    `model_dir`, staging the files in `out` under data/scores/<name>/seed-<k>/. The teacher's
    pair scores carry `data.teacher_noise` (`with_annotator_noise`); its group scores do not.

    Returns the skip counts per split and group set, the truncation counts (also written to
    truncation.json, and a warning printed once when a split is over evaluate.warn_truncated_share)
    and the mean/std of the rewards on id_test (the model's normalisation constants), so the trainer
    needs no second pass over id_test for them.
    """
    from prefshift.engine.scoring import load_for_scoring, rewards_mean_std

    model, tokenizer = load_for_scoring(model_dir, params)
    scored = _score(
        model,
        tokenizer,
        params,
        layout,
        name,
        ["id_test", *also],
        params.data.source,
        out,
        layout.scores_dir(name),
    )
    return {**scored, "reward_stats": rewards_mean_std(scored["frames"]["id_test"])}


def score_target(
    model_dir: Path, params: Params, layout: Layout, name: str, target: str, out: OutputSet
) -> dict:
    """Score one target's ood split and best-of-n groups with the model in `model_dir`, staging the
    files in `out` under data/target_scores/<name>/<target>/seed-<k>/ (as `score_heldout` does)."""
    from prefshift.engine.scoring import load_for_scoring

    model, tokenizer = load_for_scoring(model_dir, params)
    return _score(
        model, tokenizer, params, layout, name, [target], target, out, layout.target_scores_dir(name, target)
    )


def _score(
    model,
    tokenizer,
    params: Params,
    layout: Layout,
    name: str,
    splits: Sequence[str],
    dataset: str,
    out: OutputSet,
    directory: Path,
) -> dict:
    """Pair scores of `splits` and group scores of `dataset` (if it has groups), each stamped with
    its split's version, with skips.json and truncation.json beside them in `directory`."""
    from prefshift.engine.scoring import score_groups, score_pairs

    skips: dict[str, dict] = {}
    truncation: dict[str, dict] = {}
    frames = {}
    for split in splits:
        counter = SkipCounter()
        frames[split] = score_pairs(
            model, tokenizer, read_pairs(layout.split(split)), params, counter, f"score {name} {split}"
        )
        truncation[split] = frames[split].attrs.pop("truncation")  # its own file, not the parquet's metadata
        if name == "teacher":
            frames[split] = with_annotator_noise(frames[split], params.data.teacher_noise, params.seed)
        write_scores(out.path(layout.scores(name, split)), frames[split], current_version(layout, split))
        skips[split] = counter.as_dict()
    path = layout.split_groups(dataset, params.data.source)
    if path.exists():
        key = f"groups/{dataset}"
        frame = score_groups(model, tokenizer, read_groups(path), params, f"score {name} {key}")
        truncation[key] = frame.attrs.pop("truncation")
        write_scores(
            out.path(layout.group_scores(name, dataset, params.data.source)),
            frame,
            current_version(layout, key),
        )
        skips[key] = frame.attrs["skips"]
    write_json(out.path(directory / SKIPS_FILE), skips)
    write_json(out.path(directory / TRUNCATION_FILE), truncation)
    warning = truncation_warning(name, truncation, params.evaluate.warn_truncated_share)
    if warning:
        messages().print(warning)
    return {"skips": skips, "truncation": truncation, "frames": frames}
