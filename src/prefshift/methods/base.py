"""The one interface between the training loop and a training objective.

The loop runs chosen and rejected rows through the model in one forward pass and
hands the objective a `BatchOut`; the objective returns a scalar loss and a dict of
numbers to log. Objectives that need hidden states say which layers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F


@dataclass
class BatchOut:
    delta: torch.Tensor
    """r(chosen) - r(rejected), shape (B,)."""
    targets: torch.Tensor
    """Soft preference targets in [0, 1] (gold, q, or seam labels), shape (B,)."""
    hidden_states: tuple[torch.Tensor, ...] | None = None
    response_mask: torch.Tensor | None = None
    """(2B, T) bool: response tokens of the chosen rows then the rejected rows."""
    reference: torch.Tensor | None = None
    """(K, N, D) reference states at the response tokens, for anchor objectives."""
    input_ids: torch.Tensor | None = None
    """(2B, T) token ids, chosen rows then rejected rows, for objectives that model the text."""


def soft_bt_loss(delta: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Bradley-Terry with soft targets: -[t log σ(Δ) + (1-t) log(1-σ(Δ))]; t = 1 gives -log σ(Δ)."""
    return F.binary_cross_entropy_with_logits(delta, target)


@dataclass
class Objective:
    """Bradley-Terry on soft targets: the teacher, ceiling, naive and seam objective."""

    name: str
    layers: tuple[int, ...] = field(default=())
    """hidden_states indices the objective reads; empty = none."""
    compares_to_start: bool = True
    """Whether it reads the starting checkpoint's states at `layers` (ANCHOR does; GRM reads only
    the student's own), so the loop and the reference stage provide them."""

    @property
    def reference_layers(self) -> tuple[int, ...]:
        """The layers whose starting states the loop must provide: `layers`, or none."""
        return self.layers if self.compares_to_start else ()

    def loss(self, out: BatchOut, step: int, total_steps: int) -> tuple[torch.Tensor, dict[str, float]]:
        loss = soft_bt_loss(out.delta, out.targets)
        return loss, {}
