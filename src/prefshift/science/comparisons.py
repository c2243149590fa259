"""Paired method comparisons: is method A better than B on a split, by how much, and how sure?

Two methods scored on the same pairs differ per pair in correctness (credit 1, 0.5 or 0),
so the difference in accuracy is the mean of per-pair differences and its interval comes
from one bootstrap that resamples pairs once and applies the draw to both (as
metrics.paired_metrics does, with the same per-split generators). NTS combines the ID split and
a target: both are resampled, independently, inside each draw. Seeds are a second,
coarser check: the DESIGN prototype saw ANCHOR's OOD effect change sign between seeds, so
a verdict calls a difference distinguishable only when its interval excludes zero and
every seed that ran agrees in sign.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from prefshift.science.metrics import (
    ID_SPLIT,
    MetricsError,
    bootstrap_accuracies,
    credit,
    interval,
    nts,
    split_seed,
)


def aligned_credits(frames: Mapping[str, pd.DataFrame]) -> dict[str, np.ndarray]:
    """Per-pair credit of each model on the pairs all of them scored, in one pair order."""
    common = set.intersection(*(set(f["pair_id"]) for f in frames.values()))
    if not common:
        raise MetricsError(f"{', '.join(frames)} share no scored pair (different split versions?)")
    order = sorted(common)
    return {
        name: credit(frame.set_index("pair_id")["delta"].reindex(order).to_numpy(dtype=float))
        for name, frame in frames.items()
    }


def paired_difference(
    a: np.ndarray, b: np.ndarray, *, draws: int, level: float, rng: np.random.Generator
) -> dict[str, Any]:
    """Accuracy of a minus accuracy of b (pp) on aligned credits, with a paired bootstrap interval."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.shape != b.shape or a.size == 0:
        raise MetricsError(
            f"paired difference needs equal non-empty credit arrays, got {a.shape} and {b.shape}"
        )
    acc_a, acc_b = bootstrap_accuracies([a, b], draws, rng)
    return {
        "diff": float((a.mean() - b.mean()) * 100.0),
        "ci": interval(acc_a - acc_b, level),
        "n": int(a.size),
    }


def nts_difference(
    id_credits: Mapping[str, np.ndarray],
    target_credits: Mapping[str, np.ndarray],
    a: str,
    b: str,
    *,
    target: str,
    draws: int,
    level: float,
    seed: int,
) -> dict[str, Any]:
    """NTS of a minus NTS of b on one target (pp); each credits mapping also holds `teacher`.

    The teacher's own NTS is 0 by definition, so against the teacher this is a's NTS.
    """
    names = [a, b, "teacher"]
    id_acc = bootstrap_accuracies([id_credits[n] for n in names], draws, split_seed(seed, ID_SPLIT))
    k_acc = bootstrap_accuracies([target_credits[n] for n in names], draws, split_seed(seed, target))
    drawn = [(k_acc[i] - k_acc[2]) - np.maximum(0.0, id_acc[2] - id_acc[i]) for i in (0, 1)]
    point = {n: (target_credits[n].mean() * 100.0, id_credits[n].mean() * 100.0) for n in names}
    t_k, t_id = point["teacher"]
    diff = nts(point[a][0] - t_k, point[a][1], t_id) - nts(point[b][0] - t_k, point[b][1], t_id)
    return {"diff": float(diff), "ci": interval(drawn[0] - drawn[1], level), "n": int(target_credits[a].size)}


def seed_agreement(diffs: Sequence[float]) -> dict[str, Any]:
    """Mean and sample std of per-seed differences, and how many seeds share the mean's sign."""
    values = np.asarray(list(diffs), dtype=float)
    if values.size == 0:
        raise MetricsError("no per-seed differences to aggregate")
    mean = float(values.mean())
    agree = int((np.sign(values) == np.sign(mean)).sum()) if mean != 0 else 0
    return {
        "mean": mean,
        "std": float(values.std(ddof=1)) if values.size > 1 else None,
        "n": int(values.size),
        "agree": agree,
    }


def distinguishable(ci: Sequence[float], seeds: Mapping[str, Any] | None) -> bool:
    """The interval excludes 0 and, when several seeds ran, all of them agree in sign."""
    excludes_zero = ci[0] > 0 or ci[1] < 0
    if seeds is None or seeds["n"] < 2:
        return excludes_zero
    return excludes_zero and seeds["agree"] == seeds["n"]


def _pp(value: float) -> str:
    return f"{round(value, 1) + 0.0:+.1f}".replace("-", "−")


def verdict(
    a: str, b: str, split: str, result: Mapping[str, Any], seeds: Mapping[str, Any] | None, what: str = ""
) -> str:
    """One line, e.g. "anchor_last vs naive on X: +1.2 pp [−0.4, +2.9], 2/3 seeds: not distinguishable"."""
    lo, hi = result["ci"]
    seed_part = "1 seed" if seeds is None or seeds["n"] < 2 else f"{seeds['agree']}/{seeds['n']} seeds agree"
    if distinguishable(result["ci"], seeds):
        call = f"{a} {'better' if result['diff'] > 0 else 'worse'}"
    else:
        call = "not distinguishable"
    label = f" ({what})" if what else ""
    return (
        f"{a} vs {b} on {split}{label}: {_pp(result['diff'])} pp [{_pp(lo)}, {_pp(hi)}], {seed_part}: {call}"
    )
