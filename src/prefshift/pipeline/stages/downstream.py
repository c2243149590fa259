"""`prefshift downstream --split S`: best-of-n on one split with each reward model as the proxy,
judged by gold.

One stage per split (downstream for id_test, downstream_target@<target>), as for the samples and
their judging: a split's curves read that split's samples alone (scores are standardised per
split), so a target added or dropped re-runs its own best-of-n and nothing else. Within a split,
the teacher and every listed method, in one process and one DVC stage: a stage per model
paid 8-10 s of start-up (imports, MLflow, DVC) to score 768 samples in 3-4, which made
best-of-n cost 138 s of the embedded default's repro instead of the ~90 s budgeted.
`--method M` scores one model (ad hoc). Each model's reward model scores every policy sample
(data/downstream/<split>/proxies/M/seed-k.parquet); for n = 1, 2, 4, …, n_max the expected
gold score of its best-of-n pick is computed exactly over all n-subsets of the n_max samples
(prefshift.science.best_of_n). Judge and proxy scores are standardised per split over all samples,
so the gold and proxy gains read in standard deviations of their own scorer and the gap
between them (proxy − gold) measures over-optimisation. The synthetic gold rule, where it
applies, is kept on its own 0-1 scale. Output: reports/downstream/<split>/M/seed-k.json and one
MLflow run per model, seed and split (`downstream@M-k` on id_test, `downstream_target@T/M-k` with
the target's metrics, `best_of_n.<target>.…`, on target T).
Best-of-n runs on every seed's models (params `seeds`), so the report's rank agreement between
pairwise metrics and the pick spans methods × seeds; the samples and their judging, the costly
part, are shared by all seeds, and scoring 768 samples costs a model 3-4 s. All models' files are
one output set: replaced together or not at all. When policy_samples skipped best-of-n, both
directories hold only `skipped.json` (the reason and split version), which the report shows in
place of the best-of-n section.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from prefshift.config.params import Params, for_seed
from prefshift.core.atomic import write_json
from prefshift.core.errors import PrefshiftError
from prefshift.core.paths import Layout
from prefshift.data.splits import check_set_version, set_version
from prefshift.pipeline.frames import VERSION_KEY, write_frame
from prefshift.pipeline.output_set import OutputSet, output_set
from prefshift.pipeline.stages.evaluate import rounded
from prefshift.pipeline.stages.gold_judge import describe_judge
from prefshift.pipeline.stages.policy_samples import check_split, read_samples, skipped
from prefshift.science import best_of_n
from prefshift.science.metrics import ID_SPLIT

SKIPPED = "skipped.json"
"""Written into both output directories when best-of-n was skipped: why, and for which splits."""


class DownstreamError(PrefshiftError):
    """Missing or stale inputs of best-of-n; the message names the stage to run."""


def read_gold(layout: Layout) -> pd.DataFrame:
    path = layout.gold_scores
    if not path.exists():
        raise DownstreamError(f"{path}: no gold scores; run `prefshift gold-judge`")
    table = pq.read_table(path)
    stamped = (table.schema.metadata or {}).get(VERSION_KEY)
    check_set_version(layout, layout.bon_split, stamped.decode() if stamped else "unstamped", str(path))
    return table.to_pandas()


def _matrix(frame: pd.DataFrame, column: str, units: list[str]) -> np.ndarray:
    wide = frame.pivot(index="unit", columns="sample", values=column)
    return wide.loc[units].to_numpy(dtype=float)


def split_curves(
    samples: pd.DataFrame, proxy: pd.DataFrame, gold: pd.DataFrame, grid: list[int]
) -> dict[str, dict[str, Any]]:
    """Per split: best-of-n curves against the judge (standardised) and, where it applies, the rule."""
    joined = proxy.merge(gold, on=["unit", "sample"]).merge(
        samples[["unit", "sample", "split"]], on=["unit", "sample"]
    )
    out: dict[str, dict[str, Any]] = {}
    for split in samples["split"].drop_duplicates():
        rows = joined[joined["split"] == split]
        units = sorted(rows["unit"].unique())
        if not units:
            raise DownstreamError(f"split {split!r}: no prompt was scored by both the proxy and the judge")
        proxy_m = best_of_n.standardise(_matrix(rows, "reward", units))
        block: dict[str, Any] = {"judge": None, "rule": None, "prompts": len(units)}
        judged = _matrix(rows, "judge", units)
        if not np.isnan(judged).all():
            judge = best_of_n.curve(proxy_m, best_of_n.standardise(judged), grid)
            block["judge"] = {**judge, **best_of_n.gains(judge)}
        rule = _matrix(rows, "rule", units)
        if not np.isnan(rule).any():
            curve = best_of_n.curve(proxy_m, rule, grid)
            # The rule's 0-1 scale is not the proxy's: its gain stands alone, with no gap.
            block["rule"] = {**curve, "gold_gain": best_of_n.gains(curve)["gold_gain"]}
        out[split] = block
    return out


def document(
    method: str, seed: int, params: Params, version: str, curves: Mapping[str, Any], skips: Mapping
) -> dict:
    return rounded(
        {
            "method": method,
            "seed": seed,
            "split_version": version,
            "judge": describe_judge(params),
            "policy": params.downstream.policy or "models/base/strong",
            "n_max": params.downstream.n_max,
            "splits": dict(curves),
            "skips": dict(skips),
        }
    )


def headline(doc: Mapping[str, Any]) -> dict[str, Any]:
    """Gains per split and judge, for MLflow."""
    return {
        split: {
            kind: {k: block[kind][k] for k in ("gold_gain", "proxy_gain", "gap") if k in block[kind]}
            for kind in ("judge", "rule")
            if block[kind]
        }
        for split, block in doc["splits"].items()
    }


def _model_dir(layout: Layout, method: str):
    """The proxy's directory in `layout`'s seed."""
    model_dir = layout.teacher_dir if method == "teacher" else layout.student_dir(method)
    if not model_dir.exists():
        hint = "prefshift teacher" if method == "teacher" else f"prefshift train --method {method}"
        raise DownstreamError(f"{model_dir}: no reward model for {method!r}; run `{hint}`")
    return model_dir


def _inputs(params: Params, layout: Layout) -> tuple[str, pd.DataFrame, pd.DataFrame, list[str]]:
    """The split's version, samples and gold scores; the samples must be that split's alone."""
    samples, gold = read_samples(layout), read_gold(layout)
    wanted = [layout.bon_split]
    covered = sorted(samples["split"].unique())
    if covered != wanted:
        raise DownstreamError(
            f"{layout.policy_samples} covers splits {covered}, not {wanted}; "
            f"re-run `prefshift policy-samples --split {layout.bon_split}`"
        )
    return set_version(layout, layout.bon_split), samples, gold, wanted


def _stage(layout: Layout) -> tuple[str, str | None]:
    """The MLflow stage and its DVC item: `downstream` on id_test, `downstream_target` keyed by the
    target on a target (runs `downstream_target@T/M-k`, as the DVC stage is downstream_target@T)."""
    return ("downstream", None) if layout.bon_split == ID_SPLIT else ("downstream_target", layout.bon_split)


def _score(params: Params, layout: Layout, method: str, inputs: tuple, staged: OutputSet) -> dict[str, Any]:
    """One proxy of one seed (params and layout for that seed): score the samples, write its scores
    and curves (staged), log its MLflow run."""
    from prefshift.engine.scoring import load_for_scoring, score_samples
    from prefshift.tracking import runs as tracking

    version, samples, gold, wanted = inputs
    model_dir = _model_dir(layout, method)
    stage, item = _stage(layout)
    with tracking.stage_run(params, layout, stage, method, item) as logger:
        model, tokenizer = load_for_scoring(model_dir, params)
        proxy = score_samples(model, tokenizer, samples, params)
        write_frame(staged.path(layout.proxy_scores(method)), proxy, {VERSION_KEY: version.encode()})
        curves = split_curves(samples, proxy, gold, best_of_n.n_grid(params.downstream.n_max))
        wanted_curves = {s: curves[s] for s in wanted}
        doc = document(method, params.seed, params, version, wanted_curves, proxy.attrs["skips"])
        write_json(staged.path(layout.downstream(method)), doc)
        logger.log_metrics({"best_of_n": headline(doc)})
        for split, block in doc["splits"].items():
            if block["judge"] is None:
                continue
            logger.log_history(
                [
                    {"step": n, "gold": g, "proxy": p}
                    for n, g, p in zip(
                        block["judge"]["n"], block["judge"]["gold"], block["judge"]["proxy"], strict=True
                    )
                ],
                prefix=f"best_of_n.{split}.",
            )
        logger.log_artifact(staged.path(layout.downstream(method)), "downstream")
    return doc


def proxies(params: Params) -> list[str]:
    """Every model the stage scores: the teacher, then the listed methods."""
    return ["teacher", *params.methods]


def _command(layout: Layout) -> str:
    return f"prefshift downstream --split {layout.bon_split}"


def _write_skip(layout: Layout, reason: str) -> dict[int, dict[str, dict[str, Any]]]:
    doc = {"skipped": reason, "split_version": set_version(layout, layout.bon_split)}
    directories = [layout.proxy_dir, layout.downstream_dir]
    with output_set(layout.root, _command(layout), directories=directories, manifest=False) as staged:
        for directory in directories:
            write_json(staged.path(directory) / SKIPPED, doc)
    return {}


def _seeded(params: Params, layout: Layout) -> list[tuple[Params, Layout]]:
    """(params, layout) of every listed seed."""
    return [(for_seed(params, k), layout.for_seed(k)) for k in params.seeds]


def run_all(params: Params, layout: Layout) -> dict[int, dict[str, dict[str, Any]]]:
    """Every proxy of every seed on `layout`'s split, as one output set over the split's
    data/downstream/<split>/proxies and reports/downstream/<split> (the DVC stage):
    {seed: {model: document}}."""
    check_split(params, layout.bon_split)
    reason = skipped(layout)
    if reason:
        return _write_skip(layout, reason)
    seeded = _seeded(params, layout)
    for _, one in seeded:  # a missing model fails before anything is scored
        for method in proxies(params):
            _model_dir(one, method)
    inputs = _inputs(params, layout)
    directories = [layout.proxy_dir, layout.downstream_dir]
    # No manifest: nothing verifies these directories, and `--method M` would leave one stale.
    with output_set(layout.root, _command(layout), directories=directories, manifest=False) as staged:
        return {
            one.seed: {method: _score(p, one, method, inputs, staged) for method in proxies(params)}
            for p, one in seeded
        }


def run(params: Params, layout: Layout, method: str) -> dict[str, Any]:
    """One proxy of one seed on one split (`--method M [--seed k] --split S`; params and layout for
    that seed and split): its two files replaced together, every other model's, seed's and split's
    left as they are."""
    check_split(params, layout.bon_split)
    reason = skipped(layout)
    if reason:
        raise DownstreamError(f"{layout.policy_counts}: best-of-n was skipped ({reason}); nothing to score")
    _model_dir(layout, method)  # a missing model is named before any missing upstream input
    inputs = _inputs(params, layout)
    files = [layout.proxy_scores(method), layout.downstream(method)]
    with output_set(layout.root, f"{_command(layout)} --method {method}", files=files) as staged:
        return _score(params, layout, method, inputs, staged)
