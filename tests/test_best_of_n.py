"""The best-of-n estimator against hand-computed cases and brute-force enumeration of subsets."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from prefshift.config.params import SyntheticConfig
from prefshift.data.synthetic import generate_pairs, rule_score
from prefshift.science import best_of_n
from prefshift.science.metrics import MetricsError


def test_pick_weights_are_the_chance_each_rank_is_the_subset_maximum():
    # N = 4, n = 2: C(4,2) = 6 subsets; rank 1 tops the 3 holding it, rank 2 the 2 {2,3},{2,4}, rank 3 one.
    assert best_of_n.pick_weights(4, 2) == pytest.approx([3 / 6, 2 / 6, 1 / 6, 0.0])
    assert best_of_n.pick_weights(4, 1) == pytest.approx([0.25] * 4)
    assert best_of_n.pick_weights(4, 4) == pytest.approx([1.0, 0.0, 0.0, 0.0])
    with pytest.raises(MetricsError):
        best_of_n.pick_weights(3, 4)


def test_expected_pick_hand_computed():
    proxy, gold = [0.9, 0.1, 0.5, 0.3], [1.0, 4.0, 2.0, 3.0]
    # The six 2-subsets and the proxy's pick (gold): {0,1}→0 (1), {0,2}→0 (1), {0,3}→0 (1),
    # {1,2}→2 (2), {1,3}→3 (3), {2,3}→2 (2): mean 10/6. This proxy ranks gold backwards.
    assert best_of_n.expected_pick(proxy, gold, 2) == pytest.approx(10 / 6)
    assert best_of_n.expected_pick(proxy, gold, 1) == pytest.approx(2.5)
    assert best_of_n.expected_pick(proxy, gold, 4) == pytest.approx(1.0)


def test_proxy_ties_are_broken_uniformly():
    # Samples 0 and 1 tie on the proxy: a pick between them is worth (0 + 3) / 2.
    # 2-subsets: {0,1}→1.5, {0,2}→0, {1,2}→3: mean 1.5.
    proxy, gold = [1.0, 1.0, 0.0], [0.0, 3.0, 6.0]
    assert best_of_n.expected_pick(proxy, gold, 2) == pytest.approx(1.5)
    assert best_of_n.expected_pick(proxy, gold, 3) == pytest.approx(1.5)


def test_expected_pick_equals_enumerating_every_subset():
    rng = np.random.default_rng(3)
    proxy, gold = rng.integers(0, 4, 7).astype(float), rng.normal(size=7)  # integer proxy: many ties
    for n in range(1, 8):
        picks = []
        for subset in itertools.combinations(range(7), n):
            best = max(proxy[i] for i in subset)
            picks.append(np.mean([gold[i] for i in subset if proxy[i] == best]))
        assert best_of_n.expected_pick(proxy, gold, n) == pytest.approx(np.mean(picks))


def test_grid_kl_and_curve_gains():
    assert best_of_n.n_grid(16) == [1, 2, 4, 8, 16]
    assert best_of_n.n_grid(12) == [1, 2, 4, 8, 12]
    assert best_of_n.kl_best_of_n(1) == 0.0
    assert best_of_n.kl_best_of_n(4) == pytest.approx(math.log(4) - 0.75)
    proxy = np.array([[0.9, 0.1, 0.5, 0.3], [0.0, 1.0, 2.0, 3.0]])
    gold = np.array([[1.0, 4.0, 2.0, 3.0], [0.0, 1.0, 2.0, 3.0]])
    result = best_of_n.curve(proxy, gold, [1, 2, 4])
    # Prompt 1 as above (2.5, 10/6, 1); prompt 2's proxy is the gold: 1.5, (3·3 + 2·2 + 1·1)/6, 3.
    assert result["gold"] == pytest.approx([2.0, (10 / 6 + 14 / 6) / 2, 2.0])
    assert result["proxy"][0] == pytest.approx((0.45 + 1.5) / 2)
    assert result["proxy"][-1] == pytest.approx((0.9 + 3.0) / 2)
    gains = best_of_n.gains(result)
    assert gains["gold_gain"] == pytest.approx(0.0)
    assert gains["gap"] == pytest.approx(gains["proxy_gain"])


def test_synthetic_rule_judges_generated_text_like_the_suite_labels_it():
    cfg = SyntheticConfig(train_pairs=10, test_pairs=40)
    for row in generate_pairs("syn_help_instruct", "test", cfg, role="clean"):
        assert rule_score("helpful", row["meta"], row["chosen"]) >= 0.8
        assert rule_score("helpful", row["meta"], row["rejected"]) == 0.0
    harmful = [r for r in generate_pairs("syn_harm_chat", "test", cfg, role="clean") if r["meta"]["harmful"]]
    assert harmful
    for row in harmful:
        assert rule_score("harmless", row["meta"], row["chosen"]) >= 0.7
        assert rule_score("harmless", row["meta"], row["rejected"]) <= 0.2
    assert rule_score("helpful", {"source_row": 3}, "anything") is None
