"""The report's paired comparisons: each method against naive, anchor_last and the teacher, per split.

Reads every seed's per-pair margins (data/scores/<model>/seed-<k>/<split>.parquet, written by
train and teacher) for the seeds params list, and compares on the pairs every model of every
seed scored; the math, and why the interval spans seeds and pairs, is in
prefshift.science.comparisons. A seed whose scores are missing for a model leaves that model's
comparisons to the seeds that have it, and the verdict says how many seeds it rests on.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from prefshift.config.params import Params, method_order
from prefshift.core.paths import Layout
from prefshift.science import comparisons as cmp
from prefshift.science.metrics import ID_SPLIT, split_seed

BASELINES = ("naive", "anchor_last", "teacher")


def _scores(layout: Layout, model: str, splits: Sequence[str]) -> dict[str, pd.DataFrame] | None:
    paths = {s: layout.scores(model, s) for s in splits}
    if not all(p.exists() for p in paths.values()):
        return None
    return {s: pd.read_parquet(p, columns=["pair_id", "delta"]) for s, p in paths.items()}


def seed_scores(params: Params, layout: Layout, models: Sequence[str], splits: Sequence[str]) -> dict:
    """seed → model → split → scores frame, for every listed seed and model whose files exist."""
    found: dict[int, dict[str, dict[str, pd.DataFrame]]] = {}
    for seed in params.seeds:
        seeded = layout.for_seed(seed)
        found[seed] = {m: s for m in models if (s := _scores(seeded, m, splits)) is not None}
    return found


def compare(params: Params, layout: Layout, methods: Sequence[str]) -> list[dict]:
    """One row per (method, baseline, split, metric), over the seeds where both models were scored."""
    targets = list(params.data.targets)
    splits = [ID_SPLIT, *targets]
    scores = seed_scores(params, layout, ["teacher", *methods], splits)
    draws, level, base = params.evaluate.bootstrap, params.evaluate.ci, params.seed
    rows = []
    for a in method_order(methods):
        for b in BASELINES:
            names = list(dict.fromkeys([a, b, "teacher"]))
            seeds = [k for k, models in scores.items() if all(n in models for n in names)]
            if a == b or not seeds:
                continue
            credits = {
                s: [cmp.aligned_credits({f"{n}@{k}": scores[k][n][s] for k in seeds for n in names})]
                for s in splits
            }
            per_seed = {s: [{n: credits[s][0][f"{n}@{k}"] for n in names} for k in seeds] for s in splits}
            for split in splits:
                result = cmp.paired_difference(
                    [c[a] for c in per_seed[split]],
                    [c[b] for c in per_seed[split]],
                    draws=draws,
                    level=level,
                    rng=split_seed(base, split),
                )
                rows.append(_row(a, b, split, "acc", result, seeds))
            for target in targets:
                result = cmp.nts_difference(
                    per_seed[ID_SPLIT],
                    per_seed[target],
                    a,
                    b,
                    target=target,
                    draws=draws,
                    level=level,
                    seed=base,
                )
                rows.append(_row(a, b, target, "nts", result, seeds))
    return rows


def _row(a: str, b: str, split: str, metric: str, result: Mapping, seeds: Sequence[int]) -> dict[str, Any]:
    return {
        "a": a,
        "b": b,
        "split": split,
        "metric": metric,
        **result,
        "seed_ids": list(seeds),
        "verdict": cmp.verdict(a, b, split, result, "NTS" if metric == "nts" else ""),
    }


def _seed_cells(seeds: Mapping[str, Any]) -> list[str]:
    if seeds["n"] < 2:
        return [f"{seeds['mean']:+.1f} (one seed)", "—"]
    return [f"{seeds['mean']:+.1f} ± {seeds['std']:.1f} (n={seeds['n']})", f"{seeds['agree']}/{seeds['n']}"]


def comparisons_section(rows: Sequence[Mapping[str, Any]]) -> str | None:
    if not rows:
        return None
    level = "95%"
    table = [
        "| A | B | split | metric | A − B (pp) [95% CI, seeds × pairs] | per seed mean ± std | sign agree "
        "| verdict |",
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
        "Per-pair difference in correctness between two models on the same pairs, averaged over "
        f"the seeds params list. The {level} interval spans both noises: mean ± t(S−1)·√(s²/S + v), "
        "with s² the variance of the per-seed differences and v the paired bootstrap variance of the "
        "seed-averaged difference (pairs resampled once per draw for every model of every seed); NTS "
        "differences resample the ID split and the target together. A difference is called only from "
        "two or more seeds, when that interval excludes 0 and every seed agrees in sign; with one seed "
        "the interval is over pairs only and there is no verdict.\n\n"
        + "\n".join(table)
        + "\n\nVerdicts per target:\n\n"
        + "\n".join(verdicts)
    )
