"""A trained reward model's margins on every held-out split, written by the stage that trains it.

`prefshift teacher` and `prefshift train` score their model from the saved directory reloaded,
so the scores are the artifact's and not the in-memory model's (the teacher also scores
student_train: its soft labels). Label and evaluate then work on score files and load no
model: importing torch and transformers and reloading the model was a third of each evaluate
stage's time and most of label's.
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
from prefshift.data.splits import load_manifest, noisy_pairs
from prefshift.pipeline.frames import VERSION_KEY, write_frame
from prefshift.pipeline.output_set import OutputSet

SKIPS_FILE = "skips.json"
TRUNCATION_FILE = "truncation.json"


def write_scores(path: Path, frame: pd.DataFrame, version: str) -> None:
    """A score parquet stamped with the split version it was computed on."""
    write_frame(path, frame.reset_index(drop=True), {VERSION_KEY: version.encode()})


def skips_path(layout: Layout, model: str) -> Path:
    return layout.scores_dir(model) / SKIPS_FILE


def read_skips(layout: Layout, model: str) -> dict[str, dict]:
    """split (or `groups/<dataset>`) → the skip counts of scoring it (kept, skipped per reason,
    examples: responses that did not survive truncation); {} if not recorded."""
    path = skips_path(layout, model)
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}


def truncation_path(layout: Layout, model: str) -> Path:
    return layout.scores_dir(model) / TRUNCATION_FILE


def read_truncation(layout: Layout, model: str) -> dict[str, dict]:
    """split (or `groups/<dataset>`) → `TruncationCount.as_dict()` of scoring it with `model`'s
    tokenizer; {} for scores written before truncation was counted."""
    path = truncation_path(layout, model)
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}


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
    """Score id_test, every target, the splits in `also` and every best-of-n group set with the
    model in `model_dir`, staging the files in `out` under data/scores/<name>/seed-<k>/. The teacher's
    pair scores carry `data.teacher_noise` (`with_annotator_noise`); its group scores do not.

    Returns the skip counts per split and group set, the truncation counts (also written to
    truncation.json, and a warning printed once when a split is over evaluate.warn_truncated_share)
    and the mean/std of the rewards on id_test (the model's normalisation constants), so the trainer
    needs no second pass over id_test for them.
    """
    from prefshift.engine.scoring import load_for_scoring, rewards_mean_std, score_groups, score_pairs

    version = str(load_manifest(layout)["version"])
    model, tokenizer = load_for_scoring(model_dir, params)
    skips: dict[str, dict] = {}
    truncation: dict[str, dict] = {}
    frames = {}
    for split in ["id_test", *params.data.targets, *also]:
        counter = SkipCounter()
        frames[split] = score_pairs(
            model, tokenizer, read_pairs(layout.split(split)), params, counter, f"score {name} {split}"
        )
        truncation[split] = frames[split].attrs.pop("truncation")  # its own file, not the parquet's metadata
        if name == "teacher":
            frames[split] = with_annotator_noise(frames[split], params.data.teacher_noise, params.seed)
        write_scores(out.path(layout.scores(name, split)), frames[split], version)
        skips[split] = counter.as_dict()
    for dataset in [params.data.source, *params.data.targets]:
        path = layout.split_groups(dataset)
        if path.exists():
            label = f"score {name} groups/{dataset}"
            frame = score_groups(model, tokenizer, read_groups(path), params, label)
            truncation[f"groups/{dataset}"] = frame.attrs.pop("truncation")
            write_scores(out.path(layout.group_scores(name, dataset)), frame, version)
            skips[f"groups/{dataset}"] = frame.attrs["skips"]
    write_json(out.path(skips_path(layout, name)), skips)
    write_json(out.path(truncation_path(layout, name)), truncation)
    warning = truncation_warning(name, truncation, params.evaluate.warn_truncated_share)
    if warning:
        messages().print(warning)
    return {"skips": skips, "truncation": truncation, "reward_stats": rewards_mean_std(frames["id_test"])}
