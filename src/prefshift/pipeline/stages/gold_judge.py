"""`prefshift gold-judge`: the gold score of every policy sample, once for all proxy reward models.

The judge is `downstream.judge`: `ceiling` (default) is the strong backbone trained on gold
labels (the first seed's, models/students/seed-<k>/ceiling). It is a *proxy* for human gold, not
human gold: it shares the strong backbone, the training data and the tokenizer with the students
it judges, so the report says so wherever it shows judge scores. Any reward-model directory or
hub id may be named instead (e.g. a large public reward model on a real preset). When `methods`
does not list the ceiling, the default judge is absent: judge scores are NaN and only the rule
judges. The stage depends on models/students as a whole (dvc.yaml cannot name the ceiling's
directory when the ceiling may not be listed); deterministic scoring rewrites identical gold
scores when another student changes, so no downstream stage re-runs for it. On the synthetic
suite the suite's own gold rule (`synthetic.rule_score`) also scores every sample: a judge that
needs no model, but only for text it recognises. When policy_samples skipped best-of-n, the
stage writes an empty gold file (its declared output) and loads no judge.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import torch

from prefshift.config.params import Params
from prefshift.core.console import messages
from prefshift.core.paths import Layout
from prefshift.data.splits import load_manifest
from prefshift.data.synthetic import rule_score
from prefshift.engine.scoring import score_samples
from prefshift.pipeline.frames import VERSION_KEY, write_frame
from prefshift.pipeline.stages.policy_samples import read_samples, skipped

console = messages()

GOLD_COLUMNS = ["unit", "sample", "judge", "rule"]
NO_JUDGE = "none (the default judge is the ceiling, which methods do not list)"


def judge_source(params: Params, layout: Layout) -> str | None:
    """The judge's directory or hub id; None when the judge is the ceiling and methods do not list it."""
    judge = params.downstream.judge
    if judge != "ceiling":
        return judge
    ceiling = layout.for_seed(params.seeds[0]).student_dir("ceiling")
    return str(ceiling) if "ceiling" in params.methods else None


def describe_judge(params: Params) -> str:
    judge = params.downstream.judge
    if judge == "ceiling" and "ceiling" not in params.methods:
        return NO_JUDGE
    if judge == "ceiling":
        return "ceiling (strong backbone trained on gold labels; a proxy for human gold)"
    return judge + (f"@{params.downstream.judge_revision}" if params.downstream.judge_revision else "")


def run(params: Params, layout: Layout) -> pd.DataFrame:
    from prefshift.models.reward import load_reward_model

    reason = skipped(layout)
    if reason:
        empty = pd.DataFrame({"unit": pd.Series(dtype="string"), "sample": pd.Series(dtype="int64")})
        frame = empty.assign(judge=pd.Series(dtype=float), rule=pd.Series(dtype=float))
        version = str(load_manifest(layout)["version"])
        write_frame(layout.gold_scores, frame[GOLD_COLUMNS], {VERSION_KEY: version.encode()})
        console.print(f"gold-judge: nothing to judge, best-of-n skipped: {reason}")
        return frame
    samples = read_samples(layout)
    source = judge_source(params, layout)
    if source is None:
        judged = samples[["unit", "sample"]].assign(reward=np.nan)
    else:
        model, tokenizer = load_reward_model(
            source,
            trust_remote_code=params.backbone.trust_remote_code,
            revision=params.downstream.judge_revision,
            pair_forward=params.encode.pair_forward,
        )
        model.to("cuda" if torch.cuda.is_available() else "cpu").eval()
        judged = score_samples(model, tokenizer, samples, params)
    rules = [
        rule_score(category, json.loads(meta), response)
        for category, meta, response in zip(
            samples["category"], samples["meta"], samples["response"], strict=True
        )
    ]
    rule = samples[["unit", "sample"]].assign(rule=[np.nan if r is None else r for r in rules])
    frame = judged.rename(columns={"reward": "judge"}).merge(rule, on=["unit", "sample"], how="left")
    version = str(load_manifest(layout)["version"])
    write_frame(layout.gold_scores, frame[GOLD_COLUMNS], {VERSION_KEY: version.encode()})
    return frame
