"""The report's first section: the answer on one screen.

Does any method beat naive, or anchor_last, on an OOD target? One row per (method, baseline,
target) from the answer family of the paired comparisons (report_comparisons): the difference
with its interval over seeds and pairs, the seeds it rests on, the Holm-corrected verdict, the
minimum detectable effect at 80% power, and the seeds a difference of `report.effect_pp` would
need. Below it: every model below chance on some split (a gain over a teacher at 17.8% can leave
a student at 38.5%), and WiSE-FT's α per seed when it ran, since that α is a decided rule.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from prefshift.pipeline.stages.report_comparisons import ANSWER_BASELINES, NOT_IN_ANSWER, call
from prefshift.science.metrics import ID_SPLIT

CHANCE = 50.0
"""Pairwise accuracy of a coin: a reward model below it ranks the split backwards."""


def answer_rows(rows: Sequence[Mapping[str, Any]], targets: Sequence[str]) -> list[Mapping[str, Any]]:
    """Accuracy rows of every method against naive and anchor_last on every OOD target."""
    return [
        r
        for r in rows
        if r["metric"] == "acc"
        and r["split"] in targets
        and r["b"] in ANSWER_BASELINES
        and r["a"] not in NOT_IN_ANSWER
    ]


def below_chance(runs: Mapping[int, Mapping[str, Mapping[str, Any]]]) -> list[tuple[str, str, float, int]]:
    """(model, split, mean accuracy over seeds, seeds) for every model whose mean accuracy on a split
    is below 50%, the teacher included."""
    accs: dict[tuple[str, str], list[float]] = {}
    for docs in runs.values():
        teacher = next(iter(docs.values()))["teacher"]
        for name, doc in {"teacher": teacher, **docs}.items():
            blocks = {ID_SPLIT: doc["id"], **doc["targets"]}
            for split, block in blocks.items():
                accs.setdefault((name, split), []).append(block["acc"])
    return [
        (name, split, sum(values) / len(values), len(values))
        for (name, split), values in accs.items()
        if sum(values) / len(values) < CHANCE
    ]


def _seeds_cell(row: Mapping[str, Any]) -> str:
    if row["mde"] is None or row["mde"] == 0.0:  # one seed, or two models identical on every pair
        return "—"
    return str(row["seeds_for_effect"]) if row["seeds_for_effect"] is not None else "> 1000 (more pairs)"


def _cell(row: Mapping[str, Any]) -> str:
    lo, hi = row["ci"]
    return f"{row['diff']:+.1f} [{lo:+.1f}, {hi:+.1f}]"


def answer_section(
    rows: Sequence[Mapping[str, Any]],
    runs: Mapping[int, Mapping[str, Mapping[str, Any]]],
    targets: Sequence[str],
    *,
    level: float,
    effect: float,
    alphas: Mapping[int, float] | None = None,
) -> str:
    found = answer_rows(rows, targets)
    pct = round(level * 100)
    family = next((r["holm_family"] for r in found if r["holm_family"]), None)
    lines = ["## Answer", ""]
    if found:
        seeds = sorted({k for r in found for k in r["seed_ids"]})
        pairs = sorted({r["n"] for r in found})
        correction = (
            f"family-wise {100 - pct}% over the {family} comparisons below (Holm), every seed agreeing "
            "in sign"
            if family
            else "no verdict from one seed"
        )
        at = f" at the family's α/{family} (Holm's first step)" if family else ""
        lines += [
            f"Does a method beat naive or anchor_last out of distribution? A − B in pp, {pct}% interval over "
            f"seeds and pairs (seeds {', '.join(map(str, seeds))}; {'/'.join(map(str, pairs))} pairs per "
            f"target). Verdict: {correction}. MDE: the smallest difference this design calls with 80% "
            f"power{at}. Seeds for {effect:g} pp: seeds that would call a {effect:g} pp difference (pair "
            "noise held fixed).",
            "",
            f"| A − B | target | A − B [{pct}% CI] | seeds | verdict | MDE | seeds for {effect:g} pp |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in found:
            mde = "—" if r["mde"] is None else f"{r['mde']:.1f}"
            lines.append(
                f"| {r['a']} − {r['b']} | {r['split']} | {_cell(r)} | {r['seeds']['n']} | {call(r)} | {mde} "
                f"| {_seeds_cell(r)} |"
            )
    else:
        lines.append("No method has a comparison against naive or anchor_last (list both in `methods`).")
    flagged = below_chance(runs)
    lines.append("")
    if flagged:
        listing = "; ".join(f"{name} on {split} ({acc:.1f}%)" for name, split, acc, _ in flagged)
        lines.append(
            f"**Below chance** (mean over seeds < {CHANCE:g}%, ranks the split backwards): {listing}."
        )
    else:
        lines.append(f"No model is below chance ({CHANCE:g}%) on any split.")
    if alphas:
        per_seed = ", ".join(f"seed {k}: {a:g}" for k, a in alphas.items())
        lines.append(
            f"WiSE-FT α by the one-standard-error rule on ID validation, decided before results: {per_seed}."
        )
    return "\n".join(lines)
