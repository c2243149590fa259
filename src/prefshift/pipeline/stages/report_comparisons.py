"""The report's paired comparisons: each pair of models once, per split and metric, across seeds.

Reads every seed's per-pair margins (data/scores/<model>/seed-<k>/<split>.parquet, written by
train and teacher) for the seeds params list, and compares on the pairs every model of every
seed scored; the math, and why the interval spans seeds and pairs, is in
prefshift.science.comparisons. A seed whose scores are missing for a model leaves that model's
comparisons to the seeds that have it, and the verdict says how many seeds it rests on.

Each unordered pair of models appears once: a method against the teacher, naive and anchor_last,
oriented so that B is the more basic model (teacher, then naive, then anchor_last), so
"anchor_last − naive" and never also "naive − anchor_last". An NTS row is kept only where NTS
differs from accuracy on some seed (equal whenever neither model regresses in distribution, or
both regress alike). The full table goes to reports/comparisons.csv; the summary shows the
answer family (prefshift.pipeline.stages.report_answer) and links the file.

The answer family, corrected together by Holm: every method against naive and against
anchor_last, on every OOD target, in accuracy, from two or more seeds. Its MDE and seeds-needed
use α/m, the level of Holm's first step, so "could have detected" holds for the procedure that
decides. Rows outside it (against the teacher, on the ID split, NTS) keep the uncorrected
per-comparison verdict and MDE at α, and the file says which is which (`holm_family`,
`mde_alpha`).
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from prefshift.config.params import Params, method_order
from prefshift.core.atomic import write_text
from prefshift.core.paths import Layout
from prefshift.science import comparisons as cmp
from prefshift.science import multiplicity, power
from prefshift.science.metrics import ID_SPLIT, split_seed

BASELINES = ("teacher", "naive", "anchor_last")
"""What every method is compared with, most basic first: a pair's B is the more basic of the two."""
ANSWER_BASELINES = ("naive", "anchor_last")
"""The answer section's question: does a method beat naive, or anchor_last, out of distribution?"""
NOT_IN_ANSWER = ("ceiling",)
"""Trained on gold labels: the ceiling is a bound, not a method competing under weak labels."""
TABLE_NAME = "comparisons.csv"
"""The full paired table, beside summary.md (a DVC output of the report stage)."""


def table_path(layout: Layout) -> Path:
    return layout.summary.parent / TABLE_NAME


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


def model_pairs(methods: Sequence[str]) -> list[tuple[str, str]]:
    """(A, B) for every method against every baseline, each unordered pair once, B the more basic."""
    pairs: list[tuple[str, str]] = []
    for a in method_order(methods):
        for b in BASELINES:
            if a == b:
                continue
            if a in BASELINES and BASELINES.index(a) < BASELINES.index(b):
                a_, b_ = b, a
            else:
                a_, b_ = a, b
            if (a_, b_) not in pairs:
                pairs.append((a_, b_))
    return pairs


def compare(params: Params, layout: Layout, methods: Sequence[str]) -> list[dict]:
    """One row per (pair of models, split, metric), over the seeds where both models were scored,
    with the answer family corrected by Holm and seeds-needed for `report.effect_pp`."""
    targets = list(params.data.targets)
    splits = [ID_SPLIT, *targets]
    scores = seed_scores(params, layout, ["teacher", *methods], splits)
    draws, level, base = params.evaluate.bootstrap, params.evaluate.ci, params.seed
    rows = []
    for a, b in model_pairs(methods):
        names = list(dict.fromkeys([a, b, "teacher"]))
        seeds = [k for k, models in scores.items() if all(n in models for n in names)]
        if not seeds:
            continue
        credits = {
            s: cmp.aligned_credits({f"{n}@{k}": scores[k][n][s] for k in seeds for n in names})
            for s in splits
        }
        per_seed = {s: [{n: credits[s][f"{n}@{k}"] for n in names} for k in seeds] for s in splits}
        accuracy = {}
        for split in splits:
            result = cmp.paired_difference(
                [c[a] for c in per_seed[split]],
                [c[b] for c in per_seed[split]],
                draws=draws,
                level=level,
                rng=split_seed(base, split),
            )
            accuracy[split] = result
            rows.append(_row(a, b, split, "acc", result, seeds))
        for target in targets:
            result = cmp.nts_difference(
                per_seed[ID_SPLIT], per_seed[target], a, b, target=target, draws=draws, level=level, seed=base
            )
            if _differs(result, accuracy[target]):
                rows.append(_row(a, b, target, "nts", result, seeds))
    _correct_answer_family(rows, targets, level)
    for row in rows:
        row["effect_pp"] = params.report.effect_pp
        row["seeds_for_effect"] = _seeds_for(row, params.report.effect_pp)
    return rows


def _differs(nts: Mapping[str, Any], acc: Mapping[str, Any]) -> bool:
    """NTS adds a row only where some seed's NTS difference is not its accuracy difference."""
    pairs = zip(nts["seeds"]["per_seed"], acc["seeds"]["per_seed"], strict=True)
    return any(abs(x - y) > 1e-9 for x, y in pairs)


def _seeds_for(row: Mapping[str, Any], effect: float) -> int | None:
    """Seeds that would call `effect` at the α the row's MDE uses (α/m inside the answer family)."""
    if row["seed_variance"] is None:
        return None
    return power.seeds_needed(effect, row["seed_variance"], row["pair_variance"], alpha=row["mde_alpha"])


def in_answer_family(row: Mapping[str, Any], targets: Sequence[str]) -> bool:
    return (
        row["metric"] == "acc"
        and row["split"] in targets
        and row["b"] in ANSWER_BASELINES
        and row["a"] not in NOT_IN_ANSWER
        and row["p"] is not None
    )


def _correct_answer_family(rows: list[dict], targets: Sequence[str], level: float) -> None:
    """Holm over the answer family; its rows' verdicts use the adjusted p, the rest keep their own."""
    family = [r for r in rows if in_answer_family(r, targets)]
    for row, adjusted in zip(family, multiplicity.holm([r["p"] for r in family]), strict=True):
        row["p_holm"] = adjusted
        row["holm_family"] = len(family)
        # What the family could detect: Holm's first step tests at α/m, and with no call made every
        # null had to pass it; later steps are easier, so this MDE is the conservative one.
        row["mde_alpha"] = (1.0 - level) / len(family)
        row["mde"] = power.minimum_detectable_effect(
            row["seed_variance"], row["pair_variance"], row["seeds"]["n"], alpha=row["mde_alpha"]
        )
        what = "NTS" if row["metric"] == "nts" else ""
        row["verdict"] = cmp.verdict(row["a"], row["b"], row["split"], row, what, p_threshold=1.0 - level)
    for row in rows:
        row.setdefault("p_holm", None)
        row.setdefault("holm_family", None)
        row.setdefault("mde_alpha", None if row["mde"] is None else 1.0 - level)


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


def call(row: Mapping[str, Any]) -> str:
    """The verdict's conclusion alone, e.g. "anchor_last better" or "not distinguishable (…)"."""
    return row["verdict"].rsplit(": ", 1)[1]


def _joined(values: Sequence[Any]) -> str:
    return ";".join(f"{v:.4f}" if isinstance(v, float) else str(v) for v in values)


def table_frame(rows: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """The full paired table, one row per pair of models, split and metric (pp unless named)."""
    records = [
        {
            "a": r["a"],
            "b": r["b"],
            "split": r["split"],
            "metric": r["metric"],
            "diff_pp": r["diff"],
            "ci_low": r["ci"][0],
            "ci_high": r["ci"][1],
            "pairs_ci_low": r["pairs_ci"][0],
            "pairs_ci_high": r["pairs_ci"][1],
            "pairs": r["n"],
            "seeds": r["seeds"]["n"],
            "seed_ids": _joined(r["seed_ids"]),
            "per_seed_pp": _joined(r["seeds"]["per_seed"]),
            "sign_agree": r["seeds"]["agree"],
            "seed_variance": r["seed_variance"],
            "pair_variance": r["pair_variance"],
            "se_pp": r["se"],
            "p": r["p"],
            "holm_family": r["holm_family"],
            "p_holm": r["p_holm"],
            "mde_80_pp": r["mde"],
            "mde_alpha": r["mde_alpha"],
            "effect_pp": r["effect_pp"],
            "seeds_for_effect": r["seeds_for_effect"],
            "verdict": call(r),
        }
        for r in rows
    ]
    return pd.DataFrame(records).astype({"holm_family": "Int64", "seeds_for_effect": "Int64"})


def write_table(rows: Sequence[Mapping[str, Any]], path: Path) -> None:
    buffer = io.StringIO()
    table_frame(rows).to_csv(buffer, index=False, lineterminator="\n", float_format="%.4f")
    write_text(path, buffer.getvalue())


def comparisons_section(rows: Sequence[Mapping[str, Any]], level: float) -> str | None:
    """How the paired comparisons are made, and where the full table is; the answer section shows
    the family that answers the report's question."""
    if not rows:
        return None
    pct = f"{round(level * 100)}%"
    nts = sum(r["metric"] == "nts" for r in rows)
    return (
        "## Paired comparisons\n\n"
        "Per-pair difference in correctness between two models on the same pairs, averaged over "
        f"the seeds params list. The {pct} interval spans both noises: mean ± t(S−1)·√(s²/S + v), "
        "with s² the variance of the per-seed differences and v the paired bootstrap variance of the "
        "seed-averaged difference (pairs resampled once per draw for every model of every seed); NTS "
        "differences resample the ID split and the target together. A difference is called only from "
        "two or more seeds, when every seed agrees in sign and the t test on S − 1 degrees of freedom "
        f"rejects at {100 - round(level * 100)}% (Holm-adjusted within the answer family, unadjusted "
        "elsewhere); with one seed the interval is over pairs only and there is no verdict. The MDE is "
        "(t(S−1, 1 − α/2) + t(S−1, 0.8))·√(s²/S + v), docs/metrics.md.\n\n"
        f"Each pair of models appears once ({len(rows)} rows: every split in accuracy, and {nts} NTS "
        "row(s) where NTS differs from accuracy). The full table, with each seed's difference, "
        f"both variances, p, Holm's p, the MDE and the seeds needed, is [{TABLE_NAME}]({TABLE_NAME})."
    )
