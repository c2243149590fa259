"""Minimum detectable effect, seeds needed, the verdict's p-value, Holm's correction and Kendall's τ,
each against numbers worked by hand from printed t tables."""

from __future__ import annotations

import math

import numpy as np
import pytest

from prefshift.science import agreement, multiplicity, power

T_975 = {1: 12.706, 4: 2.7764, 6: 2.4469, 7: 2.3646}
T_80 = {1: 1.3764, 4: 0.9410, 6: 0.9057, 7: 0.8960}
"""Student's t, 97.5th and 80th percentiles by degrees of freedom, from a printed table."""


def test_mde_is_the_two_t_quantiles_times_the_standard_error_over_seeds_and_pairs():
    # Five seeds, seed variance s² = 4 pp², pair variance v = 0.25 pp²:
    # SE = √(4/5 + 0.25) = √1.05 = 1.024695; (t₄(0.975) + t₄(0.8)) = 2.7764 + 0.9410 = 3.7174;
    # MDE = 3.7174 · 1.024695 = 3.8092 pp.
    assert power.standard_error(4.0, 0.25, 5) == pytest.approx(math.sqrt(1.05))
    assert power.minimum_detectable_effect(4.0, 0.25, 5) == pytest.approx(3.8092, abs=1e-3)
    assert (T_975[4] + T_80[4]) * math.sqrt(1.05) == pytest.approx(3.8092, abs=1e-3)
    # Two seeds: (12.706 + 1.3764) · √(4/2 + 0.25) = 14.0824 · 1.5 = 21.124 pp.
    assert power.minimum_detectable_effect(4.0, 0.25, 2) == pytest.approx(21.124, abs=1e-2)
    with pytest.raises(ValueError, match="two seeds"):
        power.minimum_detectable_effect(4.0, 0.25, 1)


def test_seeds_needed_is_the_first_seed_count_whose_mde_reaches_the_effect():
    # s² = 1, v = 0.25, effect 2 pp. Seven seeds: (2.4469 + 0.9057) · √(1/7 + 0.25) = 3.3526 ·
    # 0.626783 = 2.1014 > 2. Eight: (2.3646 + 0.8960) · √(1/8 + 0.25) = 3.2606 · 0.612372 = 1.9967 ≤ 2.
    assert (T_975[6] + T_80[6]) * math.sqrt(1 / 7 + 0.25) > 2.0
    assert (T_975[7] + T_80[7]) * math.sqrt(1 / 8 + 0.25) <= 2.0
    assert power.seeds_needed(2.0, 1.0, 0.25) == 8
    # No seed noise and little pair noise: two seeds suffice.
    assert power.seeds_needed(2.0, 0.0, 0.01) == 2
    # Pair noise alone of SE 2 pp: even infinitely many seeds leave MDE ≥ 2.8 · 2 > 2 pp.
    assert power.seeds_needed(2.0, 1.0, 4.0) is None
    with pytest.raises(ValueError, match="> 0"):
        power.seeds_needed(0.0, 1.0, 0.25)


def test_p_value_is_the_two_sided_t_test_of_the_verdict():
    # diff 2, SE 1, five seeds: t = 2 on 4 df, two-sided p = 0.1161 (t table: P(T₄ > 2) = 0.0581).
    assert power.p_value(2.0, 1.0, 5) == pytest.approx(0.1161, abs=1e-4)
    assert power.p_value(0.0, 0.0, 5) == 1.0 and power.p_value(1.0, 0.0, 5) == 0.0


def test_holm_against_a_worked_example():
    # p = 0.01, 0.04, 0.03, 0.005 (m = 4). Sorted: 0.005·4 = 0.02; 0.01·3 = 0.03; 0.03·2 = 0.06;
    # 0.04·1 = 0.04, raised to the running maximum 0.06. Back in input order: 0.03, 0.06, 0.06, 0.02.
    adjusted = multiplicity.holm([0.01, 0.04, 0.03, 0.005])
    assert adjusted == pytest.approx([0.03, 0.06, 0.06, 0.02])
    # At α = 0.05 two of four survive, where uncorrected tests would call all four.
    assert sum(p <= 0.05 for p in adjusted) == 2
    # 0.5·2 = 1.0; 0.9·1 = 0.9 is raised to the running maximum 1.0.
    assert multiplicity.holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])
    assert multiplicity.holm([]) == []
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        multiplicity.holm([0.5, 1.2])


def test_kendall_tau_of_one_swapped_pair_and_its_interval():
    # Ranks 1 2 3 4 against 1 3 2 4: of 6 pairs, only (2, 3) is discordant: τ = (5 − 1) / 6 = 0.6667.
    result = agreement.kendall_tau(
        [1, 2, 3, 4], [1, 3, 2, 4], draws=200, level=0.95, rng=np.random.default_rng(0)
    )
    assert result["tau"] == pytest.approx(4 / 6) and result["n"] == 4
    lo, hi = result["ci"]
    assert -1.0 <= lo <= hi <= 1.0 and hi == pytest.approx(1.0)
    # A constant score has no ranking; two models are too few.
    flat = agreement.kendall_tau([1, 1, 1], [1, 2, 3], draws=10, level=0.95, rng=np.random.default_rng(0))
    assert flat == {"tau": None, "ci": None, "n": 3}
    two = agreement.kendall_tau([1, 2], [2, 1], draws=10, level=0.95, rng=np.random.default_rng(0))
    assert two["tau"] is None
