"""The training loop: determinism, drift log, non-finite loss, resume, LoRA, and the stages end to end."""

from __future__ import annotations

import json
import math

import pandas as pd
import pyarrow.parquet as pq
import pytest
import torch

from prefshift.config.params import LoraConfig, Params, TrainConfig
from prefshift.data.encode import length_grouped_batches
from prefshift.data.schema import Group, read_pairs, write_groups, write_pairs
from prefshift.engine.scoring import reward_stats
from prefshift.engine.train import TrainingError, train_reward_model
from prefshift.methods import build_objective
from prefshift.methods.base import Objective
from prefshift.models.reward import load_reward_model
from split_manifests import write_split_manifests
from tiny_models import base_dir, install_backbones, items, pairs, reward_model, tokenizer

CFG = TrainConfig(batch_size=4, epochs=2, lr=5e-3, warmup_frac=0.25, log_every=1, drift_every=2, probe_size=4)


def _run(method="naive", cfg=CFG, data=None, **kwargs):
    model = reward_model(seed=1)
    objective = kwargs.pop("objective", None) or build_objective(method, Params(), model.num_layers)
    return train_reward_model(
        model, tokenizer(), data or items(8), objective, cfg, seed=0, name=method, progress=False, **kwargs
    )


def _same_weights(a, b) -> bool:
    return all(
        torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True)
    )


def test_training_is_deterministic_and_logs_drift():
    model_a, log_a = _run("confidence")
    model_b, log_b = _run("confidence")
    assert _same_weights(model_a, model_b)
    assert log_a["steps"] == log_b["steps"] and log_a["drift"] == log_b["drift"]
    assert [s["step"] for s in log_a["steps"]] == [1, 2, 3, 4]
    assert log_a["total_steps"] == 4
    assert log_a["steps"][-1]["lr"] == 0.0 and "alpha_t" in log_a["steps"][0]
    assert [d["step"] for d in log_a["drift"]] == [2, 4]
    assert set(log_a["drift"][0]) == {"step", "layer_1", "layer_2"}
    assert all(-1.0 <= d["layer_2"] < 1.0 for d in log_a["drift"])
    assert log_a["peak_rss_mb"] > 0 and log_a["wall_s"] > 0


def test_gradient_checkpointing_gives_the_same_model():
    plain, _ = _run("naive")
    checkpointed, _ = _run("naive", cfg=CFG.model_copy(update={"gradient_checkpointing": True}))
    for a, b in zip(plain.parameters(), checkpointed.parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-6)


def test_non_finite_loss_stops_with_the_step(tmp_path):
    lengths = [it.length for it in items(8)]
    second_batch = length_grouped_batches(lengths, CFG.batch_size, seed=0)[1]  # the loop's epoch-0 order
    data = items(8, targets=[math.nan if i in second_batch else 1.0 for i in range(8)])
    cfg = CFG.model_copy(update={"checkpoint_every": 1})
    with pytest.raises(TrainingError, match=r"at step \d+ .*last good checkpoint") as err:
        _run("naive", cfg=cfg, data=data, checkpoint_dir=tmp_path / "ckpt")
    assert (tmp_path / "ckpt" / "last" / "trainer_state.json").exists()
    step = json.loads((tmp_path / "ckpt" / "last" / "trainer_state.json").read_text())["step"]
    assert step == 1 and "at step 1 " in str(err.value)


class _Interrupt(Objective):
    """The naive objective, interrupted after a few steps (a killed job)."""

    def loss(self, out, step, total_steps):
        if step == 3:
            raise KeyboardInterrupt
        return super().loss(out, step, total_steps)


def test_resume_from_checkpoint_matches_an_uninterrupted_run(tmp_path, monkeypatch):
    cfg = CFG.model_copy(update={"checkpoint_every": 1})
    full, full_log = _run("naive", cfg=cfg, checkpoint_dir=tmp_path / "a")
    with pytest.raises(KeyboardInterrupt):
        _run("naive", cfg=cfg, checkpoint_dir=tmp_path / "b", objective=_Interrupt("naive"))
    assert json.loads((tmp_path / "b" / "last" / "trainer_state.json").read_text())["step"] == 3
    assert not list((tmp_path / "b" / "last").glob("custom_checkpoint_*"))
    unpickling = []
    real_load = torch.load
    monkeypatch.setattr(
        torch, "load", lambda *a, **kw: unpickling.append(kw.get("weights_only")) or real_load(*a, **kw)
    )
    resumed, resumed_log = _run("naive", cfg=cfg, checkpoint_dir=tmp_path / "b")
    assert unpickling and set(unpickling) == {True}  # optimizer and RNG states; the scheduler is in JSON
    assert _same_weights(full, resumed)
    assert [s["loss"] for s in resumed_log["steps"]] == [s["loss"] for s in full_log["steps"]]


def test_lora_trains_the_head_and_saves_a_plain_model(tmp_path):
    from transformers import AutoModelForSequenceClassification

    from prefshift.models.reward import save_reward_model

    lora = LoraConfig(enabled=True, r=2, alpha=4, target_modules=["q_proj", "v_proj"])
    cfg = CFG.model_copy(update={"lora": lora})
    anchor = Params.model_validate({"anchor": {"lambda": 1.0, "cache": False}}).anchor
    start = reward_model(seed=1)
    model, log = _run("anchor_last", cfg=cfg, anchor=anchor)
    assert log["reference"]["cache"] is False and log["steps"][-1]["anchor_mse"] >= 0
    save_reward_model(model, tokenizer(), tmp_path / "lora")
    plain = AutoModelForSequenceClassification.from_pretrained(tmp_path / "lora")
    assert not any("lora" in name for name in plain.state_dict())
    assert not torch.equal(plain.score.weight, start.hf.score.weight)  # the head was trained and saved


def _tiny_project(root):
    """A project root with splits, a manifest and tiny backbones, as earlier stages leave it."""
    from prefshift.core.paths import Layout

    layout = Layout(root, seed=0)
    data = pairs(16)
    write_pairs(layout.split("teacher_train"), data[:8])
    write_pairs(layout.split("student_train"), data[8:])
    write_pairs(layout.split("id_test"), data[:4])
    write_pairs(layout.split("toy_ood"), data[4:8])
    write_split_manifests(layout, "v1", targets=["toy_ood"], groups=["toy"])
    group = Group(
        "g1", "toy", "helpful", data[0].prompt, [data[0].chosen, data[0].rejected, "maybe"], [2.0, 0.0, 1.0]
    )
    write_groups(layout.split_groups("toy", "toy"), [group])
    install_backbones(layout, base_dir(root), base_dir(root))
    return layout


@pytest.mark.slow
def test_stages_teacher_label_train_end_to_end(tmp_path):
    from prefshift.pipeline.stages import (
        evaluate_teacher,
        label,
        plan,
        reference,
        score_target,
        targets,
        teacher,
        train,
    )

    layout = _tiny_project(tmp_path)
    params = Params.model_validate(
        {
            "data": {"source": "toy", "targets": ["toy_ood"]},
            "teacher": {"batch_size": 4, "epochs": 1, "drift_every": 1},
            "student": {"batch_size": 4, "epochs": 1, "drift_every": 1},
        }
    )
    teacher.run(params, layout)
    label.run(params, layout)
    score_target.run(params, layout, "teacher", "toy_ood")  # a target is scored apart from training
    metrics = evaluate_teacher.run(params, layout)
    assert set(metrics["accuracy_pp"]) == {"id_test", "toy_ood"}
    trained_on = json.loads(layout.train_log("teacher").read_text())["split_versions"]
    assert trained_on == {"teacher_train": "v1", "id_test": "v1"}  # no target: none is trained on
    labels = pq.read_table(layout.weak_labels)
    assert labels.schema.metadata[b"split_version"] == b"v1"
    assert labels.column_names == ["pair_id", "q", "teacher_delta"]
    frame = labels.to_pandas()
    assert frame["q"].tolist() == pytest.approx([1 / (1 + math.exp(-d)) for d in frame["teacher_delta"]])
    scores = pd.read_parquet(layout.scores("teacher", "toy_ood"))
    assert list(scores.columns) == [
        *("pair_id", "delta", "gold", "len_chosen", "len_rejected", "reward_chosen", "reward_rejected")
    ]
    margins = scores["reward_chosen"] - scores["reward_rejected"]
    assert margins.tolist() == pytest.approx(scores["delta"].tolist())
    assert scores["pair_id"].tolist() == [p.pair_id for p in pairs(16)[4:8]]  # input order, not length order
    groups = pd.read_parquet(layout.group_scores("teacher", "toy", "toy"))
    assert groups["group_id"].tolist() == ["g1"] and len(groups["rewards"][0]) == 3
    plan.run(params, layout)
    reference.run(params, layout)
    for method in ("naive", "anchor_mid"):
        targets.run(params, layout, method)
        log = train.run(params, layout, method)
        assert json.loads(layout.train_log(method).read_text())["steps"] == log["steps"]
        model, tok = load_reward_model(layout.student_dir(method))
        assert model.num_layers == 2
        saved = json.loads((layout.student_dir(method) / "config.json").read_text())
        stats = reward_stats(model.eval(), tok, read_pairs(layout.split("id_test")), params)
        assert (saved["mean"], saved["std"]) == pytest.approx((stats["mean"], stats["std"]), abs=1e-5)
        assert log["reward_stats"] == pytest.approx(stats, abs=1e-5)
    assert not layout.checkpoint_dir("naive").exists()
    write_split_manifests(layout, "v2", targets=["toy_ood"], groups=["toy"])
    with pytest.raises(Exception, match="split version"):
        train.run(params, layout, "naive")
