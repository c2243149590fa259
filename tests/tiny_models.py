"""Tiny tokenizers, reward models and pairs shared by the training-engine tests (no hub, seconds)."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import torch

from prefshift.config.params import EncodeConfig, LMSpec
from prefshift.data.encode import EncodedPair, Encoder
from prefshift.data.schema import Pair, make_pair
from prefshift.models.backbone import save_backbone, tiny_config, train_tokenizer
from prefshift.models.reward import RewardModel, disable_dropout, ensure_pad_token

TEXTS = [
    f"user: how do I {verb} the {noun}?\nassistant: first {verb} it gently, then check the {noun} again."
    for verb in ("fix", "clean", "paint", "move", "open")
    for noun in ("door", "window", "table", "lamp")
]
SPEC = LMSpec(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, pretrain_steps=0)


@cache
def tokenizer():
    return train_tokenizer(TEXTS, 300)


def fresh_tokenizer():
    """A private copy (tests that change special tokens must not leak into others)."""
    return train_tokenizer(TEXTS, 300)


def reward_model(seed: int = 0, spec: LMSpec = SPEC) -> RewardModel:
    from transformers import LlamaForSequenceClassification

    torch.manual_seed(seed)
    config = tiny_config(spec, tokenizer(), 256)
    config.num_labels = 1
    model = LlamaForSequenceClassification(config)
    disable_dropout(model)
    ensure_pad_token(tokenizer(), model)
    return RewardModel(model)


def base_dir(root: Path, seed: int = 0, spec: LMSpec = SPEC) -> Path:
    """A backbone directory as `prefshift backbone` writes it (an untrained tiny causal LM)."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    out = root / f"base-{seed}-{spec.num_layers}"
    if not out.exists():
        save_backbone(
            LlamaForCausalLM(tiny_config(spec, tokenizer(), 256)), tokenizer(), out, {"name": "tiny"}
        )
    return out


def install_backbones(layout, weak: Path, strong: Path) -> None:
    """models/base as `prefshift backbone` writes it (one output set), resolved from local directories."""
    from prefshift.config.params import Params
    from prefshift.pipeline.stages import backbone

    specs = {"weak": {"name_or_path": str(weak)}, "strong": {"name_or_path": str(strong)}}
    backbone.run(Params.model_validate({"backbone": specs}), layout)


def pairs(n: int = 12) -> list[Pair]:
    verbs = ("fix", "clean", "paint", "move", "open", "close")
    return [
        make_pair(
            dataset="toy",
            category="helpful",
            prompt=[{"role": "user", "content": f"how do I {verbs[i % 6]} the door number {i}?"}],
            chosen=f"first {verbs[i % 6]} it gently, then check the door" + " again" * (i % 4),
            rejected="no" + " idea" * (1 + i % 3),
        )
        for i in range(n)
    ]


def items(n: int = 12, targets: list[float] | None = None, max_length: int = 64) -> list[EncodedPair]:
    return Encoder(tokenizer(), EncodeConfig(max_length=max_length)).encode_pairs(pairs(n), targets)
