"""Reward models: a backbone + scalar head, read where the family expects it.

Decoders read the reward at the last non-padding token found from the attention
mask (never from the pad id: pad may equal EOS, and left padding must work), with
position ids derived from the mask so left- and right-padded inputs agree. Encoders
use their own [CLS] pooling head. What we save is a plain Hugging Face directory
that `AutoModelForSequenceClassification.from_pretrained` loads without this package.
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from prefshift.core.atomic import atomic_path
from prefshift.data.encode import chat_template, clear_backend_limits, ensure_chat_template
from prefshift.models.shared_prefix import ATTENTION, Packing, pack, right_padded
from prefshift.models.validate import (
    ModelLoadError,
    check_source,
    code_in_pickle,
    mark_trained_head,
    require_trained_head,
)

__all__ = ["ModelLoadError", "check_source"]  # re-exported: callers import them from here


@dataclass
class RewardOutput:
    rewards: torch.Tensor
    hidden_states: tuple[torch.Tensor, ...] | None
    """Index 0 = embeddings, index k = output of layer k (transformers' convention)."""


def _peft_base(model: nn.Module) -> nn.Module:
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def is_decoder_head(model: nn.Module) -> bool:
    """Decoder sequence classifiers (Llama, Qwen, GPT-2, ...) score every token with `score`."""
    return hasattr(_peft_base(model), "score")


def head_parameter_names(model: RewardModel) -> set[str]:
    """Names, in `model.hf.named_parameters()`, of the scalar head a student adds to its backbone
    (`score` on decoders, `classifier` on encoders): the part with no pretrained start."""
    head = "score" if is_decoder_head(model.hf) else "classifier"
    return {name for name, _ in model.hf.named_parameters() if name.split(".")[0] == head}


def last_token_index(attention_mask: torch.Tensor) -> torch.Tensor:
    """Rightmost position with mask 1: correct for left and right padding alike."""
    positions = torch.arange(attention_mask.shape[-1], device=attention_mask.device)
    return (positions * attention_mask.long()).argmax(-1)


def forward_cost(rows: int, width: int, hidden: int, inner: int) -> int:
    """Multiply-adds per layer, over the hidden size, of a decoder forward on `rows` × `width`
    tokens: the linear layers (4h² attention projections, 3·h·i gated MLP) per token, and dense
    attention (QKᵀ and AV, 2·width·h per token: a masked block is computed all the same). Packing
    widens rows, so on a tiny model, where attention is a large share, fewer tokens can cost more.
    """
    return rows * width * (4 * hidden + 3 * inner + 2 * width)


PAIR_FORWARDS = ("auto", "two_sequence")
"""`encode.pair_forward`: `auto` shares each group's prefix on a decoder whenever that computes
fewer tokens; `two_sequence` runs every sequence whole (the path before issue 35; encoders always)."""


def shared_prefix_refusal(model: nn.Module) -> str | None:
    """Why this model cannot run the shared-prefix forward exactly, or None when it can."""
    core = _peft_base(model)
    if not is_decoder_head(core):
        return "an encoder attends both ways, so no prefix is shared"
    config = core.config.get_text_config()
    attention = getattr(config, "_attn_implementation", None) or "eager"
    if attention not in ATTENTION:
        return f"attention {attention!r} takes no custom 4-D mask"
    layer_types = getattr(config, "layer_types", None) or ()
    sliding = any("sliding" in str(kind) for kind in layer_types) or (
        not layer_types
        and getattr(config, "sliding_window", None) is not None
        and getattr(config, "use_sliding_window", True)
    )
    return "sliding-window attention replaces a custom mask" if sliding else None


class RewardModel(nn.Module):
    """Wraps a `*ForSequenceClassification` (or a peft model around one) as r(x) → scalar.

    `pair_forward` (one of PAIR_FORWARDS) decides how a call with `groups` runs; `pair_counts`
    counts the calls each path took and the tokens they computed (padding included), for the
    run log.
    """

    def __init__(self, hf_model: nn.Module, pair_forward: str = "auto"):
        super().__init__()
        self.hf = hf_model
        self.pair_forward = pair_forward
        self.pair_counts: dict[str, int] = {}

    @property
    def config(self):
        return _peft_base(self.hf).config

    @property
    def num_layers(self) -> int:
        return int(self.config.get_text_config().num_hidden_layers)

    def pair_path(self) -> str:
        """The path calls with `groups` take: shared_prefix, or two_sequence (forced, or the model
        cannot share exactly; `shared_prefix_refusal` says why)."""
        if self.pair_forward == "two_sequence" or shared_prefix_refusal(self.hf) is not None:
            return "two_sequence"
        return "shared_prefix"

    def packing(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, groups: torch.Tensor | None
    ) -> Packing | None:
        """How a call packs its sequences, or None when it runs them whole: no groups, the
        two-sequence path, left padding, or a batch that packing would not make cheaper."""
        if groups is None or self.pair_path() != "shared_prefix" or not right_padded(attention_mask):
            return None
        packing = pack(input_ids, attention_mask, groups.to(input_ids.device))
        config = self.config.get_text_config()
        hidden = int(config.hidden_size)
        inner = int(getattr(config, "intermediate_size", None) or 4 * hidden)
        packed = forward_cost(*packing.input_ids.shape, hidden, inner)
        return packing if packed < forward_cost(*input_ids.shape, hidden, inner) else None

    def _count(self, path: str, tokens: int) -> None:
        self.pair_counts[path] = self.pair_counts.get(path, 0) + 1
        self.pair_counts[f"{path}_tokens"] = self.pair_counts.get(f"{path}_tokens", 0) + tokens

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        output_hidden_states: bool = False,
        groups: torch.Tensor | None = None,
    ) -> RewardOutput:
        """Rewards (and hidden states) of N sequences. `groups` (N,) marks the sequences that share
        a prompt (a pair's two sides: `shared_prefix.pair_groups`); with it a decoder may compute
        their common prefix once, and returns the same outputs in the same layout."""
        core = _peft_base(self.hf)
        packing = self.packing(input_ids, attention_mask, groups)
        if groups is not None:
            path = "two_sequence" if packing is None else "shared_prefix"
            self._count(path, input_ids.numel() if packing is None else packing.input_ids.numel())
        if packing is not None:
            out = self._packed(core, packing, output_hidden_states)
            rewards = core.score(packing.read_last(out.last_hidden_state)).squeeze(-1)
            hidden = tuple(packing.unpack(h) for h in out.hidden_states) if output_hidden_states else None
            return RewardOutput(rewards.float(), hidden)
        if is_decoder_head(core):
            backbone = getattr(core, core.base_model_prefix)
            position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
            out = backbone(
                input_ids=input_ids,
                attention_mask=attention_mask,
                position_ids=position_ids,
                output_hidden_states=output_hidden_states,
                use_cache=False,
            )
            rows = torch.arange(input_ids.shape[0], device=input_ids.device)
            last = out.last_hidden_state[rows, last_token_index(attention_mask)]
            rewards = core.score(last).squeeze(-1)
        else:
            out = core(
                input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=output_hidden_states
            )
            rewards = out.logits.squeeze(-1)
        hidden = out.hidden_states if output_hidden_states else None
        if output_hidden_states and not hidden:
            raise ModelLoadError(f"{type(core).__name__} returns no hidden states; anchor/drift need them")
        return RewardOutput(rewards.float(), hidden)

    @staticmethod
    def _packed(core: nn.Module, packing: Packing, output_hidden_states: bool):
        """The backbone over the packed rows, under the 4-D mask its attention takes."""
        backbone = getattr(core, core.base_model_prefix)
        config = core.config.get_text_config()
        eager = (getattr(config, "_attn_implementation", None) or "eager") == "eager"
        dtype = backbone.get_input_embeddings().weight.dtype if eager else None
        out = backbone(
            input_ids=packing.input_ids,
            attention_mask=packing.attention_mask(dtype),
            position_ids=packing.position_ids,
            output_hidden_states=output_hidden_states,
            use_cache=False,
        )
        if output_hidden_states and not out.hidden_states:
            raise ModelLoadError(f"{type(core).__name__} returns no hidden states; anchor/drift need them")
        return out


def reading_states(
    model: RewardModel,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    layers: Sequence[int],
    groups: torch.Tensor | None = None,
) -> dict[int, torch.Tensor]:
    """layer → [B, H] hidden states at the position the head reads the reward from.

    A decoder's head reads the last real token, an encoder's its first ([CLS]); what a linear
    probe finds there is what a freshly initialised head can learn without moving the backbone.
    """
    out = model(input_ids, attention_mask, output_hidden_states=True, groups=groups)
    if is_decoder_head(_peft_base(model.hf)):
        positions = last_token_index(attention_mask)
    else:
        positions = torch.zeros(input_ids.shape[0], dtype=torch.long, device=input_ids.device)
    rows = torch.arange(input_ids.shape[0], device=input_ids.device)
    return {layer: out.hidden_states[layer][rows, positions] for layer in layers}


def disable_dropout(model: nn.Module) -> None:
    """Reward training runs without dropout: zero every dropout module and config rate."""
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0
    config = model.config.get_text_config()
    for key, value in list(vars(config).items()):
        if "dropout" in key and isinstance(value, float):
            setattr(config, key, 0.0)


def _template_writes(tokenizer, token: str) -> bool:
    """Whether the chat template puts `token` into a rendered exchange (literally or via a variable)."""
    probe = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]
    template = chat_template(tokenizer)
    return token in template or token in tokenizer.apply_chat_template(
        probe, chat_template=template, tokenize=False
    )


def ensure_pad_token(tokenizer, model: nn.Module | None = None) -> None:
    """Give the tokenizer a pad token and tell the model config.

    HF's `*ForSequenceClassification` (what TRL and OpenRLHF load) reads the reward at
    the last token that is not the pad id, so pad must never end a rendered text:
    EOS serves as pad only when the chat template never writes it; otherwise a
    dedicated pad token is added (its embedding is never read: pads are masked).
    """
    if tokenizer.pad_token_id is None:
        eos = tokenizer.eos_token
        if eos is not None and not _template_writes(tokenizer, eos):
            tokenizer.pad_token = eos
        else:
            tokenizer.add_special_tokens({"pad_token": "<|pad|>"})
            if model is not None and len(tokenizer) > model.get_input_embeddings().num_embeddings:
                model.resize_token_embeddings(len(tokenizer))
    if model is not None:
        model.config.pad_token_id = tokenizer.pad_token_id
        model.config.get_text_config().pad_token_id = tokenizer.pad_token_id


def hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes")


def quiet_transformers() -> None:
    """Our stages print their own progress; transformers' bars and load notes are noise there."""
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


def load_reward_model(
    name_or_path: str | Path,
    *,
    trust_remote_code: bool = False,
    revision: str | None = None,
    torch_dtype: torch.dtype | None = None,
    trained_head: bool = False,
    pair_forward: str = "auto",
    seed: int = 0,
):
    """(RewardModel, tokenizer) from a hub id or a local dir; a causal-LM dir gets a fresh scalar head.

    `trained_head`: refuse a model whose head prefshift did not train (what scoring needs).
    `pair_forward`: params `encode.pair_forward` (see `RewardModel`).
    `seed`: torch is seeded with it before the model is built, so a fresh head starts from the
    same weights in every process. torch draws its own start seed from the OS in each process,
    so a head built before anything seeded it was a new draw on every run (the best-of-n judge's
    ID accuracy moved between 55% and 68% on one commit). Training passes its run's seed.
    """
    from safetensors import SafetensorError
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    local = check_source(name_or_path)
    quiet_transformers()
    kwargs = {"trust_remote_code": trust_remote_code, "revision": revision}
    torch.manual_seed(seed)
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(name_or_path), **kwargs)
        hf = AutoModelForSequenceClassification.from_pretrained(
            str(name_or_path), num_labels=1, dtype=torch_dtype, **kwargs
        )
    except (OSError, ValueError) as err:
        if local is not None:
            what = f"cannot load model directory {name_or_path!s}"
        else:
            offline = "HF_HUB_OFFLINE is set and it is not in the local cache; " if hub_offline() else ""
            what = f"cannot load hub model {name_or_path!s} ({offline}no local directory of that name either)"
        raise ModelLoadError(f"{what}: {err}") from None
    except SafetensorError as err:
        raise ModelLoadError(
            f"cannot load model {name_or_path!s}: its safetensors weights are corrupt or truncated ({err}); "
            "re-run the stage that wrote it"
        ) from None
    except pickle.UnpicklingError as err:  # a hub model with .bin weights only (local ones are checked first)
        raise code_in_pickle(f"model {name_or_path!s}: its weights file", err) from None
    ensure_chat_template(tokenizer)
    clear_backend_limits(tokenizer)  # so no exported tokenizer.json carries a hidden cut either
    if trained_head:
        require_trained_head(hf.config, name_or_path)
    ensure_pad_token(tokenizer, hf)
    disable_dropout(hf)
    return RewardModel(hf, pair_forward), tokenizer


def save_reward_model(model: nn.Module, tokenizer, out_dir: str | Path) -> None:
    """Write a plain HF directory atomically; LoRA adapters are merged first."""
    quiet_transformers()
    hf = model.hf if isinstance(model, RewardModel) else model
    if hasattr(hf, "merge_and_unload"):
        hf = hf.merge_and_unload()
    ensure_chat_template(tokenizer)
    mark_trained_head(hf.config)
    with atomic_path(out_dir, directory=True) as tmp:
        hf.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
