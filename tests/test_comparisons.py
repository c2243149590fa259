"""Paired method comparisons against a hand-computed bootstrap, seed agreement and verdict lines."""

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
    result = cmp.paired_difference(a, b, draws=3, level=0.95, rng=np.random.default_rng(0))
    assert result["diff"] == pytest.approx(12.5)
    assert result["ci"] == pytest.approx([-11.875, 71.25])
    assert result["n"] == 4


def test_nts_difference_point_and_teacher_baseline():
    ident = {"teacher": np.array([1.0, 1.0, 0.0, 0.0])}  # teacher ID acc 50
    ident |= {"a": np.array([1.0, 0.0, 0.0, 0.0]), "b": np.array([1.0, 1.0, 1.0, 0.0])}  # 25, 75
    target = {"teacher": np.array([1.0, 0.0, 0.0, 0.0])}  # 25
    target |= {"a": np.array([1.0, 1.0, 1.0, 0.0]), "b": np.array([1.0, 1.0, 0.0, 0.0])}  # 75, 50
    # NTS_a = (75 - 25) - max(0, 50 - 25) = 25; NTS_b = (50 - 25) - 0 = 25.
    same = cmp.nts_difference(ident, target, "a", "b", target="x", draws=50, level=0.95, seed=0)
    assert same["diff"] == pytest.approx(0.0)
    vs_teacher = cmp.nts_difference(ident, target, "a", "teacher", target="x", draws=50, level=0.95, seed=0)
    assert vs_teacher["diff"] == pytest.approx(25.0)
    itself = cmp.nts_difference(ident, target, "a", "a", target="x", draws=50, level=0.95, seed=0)
    assert itself["ci"] == [0.0, 0.0]


def test_aligned_credits_use_only_pairs_every_model_scored():
    frames = {
        "a": pd.DataFrame({"pair_id": ["p1", "p2", "p3"], "delta": [1.0, -1.0, 0.0]}),
        "b": pd.DataFrame({"pair_id": ["p3", "p1"], "delta": [2.0, -2.0]}),
    }
    credits = cmp.aligned_credits(frames)
    assert credits["a"].tolist() == [1.0, 0.5] and credits["b"].tolist() == [0.0, 1.0]


def test_seed_agreement_and_verdicts():
    seeds = cmp.seed_agreement([1.0, -0.5, 2.0])
    assert seeds["mean"] == pytest.approx(2.5 / 3)
    assert seeds["std"] == pytest.approx(np.std([1.0, -0.5, 2.0], ddof=1))
    assert (seeds["n"], seeds["agree"]) == (3, 2)
    line = cmp.verdict("anchor_last", "naive", "X", {"diff": 1.2, "ci": [-0.4, 2.9]}, seeds)
    assert line == "anchor_last vs naive on X: +1.2 pp [−0.4, +2.9], 2/3 seeds agree: not distinguishable"
    # An interval clear of 0 is still not a finding when a seed disagrees in sign ...
    assert cmp.verdict("a", "b", "X", {"diff": 3.0, "ci": [1.0, 5.0]}, seeds).endswith("not distinguishable")
    # ... but is when every seed agrees, or only one seed ran.
    agree = cmp.seed_agreement([2.0, 3.0])
    assert cmp.verdict("a", "b", "X", {"diff": 3.0, "ci": [1.0, 5.0]}, agree).endswith(
        "2/2 seeds agree: a better"
    )
    assert cmp.verdict("a", "b", "X", {"diff": -3.0, "ci": [-5.0, -1.0]}, None).endswith("1 seed: a worse")
