"""ANCHOR's reference: frozen, gradient-free, computed once per example when cached, same loss either way."""

from __future__ import annotations

import torch

from prefshift.config.params import AnchorConfig, Params, TrainConfig
from prefshift.data.encode import collate
from prefshift.engine.anchor_cache import ReferenceStates, hidden_fn
from prefshift.engine.train import build_reference, train_reward_model
from prefshift.methods import build_objective
from prefshift.methods.base import BatchOut
from tiny_models import items, reward_model, tokenizer

CFG = TrainConfig(batch_size=4, epochs=2, lr=5e-3, warmup_frac=0.0, log_every=1, drift_every=2, probe_size=4)


def _params(lam: float = 1.0) -> Params:
    """The paper's raw anchor (these tests check the mechanics; test_reference covers normalisation)."""
    return Params.model_validate({"anchor": {"lambda": lam, "normalize": "none"}})


def _train(anchor: AnchorConfig, reference=None, method: str = "anchor_mid", n: int = 8):
    model = reward_model(seed=1)
    objective = build_objective(method, _params(anchor.lam), model.num_layers)
    return train_reward_model(
        model,
        tokenizer(),
        items(n),
        objective,
        CFG,
        seed=0,
        name=method,
        anchor=anchor,
        reference=reference,
        progress=False,
    )


def test_reference_is_frozen_and_bit_identical_after_training():
    model = reward_model(seed=1)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    objective = build_objective("anchor_last", _params(), model.num_layers)
    anchor = AnchorConfig(**{"lambda": 1.0, "cache": False})
    data = items(8)
    reference = build_reference(model, data, objective.layers, anchor, CFG, tokenizer().pad_token_id)
    trained, log = train_reward_model(
        model,
        tokenizer(),
        data,
        objective,
        CFG,
        seed=0,
        name="a",
        anchor=anchor,
        reference=reference,
        progress=False,
    )
    ref = reference.module
    assert not ref.training
    for name, param in ref.state_dict().items():
        assert torch.equal(param, start[name]), name
    assert all(not p.requires_grad and p.grad is None for p in ref.parameters())
    assert any(not torch.equal(v, start[k]) for k, v in trained.state_dict().items())  # the student moved
    assert log["reference"]["forward_rows"] == 2 * 2 * 8  # uncached: every step, both epochs


def test_cached_and_uncached_give_the_same_losses():
    _, cached = _train(AnchorConfig(**{"lambda": 1.0, "cache": True}))
    _, uncached = _train(AnchorConfig(**{"lambda": 1.0, "cache": False}))
    for a, b in zip(cached["steps"], uncached["steps"], strict=True):
        assert abs(a["anchor_mse"] - b["anchor_mse"]) <= 1e-3 * max(1.0, b["anchor_mse"])
        assert abs(a["loss"] - b["loss"]) <= 1e-3 * max(1.0, b["loss"])
    assert cached["steps"][-1]["anchor_mse"] > 0


def test_cache_runs_the_reference_once_per_example():
    _, log = _train(AnchorConfig(**{"lambda": 1.0, "cache": True}), n=8)
    assert log["reference"]["forward_rows"] == 2 * 8  # chosen + rejected, once, over 2 epochs
    assert log["reference"]["entries"] == 2 * 8


def test_spilled_cache_returns_the_same_states(tmp_path):
    model = reward_model(seed=2)
    data = items(6)
    batch = collate(data, tokenizer().pad_token_id)
    in_memory = ReferenceStates(hidden_fn(model), (1, 2), cache=True)
    spilling = ReferenceStates(
        hidden_fn(model), (1, 2), cache=True, max_bytes=1, spill_dir=tmp_path / "spill"
    )
    live = ReferenceStates(hidden_fn(model), (1, 2), cache=False)
    in_memory.fill([batch])
    spilling.fill([batch])
    assert spilling.spilled == 12 and in_memory.spilled == 0
    a, b = in_memory.get(batch, torch.device("cpu")), spilling.get(batch, torch.device("cpu"))
    assert torch.equal(a, b)
    assert torch.allclose(a, live.get(batch, torch.device("cpu")), rtol=1e-3, atol=1e-3)
    assert a.shape == (2, int(batch["response_mask"].sum()), 32)


def test_lambda_zero_gives_exactly_the_naive_gradients():
    data = items(4, targets=[0.9, 0.2, 0.7, 0.6])
    batch = collate(data, tokenizer().pad_token_id)
    grads = []
    for method in ("naive", "anchor_last"):
        model = reward_model(seed=4)
        objective = build_objective(method, _params(0.0), model.num_layers)
        out = model(batch["input_ids"], batch["attention_mask"], output_hidden_states=True)
        delta = out.rewards[:4] - out.rewards[4:]
        reference = torch.randn(1, int(batch["response_mask"].sum()), 32)
        loss, _ = objective.loss(
            BatchOut(delta, batch["targets"], out.hidden_states, batch["response_mask"], reference), 0, 10
        )
        loss.backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*grads, strict=True))
