"""Objectives on hand-computed tiny tensors (DESIGN §5)."""

from __future__ import annotations

import math

import pytest
import torch

from prefshift.config.params import ConfigError, Params
from prefshift.methods import build_objective, label_source
from prefshift.methods.anchor import AnchorObjective, anchor_mse, select_response
from prefshift.methods.base import BatchOut, soft_bt_loss
from prefshift.methods.confidence import confidence_alpha, confidence_loss, hardened_predictions
from prefshift.methods.layers import AnchorError, anchor_layers


def test_bt_hard_target_is_minus_log_sigmoid():
    delta = torch.tensor([0.0, math.log(3.0)])
    loss = soft_bt_loss(delta, torch.ones(2))
    assert loss.item() == pytest.approx((math.log(2) + -math.log(0.75)) / 2, abs=1e-6)


def test_bt_soft_targets_hand_computed():
    # σ(0) = 0.5, σ(ln 3) = 0.75
    delta = torch.tensor([0.0, math.log(3.0)])
    target = torch.tensor([1.0, 0.75])
    expected = (math.log(2) + -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))) / 2
    assert soft_bt_loss(delta, target).item() == pytest.approx(expected, abs=1e-6)


def test_hardened_predictions_match_the_label_prior():
    p = torch.tensor([0.1, 0.4, 0.6, 0.9])
    assert hardened_predictions(p, torch.full((4,), 0.5)).tolist() == [0, 0, 1, 1]
    # mean q = 0.25 → τ = 0.75 quantile of p = 0.675 → one hard positive
    assert hardened_predictions(p, torch.tensor([0.25, 0.25, 0.25, 0.25])).tolist() == [0, 0, 0, 1]


def test_confidence_alpha_ramps_linearly_over_warmup():
    assert confidence_alpha(0.5, 0.1, 0, 100) == 0.0
    assert confidence_alpha(0.5, 0.1, 5, 100) == pytest.approx(0.25)
    assert confidence_alpha(0.5, 0.1, 10, 100) == pytest.approx(0.5)
    assert confidence_alpha(0.5, 0.1, 60, 100) == pytest.approx(0.5)
    assert confidence_alpha(0.5, 0.0, 0, 100) == 0.5


def test_confidence_loss_value_and_detached_threshold():
    p = torch.tensor([0.2, 0.4, 0.6, 0.8])
    delta = torch.log(p / (1 - p)).requires_grad_(True)
    q = torch.tensor([0.7, 0.3, 0.6, 0.4])  # mean 0.5 → h = [0, 0, 1, 1]
    loss, alpha_t = confidence_loss(delta, q, alpha=0.5, warmup_frac=0.1, step=5, total_steps=100)
    assert alpha_t == pytest.approx(0.25)
    target = [0.75 * qi + 0.25 * hi for qi, hi in zip(q.tolist(), [0, 0, 1, 1], strict=True)]
    expected = (
        -sum(t * math.log(pi) + (1 - t) * math.log(1 - pi) for t, pi in zip(target, p.tolist(), strict=True))
        / 4
    )
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    loss.backward()
    # h is detached: dL/dΔ = (p - target) / n exactly
    expected_grad = [(pi - t) / 4 for pi, t in zip(p.tolist(), target, strict=True)]
    assert delta.grad.tolist() == pytest.approx(expected_grad, abs=1e-6)


def test_anchor_mse_ignores_prompt_and_padding():
    # 2 rows x 4 positions x 2 dims; prompt and padding positions hold huge values that must not count
    student = torch.full((2, 4, 2), 1000.0)
    reference = torch.zeros((2, 4, 2))
    mask = torch.tensor([[0, 1, 1, 0], [0, 0, 1, 0]], dtype=torch.bool)
    student[0, 1] = torch.tensor([1.0, 1.0])
    student[0, 2] = torch.tensor([2.0, 0.0])
    student[1, 2] = torch.tensor([0.0, 3.0])
    reference[1, 2] = torch.tensor([0.0, 1.0])
    hidden = (torch.zeros_like(student), student)
    ref_hidden = (torch.zeros_like(reference), reference)
    got = anchor_mse(select_response(hidden, [1], mask), select_response(ref_hidden, [1], mask))
    # squared errors over 3 tokens x 2 dims: 1 + 1 + 4 + 0 + 0 + 4 = 10 → 10 / 6
    assert got.item() == pytest.approx(10 / 6)


def test_anchor_mse_means_over_layers():
    mask = torch.tensor([[1, 1]], dtype=torch.bool)
    hidden = (torch.zeros(1, 2, 1), torch.ones(1, 2, 1), 3 * torch.ones(1, 2, 1))
    ref = tuple(torch.zeros(1, 2, 1) for _ in range(3))
    got = anchor_mse(select_response(hidden, [1, 2], mask), select_response(ref, [1, 2], mask))
    assert got.item() == pytest.approx((1 + 9) / 2)


def test_anchor_loss_adds_lambda_times_mse():
    delta, targets = torch.tensor([0.0]), torch.tensor([1.0])
    mask = torch.tensor([[1], [1]], dtype=torch.bool)
    hidden = (torch.zeros(2, 1, 1), torch.full((2, 1, 1), 2.0))
    out = BatchOut(delta, targets, hidden, mask, torch.zeros(1, 2, 1))
    loss, logs = AnchorObjective("anchor_last", layers=(1,), lam=0.5).loss(out, 0, 10)
    assert logs["anchor_mse"] == pytest.approx(4.0)
    assert loss.item() == pytest.approx(math.log(2) + 0.5 * 4.0)


def test_anchor_layers_last_and_mid():
    assert anchor_layers("last", 4, [0.5, 0.75]) == (4,)
    assert anchor_layers("mid", 4, [0.5, 0.75]) == (2, 3)
    assert anchor_layers("mid", 1, [0.5, 0.75]) == (1,)  # halves round up, never to layer 0
    assert anchor_layers("mid", 24, [0.5, 0.75]) == (12, 18)


def test_anchor_bad_settings_fail_before_training():
    with pytest.raises(AnchorError, match="out of range"):
        anchor_layers("mid", 4, [0.1])
    with pytest.raises(AnchorError, match="lambda"):
        AnchorObjective("anchor_last", layers=(1,), lam=-1.0)


def test_build_objective_and_label_sources():
    params = Params()
    assert build_objective("naive", params, 4).layers == ()
    assert build_objective("anchor_mid", params, 4).layers == (2, 3)
    assert build_objective("confidence", params, 4).alpha == params.confidence.alpha
    assert [label_source(m) for m in ("teacher", "ceiling", "naive", "seam")] == [
        "gold",
        "gold",
        "weak",
        "seam",
    ]
    with pytest.raises(ConfigError, match="valid methods: naive"):
        build_objective("bogus", params, 4)
