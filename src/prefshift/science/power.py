"""What a paired comparison could have detected, and how many seeds a chosen effect would need.

A verdict of "not distinguishable" means nothing until it says how large a difference the
design would have called. The comparison's standard error has two parts (see
prefshift.science.comparisons): the spread of the S per-seed differences, s²/S, and the pair
noise of the seed-averaged difference, v (a paired bootstrap variance):

    SE(S) = √(s²/S + v)

The verdict is a two-sided test at level α with S − 1 degrees of freedom, so the smallest true
difference it calls with probability `power` (80% by convention) is the textbook

    MDE = (t_{1−α/2, S−1} + t_{power, S−1}) · SE(S)

(the test rejects when |estimate| > t_{1−α/2}·SE; an estimate centred on δ exceeds that with
probability `power` when δ − t_{1−α/2}·SE = t_{power}·SE). Student's t rather than the normal
quantiles, because the same t(S−1) makes the verdict's interval: with three seeds the normal
formula would promise effects half the size the test can actually call.

Seeds needed for an effect δ: the smallest S ≥ 2 with MDE(S) ≤ δ, where s² is held at its
measured value and v is held fixed too. Pair noise that all seeds share (which pairs the test
split happens to hold) does not shrink with more seeds; only the seed × pair part would. Holding
v fixed therefore gives a number of seeds that suffices (an upper bound); when v alone exceeds
what δ allows, no number of seeds will do and the answer is "more pairs", stated as None.

Not modelled: the verdict also asks every seed to agree in sign, and Holm's correction lowers
the per-comparison α, both of which raise the effect actually needed; the MDE is the design's
best case at the stated α.
"""

from __future__ import annotations

import math

from scipy import stats

POWER = 0.8
"""The conventional power of an MDE (Cohen): a real effect of that size is called 4 times in 5."""

MAX_SEEDS = 1000
"""Past this, seeds-needed reports None: the answer is then "more pairs", not more seeds."""


def standard_error(seed_variance: float, pair_variance: float, seeds: int) -> float:
    """√(s²/S + v): the comparison's standard error over seeds and pairs (pp)."""
    if seeds < 2:
        raise ValueError("a standard error over seeds needs at least two seeds")
    if seed_variance < 0 or pair_variance < 0:
        raise ValueError(f"variances must be ≥ 0, got s² = {seed_variance}, v = {pair_variance}")
    return math.sqrt(seed_variance / seeds + pair_variance)


def _quantiles(seeds: int, alpha: float, power: float) -> float:
    df = seeds - 1
    return float(stats.t.ppf(1.0 - alpha / 2.0, df) + stats.t.ppf(power, df))


def minimum_detectable_effect(
    seed_variance: float, pair_variance: float, seeds: int, *, alpha: float = 0.05, power: float = POWER
) -> float:
    """(t_{1−α/2, S−1} + t_{power, S−1}) · √(s²/S + v), in the units of the variances' square root."""
    return _quantiles(seeds, alpha, power) * standard_error(seed_variance, pair_variance, seeds)


def seeds_needed(
    effect: float,
    seed_variance: float,
    pair_variance: float,
    *,
    alpha: float = 0.05,
    power: float = POWER,
    max_seeds: int = MAX_SEEDS,
) -> int | None:
    """The smallest S ≥ 2 whose MDE is at most `effect`, pair variance held fixed; None when even
    `max_seeds` seeds would not do (the pair noise alone is too large: more pairs are needed)."""
    if effect <= 0:
        raise ValueError(f"the effect to detect must be > 0, got {effect}")
    for seeds in range(2, max_seeds + 1):
        if minimum_detectable_effect(seed_variance, pair_variance, seeds, alpha=alpha, power=power) <= effect:
            return seeds
    return None


def p_value(diff: float, se: float, seeds: int) -> float:
    """Two-sided p of the verdict's t test: 2 · P(T_{S−1} > |diff| / SE); 1 when there is no spread
    and no difference, 0 when there is no spread but a difference."""
    if se == 0.0:
        return 1.0 if diff == 0.0 else 0.0
    return float(2.0 * stats.t.sf(abs(diff) / se, seeds - 1))
