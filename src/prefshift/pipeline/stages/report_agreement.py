"""The report's metric-agreement section: do the pairwise metrics rank models as best-of-n does?

For each split best-of-n ran on (ID test and every OOD target), every trained model with a
best-of-n document (the teacher and each method, on every seed: methods × seeds, plus each
seed's teacher) gives one point: a pairwise metric (ID accuracy; the target's accuracy, NTS
and, for a benchmark target, its official score) and its gold-judge gain from n = 1 to the
largest n. Kendall's τ-b with a bootstrap interval over models (prefshift.science.agreement)
says whether the metric orders the models as the downstream pick does. Evidence about the
metrics, not the methods: with a handful of models the interval is wide, and the table says n.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from prefshift.science import agreement
from prefshift.science.metrics import ID_SPLIT, split_seed


def _proxies(doc: Mapping[str, Any], split: str, teacher: bool) -> dict[str, float]:
    """The pairwise metrics of one model that speak to `split`."""
    if split == ID_SPLIT:
        return {"ID acc": doc["id"]["acc"]}
    block = doc["targets"][split]
    out = {
        "ID acc": doc["id"]["acc"],
        f"{split} acc": block["acc"],
        f"{split} NTS": 0.0 if teacher else block["nts"],
    }
    official = (doc.get("benchmarks") or {}).get("targets", {}).get(split, {}).get("score")
    if official is not None:
        out[f"{split} official score"] = official
    return out


def agreement_rows(
    runs: Mapping[int, Mapping[str, Mapping[str, Any]]],
    downstream: Mapping[int, Mapping[str, Mapping[str, Any]]],
    splits: Sequence[str],
    *,
    draws: int,
    level: float,
    seed: int,
) -> list[dict[str, Any]]:
    """One row per (split, pairwise metric): τ between the metric and the best-of-n gold gain over
    every (seed, model) with both, from runs {seed: {method: metrics}} (each seed's teacher inside
    its documents) and downstream {seed: {model: best-of-n document}}."""
    rows = []
    for split in splits:
        gains, proxies = [], {}
        for replicate, metrics in runs.items():
            models = {"teacher": next(iter(metrics.values()))["teacher"], **metrics}
            for name, doc in models.items():
                best_of_n = downstream.get(replicate, {}).get(name, {})
                judged = best_of_n.get("splits", {}).get(split, {}).get("judge")
                if not judged or judged.get("gold_gain") is None:
                    continue
                gains.append(judged["gold_gain"])
                for metric, value in _proxies(doc, split, name == "teacher").items():
                    proxies.setdefault(metric, []).append(value)
        for metric, values in proxies.items():
            result = agreement.kendall_tau(
                values, gains, draws=draws, level=level, rng=split_seed(seed, f"agreement/{split}/{metric}")
            )
            rows.append({"split": split, "metric": metric, **result})
    return rows


def agreement_section(rows: Sequence[Mapping[str, Any]], n_max: int | None, level: float) -> str | None:
    if not rows:
        return None
    table = [
        f"| split | pairwise metric | Kendall τ [{round(level * 100)}% CI] | models |",
        "|---|---|---|---|",
    ]
    for r in rows:
        if r["tau"] is None:
            cell = "— (fewer than 3 models, or a constant score)"
        elif r["ci"] is None:
            cell = f"{r['tau']:+.2f}"
        else:
            cell = f"{r['tau']:+.2f} [{r['ci'][0]:+.2f}, {r['ci'][1]:+.2f}]"
        table.append(f"| {r['split']} | {r['metric']} | {cell} | {r['n']} |")
    largest = f"n = {n_max}" if n_max else "the largest n"
    return (
        "## Do the pairwise metrics predict the pick?\n\n"
        "Rank agreement (Kendall's τ-b) across the trained models (each seed's teacher and every method "
        f"on every seed) between each pairwise metric and the best-of-n gold-judge gain at {largest}, "
        "per split; bootstrap interval over models (a model is one method on one seed). τ = 1: the metric "
        "orders the models exactly as the downstream pick; 0: no relation. Evidence about the metrics "
        "(the question RewardBench 2 and PPE ask), with its sample size: a few models leave the "
        "interval wide.\n\n" + "\n".join(table)
    )
