"""The shared-prefix forward equals the two-sequence path: rewards, hidden states, loss, gradients.

On a tiny Llama decoder (fp32, CPU), for ragged prompts and responses with padding, pairs whose
common token prefix is shorter than the prompt (a BPE merge across the boundary), longer than it
(responses that begin alike), a whole sequence (one side a prefix of the other) and identical
sides; with LoRA, ANCHOR's masked MSE and GRM; on Qwen2 and GPT-2 too, while a BERT encoder keeps
the two-sequence path bit for bit. Tolerance: 1e-5 absolute on rewards and losses,
1e-4 relative (to the largest entry) on gradients and hidden states. The two paths differ only
in float rounding: the same dot products in other matmul shapes and softmax orders.
"""

from __future__ import annotations

import copy

import pytest
import torch

from prefshift.config.params import Params, TrainConfig
from prefshift.data.encode import EncodedPair, Encoder, collate, render
from prefshift.data.schema import Group, make_pair
from prefshift.engine.scoring import score_groups
from prefshift.engine.train import apply_lora, train_reward_model
from prefshift.methods import build_objective
from prefshift.methods.base import BatchOut
from prefshift.models.reward import RewardModel
from prefshift.models.shared_prefix import pack
from tiny_models import SPEC, items, pairs, reward_model, tokenizer

ATOL = 1e-5
RTOL = 1e-4


def _edge_items():
    """Pairs whose sides share more than the prompt, all of one side, or everything (last: the
    schema refuses identical sides, `prefshift score` rows may have them)."""
    prompt = [{"role": "user", "content": "how do I fix the door?"}]
    sides = [
        ("first fix it gently, then check the door", "first fix it, then paint it"),
        ("first fix it", "first fix it gently, then check the door again"),
    ]
    encoder = Encoder(tokenizer(), Params().encode)
    edge = encoder.encode_pairs(
        [
            make_pair(dataset="toy", category="helpful", prompt=prompt, chosen=chosen, rejected=rejected)
            for chosen, rejected in sides
        ]
    )
    same = encoder.encode_one(prompt, "no idea")
    return [*edge, EncodedPair(99, "same", same, same, 0.5)]


def _batch(n: int = 12):
    return collate(items(n) + _edge_items(), tokenizer().pad_token_id)


def _pair(seed: int = 3):
    """The same model twice: one on the shared-prefix path, one forced onto two sequences."""
    shared = reward_model(seed=seed)
    whole = copy.deepcopy(shared)
    whole.pair_forward = "two_sequence"
    return shared, whole


def _close(a: torch.Tensor, b: torch.Tensor) -> None:
    scale = max(a.abs().max().item(), b.abs().max().item(), 1e-12)
    assert (a - b).abs().max().item() <= RTOL * scale


def test_packing_reads_every_token_where_its_own_sequence_has_it():
    batch = _batch()
    packing = pack(batch["input_ids"], batch["attention_mask"], batch["groups"])
    real = batch["attention_mask"].bool()
    assert torch.equal(packing.unpack(packing.input_ids)[real], batch["input_ids"][real])
    positions = packing.unpack(packing.position_ids)
    assert torch.equal(positions[real], (batch["attention_mask"].cumsum(-1) - 1)[real])
    real_tokens = int(real.sum())
    assert packing.tokens < real_tokens  # every pair computes its prompt once
    half = real.shape[0] // 2
    lengths = real.sum(-1)
    per_group = torch.stack([(packing.segment == g).sum() for g in range(half)])
    common = lengths[:half] + lengths[half:] - per_group
    mask_prompt = (~batch["response_mask"] & real).sum(-1)[:half]
    assert (common > mask_prompt).any(), "no pair sharing response tokens: the case is not covered"
    # A boundary merge: "assistant: " alone ends in a space token, which the full text merges
    # into the response's first word, so the shared prefix is shorter than the prompt's tokens.
    pair = pairs(1)[0]
    text, (start, _) = render(tokenizer(), pair.prompt, pair.chosen)
    prompt_alone = len(tokenizer()(text[:start], add_special_tokens=False)["input_ids"])
    first = batch["keys"].index((pair.pair_id, "chosen"))
    assert common[first] < prompt_alone


def test_rewards_and_hidden_states_match_on_ragged_padded_pairs():
    shared, whole = _pair()
    batch = _batch()
    args = (batch["input_ids"], batch["attention_mask"])
    with torch.no_grad():
        a = shared(*args, output_hidden_states=True, groups=batch["groups"])
        b = whole(*args, output_hidden_states=True, groups=batch["groups"])
    assert shared.pair_counts["shared_prefix"] == 1 and whole.pair_counts["two_sequence"] == 1
    assert (a.rewards - b.rewards).abs().max() <= ATOL
    real = batch["attention_mask"].bool()
    for ha, hb in zip(a.hidden_states, b.hidden_states, strict=True):
        _close(ha[real], hb[real])
    identical = batch["input_ids"].shape[0] // 2 - 1  # the last pair: both sides the same tokens
    # To float tolerance, not bit for bit: CPU kernels need not give identical rows identical
    # results (seen: 1 ulp apart on an AVX2 machine, equal on an AVX-512 one).
    assert (a.rewards[identical] - a.rewards[2 * identical + 1]).abs() <= ATOL


def test_short_pairs_share_a_row_and_still_see_only_themselves():
    long_pair = make_pair(
        dataset="toy",
        category="helpful",
        prompt=[{"role": "user", "content": " ".join(["how do I fix the door and the window"] * 6)}],
        chosen="first fix it gently, then check the door again and again",
        rejected="no idea at all",
    )
    data = Encoder(tokenizer(), Params().encode).encode_pairs([long_pair]) + items(6)
    batch = collate(data, tokenizer().pad_token_id)
    shared, whole = _pair()
    packing = shared.packing(batch["input_ids"], batch["attention_mask"], batch["groups"])
    assert packing is not None and packing.input_ids.shape[0] < len(data)  # several pairs in a row
    with torch.no_grad():
        a = shared(batch["input_ids"], batch["attention_mask"], groups=batch["groups"])
        b = whole(batch["input_ids"], batch["attention_mask"], groups=batch["groups"])
    assert (a.rewards - b.rewards).abs().max() <= ATOL


def _loss_and_grads(model, batch, method: str, lora: bool = False):
    if lora:
        torch.manual_seed(0)  # the same adapter initialisation on both paths
        apply_lora(model, TrainConfig(lora={"enabled": True, "r": 4, "alpha": 8}))
    objective = build_objective(method, Params.model_validate({"anchor": {"normalize": "none"}}), 2)
    if method == "grm":
        objective.lm_head = model.hf.get_input_embeddings().weight.detach().clone()
    out = model(
        batch["input_ids"],
        batch["attention_mask"],
        output_hidden_states=bool(objective.layers),
        groups=batch["groups"],
    )
    half = out.rewards.shape[0] // 2
    delta = out.rewards[:half] - out.rewards[half:]
    reference = None
    if objective.reference_layers:
        torch.manual_seed(0)
        tokens = int(batch["response_mask"].sum())
        reference = torch.randn(len(objective.layers), tokens, SPEC.hidden_size)
    targets = torch.linspace(0.2, 0.9, half)
    loss, _ = objective.loss(
        BatchOut(delta, targets, out.hidden_states, batch["response_mask"], reference, batch["input_ids"]),
        1,
        10,
    )
    loss.backward()
    grads = {name: p.grad for name, p in model.named_parameters() if p.requires_grad}
    return loss.detach(), grads


@pytest.mark.parametrize(
    ("method", "lora"), [("naive", False), ("anchor_mid", False), ("grm", False), ("naive", True)]
)
def test_loss_and_gradients_match(method, lora):
    shared, whole = _pair()
    batch = _batch()
    loss_a, grads_a = _loss_and_grads(shared, batch, method, lora)
    loss_b, grads_b = _loss_and_grads(whole, batch, method, lora)
    assert shared.pair_counts.get("shared_prefix") == 1 and "shared_prefix" not in whole.pair_counts
    assert abs(loss_a.item() - loss_b.item()) <= ATOL
    assert grads_a.keys() == grads_b.keys() and grads_a
    for name in grads_a:
        _close(grads_a[name], grads_b[name])


def test_training_logs_the_path_and_tracks_the_two_sequence_run():
    cfg = TrainConfig(batch_size=4, epochs=1, lr=5e-3, warmup_frac=0.0, log_every=1, probe_size=4)
    logs = {}
    for setting in ("auto", "two_sequence"):
        model = reward_model(seed=1)
        model.pair_forward = setting
        objective = build_objective(
            "anchor_last", Params.model_validate({"anchor": {"normalize": "none"}}), 2
        )
        _, logs[setting] = train_reward_model(
            model, tokenizer(), items(8), objective, cfg, seed=0, name=setting, progress=False
        )
    assert logs["auto"]["pair_forward"]["path"] == "shared_prefix"
    assert logs["two_sequence"]["pair_forward"]["path"] == "two_sequence"
    assert "shared_prefix" not in logs["two_sequence"]["pair_forward"]
    for a, b in zip(logs["auto"]["steps"], logs["two_sequence"]["steps"], strict=True):
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-4)


def test_best_of_n_groups_score_the_same_on_both_paths():
    shared, whole = _pair()
    for model in (shared, whole):
        model.eval()
    groups = [
        Group(f"g{i}", "toy", "helpful", p.prompt, [p.chosen, p.rejected, p.chosen + " now"], [0.0] * 3)
        for i, p in enumerate(pairs(7))
    ]
    params = Params.model_validate({"evaluate": {"batch_size": 5}})
    a = score_groups(shared, tokenizer(), groups, params)
    b = score_groups(whole, tokenizer(), groups, params)
    assert shared.pair_counts["shared_prefix"] >= 1 and "groups" not in whole.pair_counts
    for ra, rb in zip(a["rewards"], b["rewards"], strict=True):
        assert ra == pytest.approx(rb, abs=ATOL)


def _gpt2():
    from transformers import GPT2Config, GPT2ForSequenceClassification

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=len(tokenizer()), n_embd=32, n_layer=2, n_head=2, n_positions=256)
    config.num_labels, config.pad_token_id = 1, tokenizer().pad_token_id
    return GPT2ForSequenceClassification(config), tokenizer()


@pytest.mark.parametrize("family", ["qwen2", "gpt2", "bert"])
def test_other_architectures_share_exactly_and_encoders_do_not_share(family):
    """Qwen2 (RoPE, its own chat template) and GPT-2 (learned absolute positions) take the packed
    mask and position ids as Llama does; a BERT encoder keeps the two-sequence path, bit for bit."""
    from rlhf_families import build

    hf, tok = _gpt2() if family == "gpt2" else build(family)
    hf.eval()
    shared = RewardModel(hf)
    whole = RewardModel(copy.deepcopy(hf), "two_sequence")
    batch = collate(Encoder(tok, Params().encode).encode_pairs(pairs(8)), tok.pad_token_id)
    args = (batch["input_ids"], batch["attention_mask"])
    with torch.no_grad():
        a = shared(*args, output_hidden_states=True, groups=batch["groups"])
        b = whole(*args, output_hidden_states=True, groups=batch["groups"])
    assert (a.rewards - b.rewards).abs().max() <= ATOL
    if family == "bert":
        assert shared.pair_counts == {"two_sequence": 1, "two_sequence_tokens": args[0].numel()}
        assert torch.equal(a.rewards, b.rewards)
    else:
        assert shared.pair_counts["shared_prefix"] == 1
