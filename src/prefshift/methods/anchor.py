"""ANCHOR: the weak-to-strong loss plus a pull towards the starting checkpoint's representations.

L = L_w2s + λ · mean over the chosen layers, response tokens (prompt and padding
excluded) and hidden dims of (h_student - h_ref)². The reference states come from
the frozen starting checkpoint (see prefshift.anchor_cache).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from prefshift.errors import PrefshiftError
from prefshift.methods.base import BatchOut, Objective, soft_bt_loss


class AnchorError(PrefshiftError, ValueError):
    """Anchor settings that cannot work with this model; raised before training starts."""


def anchor_layers(kind: str, num_layers: int, mid_fractions: Sequence[float]) -> tuple[int, ...]:
    """hidden_states indices: `last` = L (final layer output); `mid` = round(f · L), halves up."""
    if kind == "last":
        layers = (num_layers,)
    elif kind == "mid":
        layers = tuple(sorted({math.floor(f * num_layers + 0.5) for f in mid_fractions}))
    else:
        raise AnchorError(f"unknown anchor kind {kind!r} (last|mid)")
    for layer in layers:
        if not 1 <= layer <= num_layers:
            raise AnchorError(
                f"anchor layer {layer} is out of range for a model with {num_layers} layers "
                f"(anchor.mid_fractions={list(mid_fractions)})"
            )
    return layers


def select_response(
    hidden_states: Sequence[torch.Tensor], layers: Sequence[int], response_mask: torch.Tensor
) -> torch.Tensor:
    """(K, N, D): the chosen layers at the N response tokens, rows in batch order."""
    return torch.stack([hidden_states[k][response_mask] for k in layers])


def anchor_mse(student: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """Mean over layers, tokens and dims; an empty selection contributes zero (never 0/0)."""
    if student.numel() == 0:
        return student.sum()
    return (student.float() - reference.float()).pow(2).mean()


@dataclass
class AnchorObjective(Objective):
    lam: float = 1e-4

    def __post_init__(self) -> None:
        if not self.lam >= 0:
            raise AnchorError(f"anchor.lambda must be >= 0, got {self.lam}")
        if not self.layers:
            raise AnchorError("anchor objective needs at least one layer")

    def loss(self, out: BatchOut, step: int, total_steps: int) -> tuple[torch.Tensor, dict[str, float]]:
        w2s = soft_bt_loss(out.delta, out.targets)
        if out.hidden_states is None or out.reference is None or out.response_mask is None:
            raise AnchorError("anchor objective called without hidden states and reference states")
        mse = anchor_mse(select_response(out.hidden_states, self.layers, out.response_mask), out.reference)
        return w2s + self.lam * mse, {"w2s": w2s.item(), "anchor_mse": mse.item()}
