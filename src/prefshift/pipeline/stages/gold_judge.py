"""`prefshift gold-judge --split S`: the gold score of every policy sample of one split, once for
all proxy reward models (one stage per split: gold_judge for id_test, gold_judge_target@<target>).

The judge is built by `prefshift judge` and is never one of the models best-of-n ranks (params
refuse a judge that names the teacher, the ceiling or a listed method): by default a reward model
trained on the synthetic source's judge split (cues uninformative), which no proxy sees
(models/judge); or any reward-model directory or hub id named in `downstream.judge` (e.g. a large
public reward model on a real preset). reports/judge.json and reports/judge_targets/ hold
its accuracy on every test split. It is a *proxy* for human gold, not human gold, so the report
shows that accuracy wherever it shows judge scores.
On the synthetic suite the judge scores each sample with its shortcut cues taken off, as it was
trained (`reads_without_cues`): the cues are not gold. The suite's own gold rule
(`synthetic.rule_score`) also scores every sample there: a judge that needs no model, but only
for text it recognises. When policy_samples
skipped best-of-n, the stage writes an empty gold file (its declared output) and loads no judge.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import torch

from prefshift.config.params import JUDGE_TRAINED, SYNTHETIC_DATASETS, Params
from prefshift.core.console import messages
from prefshift.core.errors import PrefshiftError
from prefshift.core.paths import Layout
from prefshift.data.splits import set_version
from prefshift.data.synthetic import rule_score, without_cues
from prefshift.engine.scoring import score_samples
from prefshift.pipeline.frames import VERSION_KEY, write_frame
from prefshift.pipeline.stages.policy_samples import check_split, read_samples, skipped

console = messages()

GOLD_COLUMNS = ["unit", "sample", "judge", "rule"]


class JudgeError(PrefshiftError):
    """A judge that cannot be built or loaded from these params or inputs; the message says what to do."""


def judge_source(params: Params, layout: Layout) -> str:
    """What to load: models/judge for the trained judge, else the named directory or hub id."""
    return str(layout.judge_dir) if params.downstream.judge == JUDGE_TRAINED else params.downstream.judge


def describe_judge(params: Params) -> str:
    """The judge in one phrase, for the report and every best-of-n document."""
    cfg = params.downstream
    if cfg.judge == JUDGE_TRAINED:
        return (
            f"trained judge (the strong base trained on {params.data.source}'s judge split, its cues "
            "stripped, which no ranked model sees)"
        )
    return cfg.judge + (f"@{cfg.judge_revision}" if cfg.judge_revision else "")


def reads_without_cues(params: Params) -> bool:
    """The judge reads cue-free text wherever the source is the synthetic suite (its cues are not gold)."""
    return params.data.source in SYNTHETIC_DATASETS


def run(params: Params, layout: Layout) -> pd.DataFrame:
    """Judge the samples of `layout`'s split (a layout bound by `policy_samples.split_layout`)."""
    from prefshift.models.reward import load_reward_model

    check_split(params, layout.bon_split)
    reason = skipped(layout)
    if reason:
        empty = pd.DataFrame({"unit": pd.Series(dtype="string"), "sample": pd.Series(dtype="int64")})
        frame = empty.assign(judge=pd.Series(dtype=float), rule=pd.Series(dtype=float))
        version = set_version(layout, layout.bon_split)
        write_frame(layout.gold_scores, frame[GOLD_COLUMNS], {VERSION_KEY: version.encode()})
        console.print(f"gold-judge {layout.bon_split}: nothing to judge, best-of-n skipped: {reason}")
        return frame
    samples = read_samples(layout)
    trained = params.downstream.judge == JUDGE_TRAINED
    if trained and not (layout.judge_dir / "config.json").exists():
        raise JudgeError(f"{layout.judge_dir}: no trained judge; run `prefshift judge`")
    model, tokenizer = load_reward_model(
        judge_source(params, layout),
        trust_remote_code=params.backbone.trust_remote_code,
        revision=None if trained else params.downstream.judge_revision,
        trained_head=trained,
        pair_forward=params.encode.pair_forward,
    )
    model.to("cuda" if torch.cuda.is_available() else "cpu").eval()
    read = (
        samples.assign(response=samples["response"].map(without_cues))
        if reads_without_cues(params)
        else samples
    )
    judged = score_samples(model, tokenizer, read, params)
    rules = [
        rule_score(category, json.loads(meta), response)
        for category, meta, response in zip(
            samples["category"], samples["meta"], samples["response"], strict=True
        )
    ]
    rule = samples[["unit", "sample"]].assign(rule=[np.nan if r is None else r for r in rules])
    frame = judged.rename(columns={"reward": "judge"}).merge(rule, on=["unit", "sample"], how="left")
    version = set_version(layout, layout.bon_split)
    write_frame(layout.gold_scores, frame[GOLD_COLUMNS], {VERSION_KEY: version.encode()})
    return frame
