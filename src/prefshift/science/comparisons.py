"""Paired method comparisons across seeds: is method A better than B on a split, by how much, how sure?

Two methods scored on the same pairs differ per pair in correctness (credit 1, 0.5 or 0),
so one seed's difference in accuracy is the mean of per-pair differences. Two sources of
noise stand between that number and the answer: which pairs the test split holds, and which
seed trained the models (the DESIGN prototype saw ANCHOR's OOD effect change sign between seeds;
the two-cue experiment gave −0.6, −4.4 and +23.4 pp on three). Every seed is evaluated on the
same test pairs (the split is shared), so the spread of the per-seed differences does not
contain the pair-sampling noise, and a pairs-only bootstrap does not contain the seed noise.

The interval therefore adds the two variances (a two-way random-effects view: seeds × pairs):

    centre  = mean over seeds of the per-seed difference
    var     = s² / S  +  v_pairs
    ci      = centre ± t_{S−1} · √var

s² is the sample variance of the S per-seed differences (it also holds the seed × pair
interaction, divided by the pair count); v_pairs is the variance, over bootstrap draws that
resample pairs once and apply the draw to every model of every seed, of the seed-averaged
difference (it holds the pair noise and the interaction again, divided by S·n), so the
interaction is counted twice: conservative by a term that shrinks with the pair count. The
t quantile with S − 1 degrees of freedom (not a normal one) is the price of estimating s² from
three or five seeds, and a seed bootstrap is not used because three seeds give ten distinct
resamples. NTS differences resample the ID split and the target together inside each draw.

A verdict is called only from two or more seeds, when this interval excludes zero and every
seed agrees in sign. Each result also carries the two variances, the standard error, the t test's
p (the interval excludes 0 exactly when p < 1 − level) and the minimum detectable effect at 80%
power (prefshift.science.power), so a null states what the design could have seen, and a family of
verdicts can be corrected for multiplicity (prefshift.science.multiplicity).

With one seed the pairs-only interval is shown and the verdict reads
"one seed: no verdict": sign agreement is trivially true for one seed, and one seed is not
evidence when effects flip sign between seeds.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from prefshift.science import power
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


def _seed_summary(per_seed: Sequence[float]) -> dict[str, Any]:
    """Per-seed differences, their mean and sample std, and how many share the mean's sign."""
    values = np.asarray(list(per_seed), dtype=float)
    mean = float(values.mean())
    return {
        "per_seed": [float(v) for v in values],
        "mean": mean,
        "std": float(values.std(ddof=1)) if values.size > 1 else None,
        "n": int(values.size),
        "agree": int((np.sign(values) == np.sign(mean)).sum()) if mean != 0 else 0,
    }


def seed_level_interval(per_seed: Sequence[float], pair_variance: float, level: float) -> list[float]:
    """mean ± t_{S−1} · √(s²/S + v_pairs): an interval over both seeds and pairs (module docstring)."""
    values = np.asarray(list(per_seed), dtype=float)
    if values.size < 2:
        raise MetricsError("a seed-level interval needs at least two seeds")
    spread = float(values.var(ddof=1)) / values.size + float(pair_variance)
    half = float(stats.t.ppf(0.5 + level / 2.0, df=values.size - 1)) * math.sqrt(spread)
    centre = float(values.mean())
    return [centre - half, centre + half]


def _combine(per_seed: Sequence[float], drawn: np.ndarray, level: float, n: int) -> dict[str, Any]:
    """Point, interval, seed summary and power from per-seed points and draws of the seed-averaged
    difference; with one seed the power fields are None (there is no seed variance to measure)."""
    seeds = _seed_summary(per_seed)
    pair_variance = float(np.var(drawn, ddof=1))
    out = {"diff": seeds["mean"], "pairs_ci": interval(drawn, level), "n": n, "seeds": seeds}
    if seeds["n"] == 1:
        return {
            **out,
            "ci": interval(drawn, level),
            "seed_variance": None,
            "pair_variance": pair_variance,
            "se": None,
            "p": None,
            "mde": None,
        }
    seed_variance = float(np.var(seeds["per_seed"], ddof=1))
    se = power.standard_error(seed_variance, pair_variance, seeds["n"])
    return {
        **out,
        "ci": seed_level_interval(seeds["per_seed"], pair_variance, level),
        "seed_variance": seed_variance,
        "pair_variance": pair_variance,
        "se": se,
        "p": power.p_value(seeds["mean"], se, seeds["n"]),
        "mde": power.minimum_detectable_effect(seed_variance, pair_variance, seeds["n"], alpha=1.0 - level),
    }


def paired_difference(
    a: Sequence[np.ndarray], b: Sequence[np.ndarray], *, draws: int, level: float, rng: np.random.Generator
) -> dict[str, Any]:
    """Accuracy of a minus accuracy of b (pp), one credit array per seed on the same aligned pairs.

    One bootstrap draws pair indices once for every model of every seed, so the draws of the
    seed-averaged difference carry the pair noise; the per-seed points carry the seed noise.
    """
    a = [np.asarray(x, dtype=float) for x in a]
    b = [np.asarray(x, dtype=float) for x in b]
    sizes = {x.shape for x in [*a, *b]}
    if not a or len(a) != len(b) or len(sizes) != 1 or a[0].size == 0:
        raise MetricsError(
            f"paired difference needs equal non-empty credit arrays per seed, got {sorted(sizes)}"
        )
    accs = bootstrap_accuracies([*a, *b], draws, rng)
    drawn = np.mean([accs[k] - accs[len(a) + k] for k in range(len(a))], axis=0)
    per_seed = [(x.mean() - y.mean()) * 100.0 for x, y in zip(a, b, strict=True)]
    return _combine(per_seed, drawn, level, int(a[0].size))


def nts_difference(
    id_credits: Sequence[Mapping[str, np.ndarray]],
    target_credits: Sequence[Mapping[str, np.ndarray]],
    a: str,
    b: str,
    *,
    target: str,
    draws: int,
    level: float,
    seed: int,
) -> dict[str, Any]:
    """NTS of a minus NTS of b on one target (pp), one credits mapping per seed, each also holding
    that seed's `teacher`. The teacher's own NTS is 0 by definition, so against it this is a's NTS."""
    names = [a, b, "teacher"]
    seeds = len(id_credits)
    id_acc = bootstrap_accuracies(
        [c[n] for c in id_credits for n in names], draws, split_seed(seed, ID_SPLIT)
    )
    k_acc = bootstrap_accuracies(
        [c[n] for c in target_credits for n in names], draws, split_seed(seed, target)
    )
    drawn_per_seed, per_seed = [], []
    for k in range(seeds):
        i_a, i_b, i_t = 3 * k, 3 * k + 1, 3 * k + 2
        draw = [(k_acc[i] - k_acc[i_t]) - np.maximum(0.0, id_acc[i_t] - id_acc[i]) for i in (i_a, i_b)]
        drawn_per_seed.append(draw[0] - draw[1])
        point = {n: (target_credits[k][n].mean() * 100.0, id_credits[k][n].mean() * 100.0) for n in names}
        t_k, t_id = point["teacher"]
        per_seed.append(nts(point[a][0] - t_k, point[a][1], t_id) - nts(point[b][0] - t_k, point[b][1], t_id))
    return _combine(per_seed, np.mean(drawn_per_seed, axis=0), level, int(target_credits[0][a].size))


def distinguishable(result: Mapping[str, Any], p_threshold: float | None = None) -> bool:
    """Two or more seeds, every seed agreeing in sign, and an interval that excludes 0, or, within
    a corrected family, a Holm-adjusted p (`result["p_holm"]`) at most `p_threshold`."""
    seeds = result["seeds"]
    if seeds["n"] < 2 or seeds["agree"] != seeds["n"]:
        return False
    if p_threshold is not None and result.get("p_holm") is not None:
        return result["p_holm"] <= p_threshold
    lo, hi = result["ci"]
    return lo > 0 or hi < 0


def null_reading(result: Mapping[str, Any]) -> str:
    """A null with what the design could have seen: "not distinguishable (could have detected ≥ X pp)"."""
    mde = result.get("mde")
    if mde == 0.0:  # no seed and no pair variance: the two models agree on every pair of every seed
        return "not distinguishable (identical on every pair and seed)"
    return "not distinguishable" + ("" if mde is None else f" (could have detected ≥ {mde:.1f} pp)")


def _pp(value: float) -> str:
    return f"{round(value, 1) + 0.0:+.1f}".replace("-", "−")


def verdict(
    a: str, b: str, split: str, result: Mapping[str, Any], what: str = "", p_threshold: float | None = None
) -> str:
    """One line that states its seeds, e.g. "anchor_last vs naive on X: +1.2 pp [−0.4, +2.9],
    3 seeds, 2/3 agree: not distinguishable (could have detected ≥ 4.1 pp)"."""
    lo, hi = result["ci"]
    seeds = result["seeds"]
    label = f" ({what})" if what else ""
    head = f"{a} vs {b} on {split}{label}: {_pp(result['diff'])} pp [{_pp(lo)}, {_pp(hi)}]"
    if seeds["n"] < 2:
        return f"{head} (pairs only), one seed: no verdict"
    if distinguishable(result, p_threshold):
        call = f"{a} {'better' if result['diff'] > 0 else 'worse'}"
    else:
        call = null_reading(result)
    return f"{head}, {seeds['n']} seeds, {seeds['agree']}/{seeds['n']} agree: {call}"
