"""The robust fine-tuning family (issue 33): L2-SP's loss and WiSE-FT's interpolation against
hand-computed values, the head left out of both, WiSE-FT's α chosen on ID validation only, and
each method trained and evaluated through the stages on the tiny project."""

from __future__ import annotations

import json
import math
import shutil
from dataclasses import replace

import pytest
import torch

from prefshift.core.paths import Layout
from prefshift.data.schema import read_pairs, write_pairs
from prefshift.methods.base import BatchOut
from prefshift.methods.builtin.wise_ft import WiseFTSettings, choose_alpha, one_standard_error
from prefshift.methods.registry import ID_VALIDATION
from prefshift.methods.weights import L2SPObjective, freeze_all_but, interpolate, squared_distance
from tiny_project import copy_project, pipeline_root, score_on_targets, tiny_params, write_params


class TwoPart(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Linear(2, 1, bias=False)
        self.head = torch.nn.Linear(1, 1, bias=False)


def test_l2_sp_adds_lambda_times_the_squared_distance_of_the_backbone():
    model = TwoPart()
    with torch.no_grad():
        model.body.weight.copy_(torch.tensor([[1.0, 2.0]]))
        model.head.weight.fill_(5.0)
    objective = L2SPObjective("l2_sp", lam=0.5)
    objective.bind(model, exclude={"head.weight"})
    with torch.no_grad():
        model.body.weight.copy_(torch.tensor([[2.0, 4.0]]))  # moved by (1, 2): distance 1 + 4 = 5
        model.head.weight.fill_(-7.0)  # the head moved too, and is not counted
    out = BatchOut(delta=torch.tensor([0.0]), targets=torch.tensor([1.0]))
    loss, extra = objective.loss(out, 0, 1)
    assert extra["l2_sp_distance"] == pytest.approx(5.0)
    assert extra["w2s"] == pytest.approx(math.log(2))  # BT at Δ = 0: -log σ(0)
    assert loss.item() == pytest.approx(math.log(2) + 0.5 * 5.0)
    assert extra["l2_sp_share"] == pytest.approx(2.5 / (2.5 + math.log(2)))


def test_l2_sp_gradient_is_two_lambda_times_the_displacement():
    model = TwoPart()
    objective = L2SPObjective("l2_sp", lam=0.25)
    objective.bind(model, exclude={"head.weight"})
    start = model.body.weight.detach().clone()
    with torch.no_grad():
        model.body.weight.add_(torch.tensor([[1.0, -3.0]]))
    out = BatchOut(delta=torch.tensor([0.0]), targets=torch.tensor([0.5]))
    loss, _ = objective.loss(out, 0, 1)
    loss.backward()
    expected = 2 * 0.25 * (model.body.weight.detach() - start)
    assert torch.allclose(model.body.weight.grad, expected)


def test_l2_sp_refuses_to_run_unbound_and_zero_pairs_are_zero():
    with pytest.raises(ValueError, match="before bind"):
        L2SPObjective("l2_sp").loss(BatchOut(torch.tensor([0.0]), torch.tensor([1.0])), 0, 1)
    assert squared_distance([]).item() == 0.0


def test_interpolation_mixes_the_backbone_and_keeps_the_head_and_integer_buffers():
    start = {"w": torch.tensor([0.0, 0.0]), "head": torch.tensor([9.0]), "ids": torch.tensor([1, 2])}
    tuned = {"w": torch.tensor([2.0, 4.0]), "head": torch.tensor([3.0]), "ids": torch.tensor([5, 6])}
    mixed = interpolate(start, tuned, 0.25, keep={"head"})
    assert mixed["w"].tolist() == [0.5, 1.0]  # 0.75 * 0 + 0.25 * (2, 4)
    assert mixed["head"].tolist() == [3.0]
    assert mixed["ids"].tolist() == [5, 6]
    assert interpolate(start, tuned, 0.0, keep={"head"})["w"].tolist() == [0.0, 0.0]
    assert interpolate(start, tuned, 1.0, keep={"head"})["w"].tolist() == [2.0, 4.0]
    with pytest.raises(ValueError, match="different tensors"):
        interpolate({"w": start["w"]}, tuned, 0.5, keep=())


def test_grm_reads_response_tokens_through_the_lm_head():
    """One row, T = 3, vocabulary 2, H = 1. Tokens (0, 1, 1); the response is tokens 1 and 2, so
    positions 0 and 1 predict them. lm_head = [[0], [1]]: logits at a state h are (0, h)."""
    from prefshift.methods.grm import response_log_probs

    hidden = torch.tensor([[[0.0], [math.log(3.0)], [5.0]]])
    ids = torch.tensor([[0, 1, 1]])
    mask = torch.tensor([[False, True, True]])
    head = torch.tensor([[0.0], [1.0]])
    # position 0: logits (0, 0) -> log p(1) = log 1/2; position 1: logits (0, log 3) -> log p(1) = log 3/4
    expected = math.log(0.5) + math.log(0.75)
    assert response_log_probs(hidden, head, ids, mask).item() == pytest.approx(expected)


def test_grm_mixes_the_reward_loss_and_the_regulariser():
    from prefshift.methods.grm import GRMObjective

    hidden = torch.tensor([[[0.0], [math.log(3.0)], [5.0]], [[1.0], [1.0], [1.0]]])
    objective = GRMObjective("grm", layers=(1,), weight=0.25, beta=2.0, lm_head=torch.tensor([[0.0], [1.0]]))
    out = BatchOut(
        delta=torch.tensor([0.0]),
        targets=torch.tensor([1.0]),
        hidden_states=(None, hidden),
        response_mask=torch.tensor([[False, True, True], [False, True, True]]),
        input_ids=torch.tensor([[0, 1, 1], [0, 0, 0]]),
    )
    loss, extra = objective.loss(out, 0, 1)
    logp = math.log(0.5) + math.log(0.75)
    regulariser = -math.log(1 / (1 + math.exp(-2.0 * logp)))  # −log σ(β · log p), chosen row only
    assert extra["grm_reg"] == pytest.approx(regulariser)
    assert loss.item() == pytest.approx(0.75 * math.log(2) + 0.25 * regulariser)
    assert not objective.reference_layers  # it reads the student's own states, not the start's


def test_alpha_by_the_one_standard_error_rule_on_a_constructed_curve():
    alphas = [0.0, 0.1, 0.2, 0.4, 0.7, 1.0]
    curve = [50.0, 68.0, 78.5, 80.0, 81.0, 81.0]
    # Best 81.0 on 100 pairs: SE = √(0.81 · 0.19 / 100) = √0.001539 = 0.039230 → 3.923 pp, floor
    # 77.077: 0.2 (78.5) is the smallest α above it; 0.1 (68.0) is not.
    assert one_standard_error(81.0, 100) == pytest.approx(3.9230, abs=1e-4)
    assert choose_alpha(alphas, curve, 100) == 0.2
    # On 10,000 pairs the SE is 0.3923 pp, floor 80.608: only 0.7 and 1.0 qualify; the smaller wins.
    assert choose_alpha(alphas, curve, 10_000) == 0.7
    # A flat curve (every α ties, as on the embedded default) keeps the start's side: α = 0.
    assert choose_alpha([0.0, 0.5, 1.0], [70.0, 70.0, 70.0], 250) == 0.0
    # A perfect best has SE 0: only the α's that reach it qualify.
    assert choose_alpha([0.0, 0.5, 1.0], [99.0, 100.0, 100.0], 250) == 0.5
    with pytest.raises(ValueError, match="at least one validation pair"):
        one_standard_error(80.0, 0)


def test_alpha_grid_is_checked():
    assert WiseFTSettings(alphas=[1.0, 0.0, 0.5]).alphas == [0.0, 0.5, 1.0]
    with pytest.raises(ValueError, match=r"lie in \[0, 1\]"):
        WiseFTSettings(alphas=[0.5, 1.5])
    with pytest.raises(ValueError, match="listed twice"):
        WiseFTSettings(alphas=[0.5, 0.5])


def test_freeze_all_but_leaves_only_the_named_parameters_trainable():
    model = TwoPart()
    freeze_all_but(model, {"head.weight"})
    assert {n for n, p in model.named_parameters() if p.requires_grad} == {"head.weight"}


ROBUST = ["naive", "linear_probe", "lp_ft", "wise_ft", "l2_sp", "grm"]


@pytest.fixture(scope="module")
def robust_project(tmp_path_factory):
    """The tiny project with the family listed, each trained and evaluated through the stages."""
    from prefshift.pipeline.stages import evaluate, plan, targets, train

    layout = copy_project(pipeline_root(tmp_path_factory), tmp_path_factory.mktemp("robust") / "project")
    params = tiny_params(methods=ROBUST, wise_ft={"alphas": [0.0, 0.5, 1.0]}, l2_sp={"lambda": 0.01})
    write_params(layout.root, params)
    plan.run(params, layout)
    for method in ROBUST[1:]:
        targets.run(params, layout, method)
        train.run(params, layout, method)
        score_on_targets(params, layout, method)
        evaluate.run(params, layout, method)
    return layout, params


def _log(layout: Layout, method: str) -> dict:
    return json.loads(layout.train_log(method).read_text())


@pytest.mark.slow
def test_each_method_trains_and_evaluates_through_the_stages(robust_project):
    layout, _ = robust_project
    for method in ROBUST[1:]:
        metrics = json.loads(layout.metrics(method).read_text())
        assert metrics["method"] == method
        assert 0 <= metrics["id"]["acc"] <= 100
    assert not any(layout.checkpoint_dir(f"lp_ft-{p}").exists() for p in ("probe",))


@pytest.mark.slow
def test_the_linear_probe_leaves_the_backbone_where_it_started(robust_project):
    layout, _ = robust_project
    final = _log(layout, "linear_probe")["drift"][-1]
    assert all(v == pytest.approx(1.0, abs=1e-6) for k, v in final.items() if k.startswith("layer_"))


@pytest.mark.slow
def test_drift_at_the_reward_position_is_read_after_any_post_training_step(robust_project):
    """The linear probe did not move; WiSE-FT's reading is of the interpolated model it saved."""
    layout, _ = robust_project
    probe = _log(layout, "linear_probe")["reward_position"]
    assert probe["cosine"] == pytest.approx(1.0, abs=1e-5) and probe["rows"] > 0
    for method in ROBUST[1:]:
        metrics = json.loads(layout.metrics(method).read_text())
        assert metrics["training"]["reward_position_cosine"] == round(
            _log(layout, method)["reward_position"]["cosine"], 4
        )
    wise = _log(layout, "wise_ft")
    if wise["after_training"]["chosen_alpha"] == 0.0:  # back at the start: the backbone did not move
        assert wise["reward_position"]["cosine"] == pytest.approx(1.0, abs=1e-5)


def test_mean_cosine_of_identical_and_opposite_rows():
    from prefshift.engine.drift import mean_cosine

    rows = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    assert mean_cosine(rows, rows) == pytest.approx(1.0)
    assert mean_cosine(rows, -rows) == pytest.approx(-1.0)
    assert mean_cosine(rows, torch.tensor([[0.0, 1.0], [0.0, 1.0]])) == pytest.approx(0.5)
    assert mean_cosine(torch.zeros(0, 2), torch.zeros(0, 2)) is None
    with pytest.raises(ValueError, match="different shapes"):
        mean_cosine(rows, rows[:1])


@pytest.mark.slow
def test_lp_ft_trains_the_head_first_then_everything(robust_project):
    layout, _ = robust_project
    log = _log(layout, "lp_ft")
    probe = log["phases"]["probe"]
    assert probe["steps"] and probe["total_steps"] > 0
    head_only = probe["drift"][-1]
    assert all(v == pytest.approx(1.0, abs=1e-6) for k, v in head_only.items() if k.startswith("layer_"))
    assert any(v < 1.0 - 1e-6 for k, v in log["drift"][-1].items() if k.startswith("layer_"))


@pytest.mark.slow
def test_grm_logs_its_regulariser_and_keeps_no_reference(robust_project):
    layout, _ = robust_project
    log = _log(layout, "grm")
    assert all(row["grm_reg"] > 0 for row in log["steps"])
    assert "reference" not in log  # no starting states were built or read


@pytest.mark.slow
def test_l2_sp_logs_its_distance(robust_project):
    layout, _ = robust_project
    steps = _log(layout, "l2_sp")["steps"]
    assert steps[0]["l2_sp_distance"] >= 0 and steps[-1]["l2_sp_distance"] > 0


@pytest.mark.slow
def test_wise_ft_records_its_alpha_curve_and_keeps_the_chosen_alpha(robust_project):
    from prefshift.methods.builtin import wise_ft
    from prefshift.pipeline.stages.score_target import on_target_path

    layout, params = robust_project
    record = _log(layout, "wise_ft")["after_training"]
    assert record["hook"] == "prefshift.methods.builtin.wise_ft.interpolate_back"
    assert record["alphas"] == [0.0, 0.5, 1.0]
    assert record["chosen_on"] == ID_VALIDATION
    curve = record["accuracy"]
    assert set(curve) == {ID_VALIDATION, "id_test"}  # training reads no OOD target
    assert record["rule"] == "one standard error"
    assert record["validation_pairs"] == len(read_pairs(layout.split("teacher_train")))
    assert record["chosen_alpha"] == choose_alpha(
        record["alphas"], curve[ID_VALIDATION], record["validation_pairs"]
    )
    chosen = record["alphas"].index(record["chosen_alpha"])
    metrics = json.loads(layout.metrics("wise_ft").read_text())
    assert metrics["id"]["acc"] == pytest.approx(curve["id_test"][chosen])  # the saved model is θ_α
    # The OOD rows: score-target rebuilds the grid from the start and the kept θ_ft, one target at a time.
    assert (layout.student_dir("wise_ft") / f"{wise_ft.FINE_TUNED}.safetensors").is_file()
    for target in params.data.targets:
        row = json.loads(on_target_path(layout, "wise_ft", target).read_text())
        assert row["hook"] == "prefshift.methods.builtin.wise_ft.alpha_on_target"
        assert row["alphas"] == record["alphas"] and set(row["accuracy"]) == {target}
        assert metrics["targets"][target]["acc"] == pytest.approx(row["accuracy"][target][chosen])
        assert not on_target_path(
            layout, "l2_sp", target
        ).exists()  # a method without the hook records nothing


@pytest.mark.slow
def test_wise_ft_alpha_does_not_change_when_the_recorded_split_does(robust_project, tmp_path):
    """Reverse every pair of id_test (its accuracies flip) and retrain with no OOD split on disk:
    the recorded id_test curve changes, the ID validation curve and the chosen α do not, and
    training needs no target (a target is scored after training, by `score-target`)."""
    from prefshift.pipeline.stages import train

    layout, params = robust_project
    before = _log(layout, "wise_ft")["after_training"]
    copy = copy_project(layout.root, tmp_path / "project")
    shutil.rmtree(copy.splits_dir / "ood")
    path = copy.split("id_test")
    write_pairs(path, [replace(p, chosen=p.rejected, rejected=p.chosen) for p in read_pairs(path)])
    train.run(params, copy, "wise_ft")
    after = json.loads(copy.train_log("wise_ft").read_text())["after_training"]
    assert after["accuracy"]["id_test"] != before["accuracy"]["id_test"]
    assert after["accuracy"][ID_VALIDATION] == before["accuracy"][ID_VALIDATION]
    assert after["chosen_alpha"] == before["chosen_alpha"]


@pytest.mark.parametrize("method", ["linear_probe", "lp_ft", "wise_ft", "l2_sp"])
def test_full_weight_methods_refuse_lora_before_training(method):
    from prefshift.config.params import parse_params
    from prefshift.methods import registry
    from prefshift.methods.weights import FullWeightsError
    from tiny_models import reward_model

    params = parse_params({"methods": [method], "student": {"lora": {"enabled": True}}}, "params.yaml")
    model = reward_model()
    build = registry.build(method, params, model.num_layers)
    spec = registry.get(method)
    with pytest.raises(FullWeightsError, match=f"{method} acts on the backbone's full weights"):
        spec.prepare(model, spec.objective(build), build)
    assert all(p.requires_grad for p in model.parameters())  # refused before anything changed
