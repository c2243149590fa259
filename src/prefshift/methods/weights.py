"""Staying close to the start in weight space: the robust fine-tuning family's operations.

ANCHOR keeps the student's hidden states near its starting checkpoint's; these keep the weights
near it (L2-SP's penalty), interpolate them back towards it (WiSE-FT), or do not move them at
all (a linear probe; LP-FT's first phase). Each works on the backbone only: the scalar head is
new, so it has no pretrained start to stay near (`prefshift.models.reward.head_parameter_names`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import torch

from prefshift.core.errors import PrefshiftError
from prefshift.methods.base import BatchOut, Objective, soft_bt_loss


class FullWeightsError(PrefshiftError, ValueError):
    """A method that acts on the full weights, asked to run with LoRA adapters."""


def require_full_weights(name: str, lora_enabled: bool) -> None:
    """Refuse LoRA before training: these methods freeze, penalise or interpolate the backbone's
    own weights, which LoRA leaves frozen (only its adapters train)."""
    if lora_enabled:
        raise FullWeightsError(
            f"{name} acts on the backbone's full weights, which LoRA keeps frozen; "
            "set student.lora.enabled: false, or drop it from methods"
        )


def freeze_all_but(model: torch.nn.Module, trainable: Iterable[str]) -> None:
    """requires_grad only for the parameters named in `trainable` (names as `named_parameters`)."""
    keep = set(trainable)
    for name, param in model.named_parameters():
        param.requires_grad = name in keep


def squared_distance(pairs: Iterable[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """Σ over every (θ, θ₀) pair and element of (θ − θ₀)²; 0 for no pairs."""
    total = torch.zeros(())
    for current, start in pairs:
        total = total.to(current.device) + (current - start).pow(2).sum()
    return total


@dataclass
class L2SPObjective(Objective):
    """Bradley-Terry on the targets + λ · ||θ − θ₀||² over the backbone's weights (Li et al.,
    ICML 2018, "Explicit Inductive Bias for Transfer Learning with Convolutional Networks": their
    Ω = α/2 · ||w − w⁰||², so λ = α/2). `bind` records θ₀ before training starts."""

    lam: float = 0.005
    start: list[tuple[torch.nn.Parameter, torch.Tensor]] = field(default_factory=list, repr=False)

    def bind(self, model: torch.nn.Module, exclude: Iterable[str]) -> None:
        skip = set(exclude)
        self.start = [(p, p.detach().clone()) for n, p in model.named_parameters() if n not in skip]

    def loss(self, out: BatchOut, step: int, total_steps: int) -> tuple[torch.Tensor, dict[str, float]]:
        if not self.start:
            raise ValueError("L2-SP objective used before bind(model): it has no starting weights")
        if self.start[0][1].device != self.start[0][0].device:  # the loop moved the model after bind
            self.start = [(p, p0.to(p.device)) for p, p0 in self.start]
        w2s = soft_bt_loss(out.delta, out.targets)
        distance = squared_distance(self.start)
        term = self.lam * distance
        total = w2s + term
        share = (term / total).item() if total.item() > 0 else 0.0
        return total, {"w2s": w2s.item(), "l2_sp_distance": distance.item(), "l2_sp_share": share}


def interpolate(
    start: Mapping[str, torch.Tensor], tuned: Mapping[str, torch.Tensor], alpha: float, keep: Iterable[str]
) -> dict[str, torch.Tensor]:
    """WiSE-FT's θ_α = (1 − α)·θ₀ + α·θ_ft per tensor (Wortsman et al., CVPR 2022, "Robust
    fine-tuning of zero-shot models"), except the tensors named in `keep`, which stay tuned.
    α = 0 is the start, α = 1 the fine-tuned model. Integer tensors (buffers) stay tuned."""
    kept = set(keep)
    if set(start) != set(tuned):
        raise ValueError(
            f"start and tuned weights name different tensors: {sorted(set(start) ^ set(tuned))[:5]}"
        )
    mixed = {}
    for name, value in tuned.items():
        if name in kept or not value.is_floating_point():
            mixed[name] = value.clone()
        else:
            mixed[name] = (1.0 - alpha) * start[name].to(value.dtype) + alpha * value
    return mixed
