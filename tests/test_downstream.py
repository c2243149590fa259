"""policy-samples → gold-judge → downstream → report on the shrunk tiny project (real models, MLflow)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time

import pandas as pd
import pytest

from prefshift.config.params import ConfigError
from prefshift.core.paths import Layout
from prefshift.pipeline.stages import (
    downstream,
    gold_judge,
    judge,
    judge_target,
    plan,
    policy_samples,
    report,
    report_downstream,
    targets,
    train,
)
from prefshift.pipeline.stages.report_errors import ReportError
from tiny_project import copy_project, pipeline_root, tiny_params

K, N_MAX = 3, 4


@pytest.mark.slow
def test_best_of_n_stages_end_to_end(tmp_path_factory, tmp_path):
    layout = copy_project(pipeline_root(tmp_path_factory), tmp_path / "project")
    settings = {"prompts": K, "n_max": N_MAX, "max_new_tokens": 12}
    params = tiny_params(methods=["naive", "anchor_last", "ceiling"], downstream=settings)
    plan.run(params, layout)
    targets.run(params, layout, "ceiling")
    train.run(params, layout, "ceiling")
    judged = judge.run(params, layout)  # the default judge: trained on a split no proxy sees
    assert judged["training"]["pairs"] > 0
    # The judge stage scores the source alone: a target is judge_target's, so none retrains it.
    assert (
        set(judged["accuracy"]) == {"syn_help_forum"} and judged["accuracy"]["syn_help_forum"]["role"] == "id"
    )
    on_targets = {t: judge_target.run(params, layout, t) for t in params.data.targets}
    for target, doc in on_targets.items():
        assert set(doc["accuracy"]) == {target} and doc["accuracy"][target]["role"] == "ood"
        assert json.loads(layout.judge_target_report(target).read_text()) == doc
    joined = report_downstream.load_judge(layout, params.data.targets)
    assert set(joined["accuracy"]) == {"syn_help_forum", *params.data.targets}
    assert all(0 <= block["acc"] <= 100 and block["n"] == 60 for block in joined["accuracy"].values())
    # On the synthetic suite it trains on, and scores, cue-free text; the breakdown is a stage output.
    assert judged["reads"] == "cues stripped" and set(joined["breakdown"]) == set(joined["accuracy"])
    source = judged["breakdown"]["syn_help_forum"]
    assert source["cues_stripped"] == judged["accuracy"]["syn_help_forum"]
    assert set(source["by_cue"]["sign_off"]) == {"on_chosen", "on_rejected", "absent"}
    assert json.loads(layout.judge_report.read_text())["breakdown"] == judged["breakdown"]
    missing = params.data.targets[0]
    layout.judge_target_report(missing).unlink()
    with pytest.raises(ReportError, match=f"judge-target --target {missing}"):
        report_downstream.load_judge(layout, params.data.targets)
    judge_target.run(params, layout, missing)
    trained_on, _ = judge.judge_pairs(params, layout)
    assert not any(judge.strip_cues(p) != p for p in trained_on)
    assert_judge_is_not_ranked(layout, params)

    # Each split is sampled, judged and ranked on its own (a stage per split): a target's samples
    # never depend on another split's.
    splits = ["id_test", *params.data.targets]
    at = {split: layout.for_split(split) for split in splits}
    for split in splits:
        counts = policy_samples.run(params, at[split])
        assert counts["prompts"] == {split: K} and counts["generated"] == K
    ood = at[splits[1]]
    samples = pd.read_parquet(ood.policy_samples)
    assert set(samples["split"]) == {splits[1]}
    assert len(samples) == K * N_MAX and samples.groupby("unit")["sample"].nunique().eq(N_MAX).all()

    # Each row has its own seed: other batch sizes, and the cache, give the same samples.
    first = ood.policy_samples.read_bytes()
    assert policy_samples.run(params, ood)["generated"] == 0
    assert ood.policy_samples.read_bytes() == first
    ood.policy_generations.unlink()
    rebatched = tiny_params(downstream={**settings, "generation_batch_size": 1})
    assert policy_samples.run(rebatched, ood)["generated"] == K
    assert pd.read_parquet(ood.policy_samples)["response"].tolist() == samples["response"].tolist()
    with pytest.raises(ConfigError, match="--split nowhere: best-of-n runs on id_test or one of"):
        policy_samples.run(params, layout.for_split("nowhere"))

    gold = {split: gold_judge.run(params, at[split]) for split in splits}
    for split in splits:  # the synthetic rule applies
        assert len(gold[split]) == K * N_MAX and gold[split]["rule"].between(0, 1).all()

    docs = {
        split: {m: downstream.run(params, at[split], m) for m in ("teacher", "naive", "ceiling")}
        for split in splits
    }
    for split in splits:
        for name, doc in docs[split].items():
            assert json.loads(at[split].downstream(name).read_text()) == doc
            assert doc["judge"].startswith("trained judge") and set(doc["splits"]) == {split}
            curve = doc["splits"][split]["judge"]
            assert curve["n"] == [1, 2, 4] and curve["prompts"] == K
            assert abs(curve["gold"][0]) < 1e-3  # n = 1 is the mean of standardised scores
            assert curve["proxy"] == sorted(curve["proxy"])  # the proxy's own view only improves with n
            rule = doc["splits"][split]["rule"]["gold"][0]
            assert rule == pytest.approx(gold[split]["rule"].mean(), abs=1e-3)
        # the ceiling is a contestant now: its picks are judged by another model
        ceiling = docs[split]["ceiling"]["splits"][split]["judge"]
        assert ceiling["gold"] != pytest.approx(ceiling["proxy"], abs=1e-3)

    # The DVC stage: every proxy (teacher, then the listed methods) of every seed in one process,
    # one output set per split (the anchor_last student of `params` is not trained here, so two
    # methods are listed).
    listed = tiny_params(methods=["naive", "ceiling"], downstream=settings)
    since_ms = int(time.time() * 1000)
    for split in splits:
        shared = Layout(layout.root).for_split(split)  # as the CLI passes it: one stage for every seed
        assert listed.seeds == [0] and downstream.run_all(listed, shared) == {0: docs[split]}
        written = {shared.downstream_dir: ".json", shared.proxy_dir: ".parquet"}
        for directory, suffix in written.items():
            names = sorted(str(p.relative_to(directory)) for p in directory.rglob(f"*{suffix}"))
            assert names == [f"{m}/seed-0{suffix}" for m in ("ceiling", "naive", "teacher")]

    import mlflow

    client = mlflow.MlflowClient(os.environ["MLFLOW_TRACKING_URI"])  # the session's: other tests log too
    experiment_id = client.get_experiment_by_name(params.tracking.experiment).experiment_id
    for name in ("teacher", "naive", "ceiling"):  # run_all's own runs: one per proxy
        runs = client.search_runs(
            [experiment_id],
            filter_string=f"tags.mlflow.runName = 'downstream@{name}-0' "
            f"and attributes.start_time >= {since_ms}",
        )
        assert len(runs) == 1 and "best_of_n.id_test.judge.gold_gain" in runs[0].data.metrics, name
        for target in params.data.targets:  # a target's runs are downstream_target's, named by it
            on_target = client.search_runs(
                [experiment_id],
                filter_string=f"tags.mlflow.runName = 'downstream_target@{target}/{name}-0' "
                f"and attributes.start_time >= {since_ms}",
            )
            assert len(on_target) == 1, (target, name)
            assert {m.split(".")[1] for m in on_target[0].data.metrics} == {target}
            assert on_target[0].data.tags["dvc.stage"] == f"downstream_target@{target}"

    report.run(params, layout)
    text = layout.summary.read_text(encoding="utf-8")
    assert "## Best-of-n against a gold judge" in text and "a proxy for human gold" in text
    assert "| Judge accuracy on | role | pairs |" in text and "| syn_help_forum | ID | 60 |" in text
    assert "## Paired comparisons" in text and "[comparisons.csv](comparisons.csv)" in text
    table = pd.read_csv(layout.summary.parent / "comparisons.csv")
    pair = (table["a"] == "naive") & (table["b"] == "teacher") & (table["split"] == "syn_help_chat")
    assert pair.sum() == 1
    assert "| cues stripped (what it reads) |" in text  # the judge's breakdown is shown
    assert (layout.figures / "best_of_n.png").stat().st_size > 1000

    # No trained judge on disk: gold-judge names the stage to run.
    shutil.rmtree(layout.judge_dir)
    with pytest.raises(gold_judge.JudgeError, match="prefshift judge"):
        gold_judge.run(params, at["id_test"])
    with pytest.raises(gold_judge.JudgeError, match="run `prefshift judge`"):
        judge_target.run(params, layout, params.data.targets[0])


def assert_judge_is_not_ranked(layout, params) -> None:
    """The judge is a model of its own: its weights are none of the ranked models', and it trained on
    pairs that neither the teacher's nor any student's split holds."""
    from prefshift.data.schema import pair_content_hash, read_pairs

    def weights(model_dir):
        return hashlib.sha256((model_dir / "model.safetensors").read_bytes()).hexdigest()

    ranked = [layout.teacher_dir, *(layout.student_dir(m) for m in params.methods)]
    ranked = [d for d in ranked if d.exists()]
    assert ranked and weights(layout.judge_dir) not in {weights(d) for d in ranked}
    trained_on = {pair_content_hash(p) for p in judge.judge_pairs(params, layout)[0]}
    for split in ("teacher_train", "student_train", "id_test"):
        assert trained_on.isdisjoint(pair_content_hash(p) for p in read_pairs(layout.split(split)))


def test_missing_inputs_name_the_stage_to_run(tmp_path, make_params):
    from prefshift.config.params import DownstreamConfig
    from prefshift.core.errors import PrefshiftError
    from prefshift.core.paths import Layout
    from prefshift.engine.policy import PolicySampler

    with pytest.raises(PrefshiftError, match="no-such-org/no-such-policy"):
        PolicySampler("no-such-org/no-such-policy", DownstreamConfig())
    layout = Layout(tmp_path, seed=0).for_split("id_test")
    with pytest.raises(PrefshiftError, match="prefshift train --method naive"):
        downstream.run(make_params(), layout, "naive")
    with pytest.raises(PrefshiftError, match="prefshift policy-samples"):
        gold_judge.run(make_params(), layout)


RANKED_NAMES = [
    "ceiling",
    "teacher",
    "naive",
    "models/students/naive",
    "./models/teacher",
    "/x/models/students/m",
]


@pytest.mark.parametrize("named", RANKED_NAMES)
def test_params_refuse_a_judge_that_is_ranked(make_params, named):
    from prefshift.config.params import ConfigError

    with pytest.raises(ConfigError, match=r"downstream.judge .* names a model that best-of-n ranks"):
        make_params(downstream={"judge": named})
    assert make_params(downstream={"judge": "org/public-rm"}).downstream.judge == "org/public-rm"


def test_the_trained_judge_needs_the_synthetic_judge_split(tmp_path, make_params):
    from prefshift.core.paths import Layout

    params = make_params(data={"source": "hh_helpful", "targets": ["helpsteer3"]})
    with pytest.raises(gold_judge.JudgeError, match=r"has no judge split.*hub id in downstream.judge"):
        judge.judge_pairs(params, Layout(tmp_path, seed=0))
