"""Paired method comparisons against hand-computed bootstraps and seed-level intervals, and verdict lines."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from prefshift.science import comparisons as cmp


def test_paired_interval_matches_a_hand_computed_bootstrap():
    a = np.array([1.0, 0.0, 1.0, 0.5])  # credits: right, wrong, right, tie
    b = np.array([0.0, 0.0, 1.0, 1.0])
    # Per-pair difference d = [1, 0, 0, -0.5]: point = mean(d) = 12.5 pp.
    # default_rng(0).integers(0, 4, (3, 4)) draws the pair indices [3 2 2 1], [1 0 0 0], [0 3 2 3]:
    # d means -0.125, 0.75, 0 → sorted -12.5, 0, 75 pp. numpy's linear percentiles of 3 values:
    # 2.5th at position 0.05 → -12.5 + 0.05·12.5 = -11.875; 97.5th at 1.95 → 0 + 0.95·75 = 71.25.
    result = cmp.paired_difference([a], [b], draws=3, level=0.95, rng=np.random.default_rng(0))
    assert result["diff"] == pytest.approx(12.5)
    assert result["ci"] == pytest.approx([-11.875, 71.25])  # one seed: the pairs interval
    assert result["n"] == 4 and result["seeds"]["n"] == 1


T_TABLE_975 = {1: 12.706, 2: 4.303}
"""Student's t, 97.5th percentile, by degrees of freedom, from a printed table (3 decimals)."""


def test_seed_level_interval_matches_the_formula_by_hand():
    # Seeds' differences 1, 2, 3 pp: mean 2, s² = 1; pair variance 0.25.
    # var = 1/3 + 0.25 = 0.58333, √ = 0.76376; half-width = t(2) · 0.76376 = 4.303 · 0.76376 = 3.2865.
    lo, hi = cmp.seed_level_interval([1.0, 2.0, 3.0], 0.25, 0.95)
    assert (lo, hi) == pytest.approx((2 - 3.2865, 2 + 3.2865), rel=1e-3)
    with pytest.raises(cmp.MetricsError, match="two seeds"):
        cmp.seed_level_interval([1.0], 0.25, 0.95)


def test_paired_difference_across_two_seeds_by_hand():
    a = [np.array([1.0, 0.0, 1.0, 0.5]), np.array([1.0, 1.0, 0.0, 0.0])]
    b = [np.array([0.0, 0.0, 1.0, 1.0]), np.array([0.0, 1.0, 0.0, 0.0])]
    # Per-seed differences: seed 0 d = [1, 0, 0, -0.5] → 12.5 pp; seed 1 d = [1, 0, 0, 0] → 25 pp.
    # Mean 18.75; s² = (6.25² + 6.25²) / 1 = 78.125, so s²/S = 39.0625.
    # The seed-averaged per-pair difference is [1, 0, 0, -0.25]; the draws [3 2 2 1], [1 0 0 0],
    # [0 3 2 3] (default_rng(0), one index set for every model of every seed) give -6.25, 75, 12.5 pp:
    # mean 27.0833, sample variance ((-33.3333)² + 47.9167² + (-14.5833)²) / 2 = 1809.896.
    # var = 39.0625 + 1809.896 = 1848.958, √ = 43.0000; half-width = t(1) · 43.0 = 12.706 · 43.0 = 546.36.
    result = cmp.paired_difference(a, b, draws=3, level=0.95, rng=np.random.default_rng(0))
    assert result["diff"] == pytest.approx(18.75)
    assert result["seeds"]["per_seed"] == pytest.approx([12.5, 25.0])
    assert result["ci"] == pytest.approx([18.75 - 546.36, 18.75 + 546.36], rel=1e-3)
    assert result["pairs_ci"] == pytest.approx([-6.25 + 0.05 * 18.75, 12.5 + 0.95 * 62.5])
    # What the design could detect: the same SE, 43.0; MDE = (t(1, 0.975) + t(1, 0.8)) · 43.0 =
    # (12.706 + 1.3764) · 43.0 = 605.5 pp. p: t = 18.75 / 43.0 = 0.43605 on 1 df (Cauchy),
    # P(T > t) = 0.5 − arctan(0.43605)/π = 0.5 − 0.13099 = 0.36901, two-sided 0.7380.
    assert result["seed_variance"] == pytest.approx(78.125)
    assert result["pair_variance"] == pytest.approx(1809.896, rel=1e-5)
    assert result["se"] == pytest.approx(43.0, rel=1e-4)
    assert result["mde"] == pytest.approx(605.5, rel=1e-3)
    assert result["p"] == pytest.approx(0.7380, abs=1e-3)
    one = cmp.paired_difference(a[:1], b[:1], draws=3, level=0.95, rng=np.random.default_rng(0))
    assert one["mde"] is None and one["p"] is None and one["seed_variance"] is None


def test_nts_difference_point_and_teacher_baseline():
    ident = {"teacher": np.array([1.0, 1.0, 0.0, 0.0])}  # teacher ID acc 50
    ident |= {"a": np.array([1.0, 0.0, 0.0, 0.0]), "b": np.array([1.0, 1.0, 1.0, 0.0])}  # 25, 75
    target = {"teacher": np.array([1.0, 0.0, 0.0, 0.0])}  # 25
    target |= {"a": np.array([1.0, 1.0, 1.0, 0.0]), "b": np.array([1.0, 1.0, 0.0, 0.0])}  # 75, 50
    # NTS_a = (75 - 25) - max(0, 50 - 25) = 25; NTS_b = (50 - 25) - 0 = 25.
    same = cmp.nts_difference([ident], [target], "a", "b", target="x", draws=50, level=0.95, seed=0)
    assert same["diff"] == pytest.approx(0.0)
    vs_teacher = cmp.nts_difference(
        [ident], [target], "a", "teacher", target="x", draws=50, level=0.95, seed=0
    )
    assert vs_teacher["diff"] == pytest.approx(25.0)
    itself = cmp.nts_difference([ident], [target], "a", "a", target="x", draws=50, level=0.95, seed=0)
    assert itself["ci"] == [0.0, 0.0]
    # A second seed where b's target accuracy drops to 25: NTS_b = 0 there, so a − b = 25 in seed 1.
    second = {**target, "b": np.array([1.0, 0.0, 0.0, 0.0])}
    two = cmp.nts_difference(
        [ident, ident], [target, second], "a", "b", target="x", draws=50, level=0.95, seed=0
    )
    assert two["seeds"]["per_seed"] == pytest.approx([0.0, 25.0]) and two["diff"] == pytest.approx(12.5)


def test_aligned_credits_use_only_pairs_every_model_scored():
    frames = {
        "a": pd.DataFrame({"pair_id": ["p1", "p2", "p3"], "delta": [1.0, -1.0, 0.0]}),
        "b": pd.DataFrame({"pair_id": ["p3", "p1"], "delta": [2.0, -2.0]}),
    }
    credits = cmp.aligned_credits(frames)
    assert credits["a"].tolist() == [1.0, 0.5] and credits["b"].tolist() == [0.0, 1.0]


def _result(per_seed, ci):
    seeds = cmp._seed_summary(per_seed)
    return {"diff": seeds["mean"], "ci": ci, "seeds": seeds}


def test_verdicts_state_their_seeds_and_never_call_one_seed():
    line = cmp.verdict("anchor_last", "naive", "X", _result([1.0, -0.5, 2.0], [-0.4, 2.9]))
    assert line == "anchor_last vs naive on X: +0.8 pp [−0.4, +2.9], 3 seeds, 2/3 agree: not distinguishable"
    # A null with its power says what it could have seen.
    powered = {**_result([1.0, -0.5, 2.0], [-0.4, 2.9]), "mde": 4.06}
    assert cmp.verdict("anchor_last", "naive", "X", powered).endswith(
        "not distinguishable (could have detected ≥ 4.1 pp)"
    )
    # Two models equal on every pair of every seed have nothing to detect.
    same = {**_result([0.0, 0.0], [0.0, 0.0]), "mde": 0.0}
    assert cmp.verdict("a", "b", "X", same).endswith("not distinguishable (identical on every pair and seed)")
    # Inside a Holm family the adjusted p decides: a clear interval is not a call at p_holm 0.2.
    holm = {**_result([2.0, 4.0], [1.0, 5.0]), "p_holm": 0.2}
    assert cmp.verdict("a", "b", "X", holm, p_threshold=0.05).endswith("not distinguishable")
    assert cmp.verdict("a", "b", "X", {**holm, "p_holm": 0.01}, p_threshold=0.05).endswith("a better")
    # An interval clear of 0 is still not a finding when a seed disagrees in sign ...
    assert cmp.verdict("a", "b", "X", _result([4.0, -0.5, 5.5], [1.0, 5.0])).endswith("not distinguishable")
    # ... it is when two or more seeds all agree ...
    assert cmp.verdict("a", "b", "X", _result([2.0, 4.0], [1.0, 5.0])).endswith(
        "2 seeds, 2/2 agree: a better"
    )
    assert cmp.verdict("a", "b", "X", _result([-2.0, -4.0], [-5.0, -1.0])).endswith("2/2 agree: a worse")
    # ... and never from one seed, however far its pairs interval is from 0.
    for ci in ([1.0, 5.0], [-5.0, -1.0], [-1.0, 1.0]):
        one = cmp.verdict("a", "b", "X", _result([3.0 if ci[0] > 0 else -3.0], ci))
        assert one.endswith("(pairs only), one seed: no verdict"), one
        assert not cmp.distinguishable(_result([3.0], ci))
