"""The report's paired comparisons: each method against naive and against the teacher, per split.

Reads the per-pair margins evaluate and label wrote (data/scores/<model>/<split>.parquet)
for the intervals, and the metrics files of seed replicates (reports/sweeps/, `sweep:
{seed: s}`) for the across-seed check; the math is in prefshift.science.comparisons.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from prefshift.config.params import Params, method_order
from prefshift.core.paths import Layout
from prefshift.pipeline.sweep_points import replicate_seed
from prefshift.science import comparisons as cmp
from prefshift.science.metrics import ID_SPLIT, split_seed

BASELINES = ("naive", "anchor_last", "teacher")


def _scores(layout: Layout, model: str, splits: Sequence[str]) -> dict[str, pd.DataFrame] | None:
    paths = {s: layout.scores(model, s) for s in splits}
    if not all(p.exists() for p in paths.values()):
        return None
    return {s: pd.read_parquet(p, columns=["pair_id", "delta"]) for s, p in paths.items()}


def seed_runs(metrics: Mapping[str, Mapping], sweeps: Sequence[Mapping]) -> dict[int, dict[str, Mapping]]:
    """seed → method → metrics document: the main runs plus seed-only sweep replicates."""
    runs: dict[int, dict[str, Mapping]] = defaultdict(dict)
    for method, doc in metrics.items():
        runs[doc["setting"]["seed"]][method] = doc
    for run in sweeps:
        seed = replicate_seed(run["sweep"])
        if seed is not None:
            runs[seed].setdefault(run["method"], run)
    return runs


def _value(doc: Mapping[str, Any], model: str, split: str, metric: str) -> float:
    """A model's accuracy or NTS on a split, from a method's metrics document (teacher: its block)."""
    if metric == "nts":
        return 0.0 if model == "teacher" else doc["targets"][split]["nts"]
    block = doc["teacher"] if model == "teacher" else doc
    return block["id"]["acc"] if split == ID_SPLIT else block["targets"][split]["acc"]


def seed_diffs(
    runs: Mapping[int, Mapping[str, Mapping]], a: str, b: str, split: str, metric: str
) -> list[float]:
    diffs = []
    for seed in sorted(runs):
        docs = runs[seed]
        if a in docs and (b == "teacher" or b in docs):
            diffs.append(
                _value(docs[a], a, split, metric)
                - _value(docs[a] if b == "teacher" else docs[b], b, split, metric)
            )
    return diffs


def compare(
    params: Params, layout: Layout, metrics: Mapping[str, Mapping], sweeps: Sequence[Mapping]
) -> list[dict]:
    """One row per (method, baseline, split, metric) whose score files exist."""
    targets = list(params.data.targets)
    splits = [ID_SPLIT, *targets]
    runs = seed_runs(metrics, sweeps)
    teacher = _scores(layout, "teacher", splits)
    if teacher is None:
        return []
    models = {m: s for m in method_order(metrics) if (s := _scores(layout, m, splits)) is not None}
    models["teacher"] = teacher
    draws, level, seed = params.evaluate.bootstrap, params.evaluate.ci, params.seed
    rows = []
    for a in method_order(m for m in models if m != "teacher"):
        for b in BASELINES:
            if a == b or b not in models:
                continue
            credits = {
                s: cmp.aligned_credits({n: models[n][s] for n in dict.fromkeys([a, b, "teacher"])})
                for s in splits
            }
            for split in splits:
                result = cmp.paired_difference(
                    credits[split][a],
                    credits[split][b],
                    draws=draws,
                    level=level,
                    rng=split_seed(seed, split),
                )
                rows.append(_row(a, b, split, "acc", result, seed_diffs(runs, a, b, split, "acc")))
            for target in targets:
                result = cmp.nts_difference(
                    credits[ID_SPLIT],
                    credits[target],
                    a,
                    b,
                    target=target,
                    draws=draws,
                    level=level,
                    seed=seed,
                )
                rows.append(_row(a, b, target, "nts", result, seed_diffs(runs, a, b, target, "nts")))
    return rows


def _row(a: str, b: str, split: str, metric: str, result: Mapping, diffs: Sequence[float]) -> dict[str, Any]:
    seeds = cmp.seed_agreement(diffs) if len(diffs) > 1 else None
    return {
        "a": a,
        "b": b,
        "split": split,
        "metric": metric,
        **result,
        "seeds": seeds,
        "verdict": cmp.verdict(a, b, split, result, seeds, "NTS" if metric == "nts" else ""),
    }


def _seed_cells(seeds: Mapping[str, Any] | None) -> list[str]:
    if seeds is None:
        return ["—", "—"]
    std = "" if seeds["std"] is None else f" ± {seeds['std']:.1f}"
    return [f"{seeds['mean']:+.1f}{std} (n={seeds['n']})", f"{seeds['agree']}/{seeds['n']}"]


def comparisons_section(rows: Sequence[Mapping[str, Any]]) -> str | None:
    if not rows:
        return None
    level = "95%"
    table = [
        "| A | B | split | metric | A − B (pp) [95% CI] | across seeds | sign agree | verdict |",
        "|" + "---|" * 8,
    ]
    for r in rows:
        lo, hi = r["ci"]
        call = r["verdict"].rsplit(": ", 1)[1]
        table.append(
            f"| {r['a']} | {r['b']} | {r['split']} | {'NTS' if r['metric'] == 'nts' else 'acc'} | "
            f"{r['diff']:+.1f} [{lo:+.1f}, {hi:+.1f}] | "
            + " | ".join(_seed_cells(r["seeds"]))
            + f" | {call} |"
        )
    verdicts = [f"- {r['verdict']}" for r in rows if r["split"] != ID_SPLIT]
    return (
        "## Paired comparisons\n\n"
        "Per-pair difference in correctness between two models on the same pairs, with a paired "
        f"bootstrap {level} interval (pairs resampled once per draw for both); NTS differences resample "
        "the ID split and the target together. Across seeds: mean ± std of the per-seed difference, "
        "from seed replicates in reports/sweeps/. A difference is called only when its interval "
        "excludes 0 and every seed agrees in sign; one seed is not evidence when effects can flip "
        "sign between seeds.\n\n" + "\n".join(table) + "\n\nVerdicts per target:\n\n" + "\n".join(verdicts)
    )
