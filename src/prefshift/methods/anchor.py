"""ANCHOR: the weak-to-strong loss plus a pull towards the starting checkpoint's representations.

L = L_w2s + λ · mean over the chosen layers, response tokens (prompt and padding
excluded) and hidden dims of (h_student - h_ref)². The reference states come from
the frozen starting checkpoint (see prefshift.engine.anchor_cache and prefshift.engine.reference_store).
With `normalize="reference"` each layer's MSE is divided by that layer's mean squared
reference activation over response tokens (`scale`), which makes λ scale-free: λ = 1
weighs a drift as large as the representation itself like one nat of w2s loss.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from prefshift.methods.base import BatchOut, Objective, soft_bt_loss
from prefshift.methods.layers import AnchorError


def select_response(
    hidden_states: Sequence[torch.Tensor], layers: Sequence[int], response_mask: torch.Tensor
) -> torch.Tensor:
    """(K, N, D): the chosen layers at the N response tokens, rows in batch order."""
    return torch.stack([hidden_states[k][response_mask] for k in layers])


def anchor_mse(student: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """Mean over layers, tokens and dims; an empty selection contributes zero (never 0/0)."""
    return layer_mse(student, reference).mean()


def layer_mse(student: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """(K,) mean over tokens and dims per layer; an empty selection gives zeros (never 0/0)."""
    if student.numel() == 0:
        return student.sum(dim=(1, 2))
    return (student.float() - reference.float()).pow(2).mean(dim=(1, 2))


@dataclass
class AnchorObjective(Objective):
    lam: float = 1e-4
    normalize: str = "none"
    scale: tuple[float, ...] | None = None
    """Per-layer mean squared reference activation (same order as `layers`), for normalize=reference."""

    def __post_init__(self) -> None:
        if not self.lam >= 0:
            raise AnchorError(f"anchor.lambda must be >= 0, got {self.lam}")
        if not self.layers:
            raise AnchorError("anchor objective needs at least one layer")
        if self.normalize not in ("none", "reference"):
            raise AnchorError(f"anchor.normalize must be none or reference, got {self.normalize!r}")

    def set_scale(self, mean_squares: dict[int, float]) -> None:
        """Take the reference's per-layer mean squared activation (keyed by hidden_states index)."""
        missing = [k for k in self.layers if k not in mean_squares]
        if missing:
            raise AnchorError(f"reference has no mean squared activation for layer(s) {missing}")
        bad = [k for k in self.layers if not mean_squares[k] > 0]
        if bad:
            raise AnchorError(f"reference states of layer(s) {bad} are all zero: cannot normalise by them")
        self.scale = tuple(float(mean_squares[k]) for k in self.layers)

    def loss(self, out: BatchOut, step: int, total_steps: int) -> tuple[torch.Tensor, dict[str, float]]:
        w2s = soft_bt_loss(out.delta, out.targets)
        if out.hidden_states is None or out.reference is None or out.response_mask is None:
            raise AnchorError("anchor objective called without hidden states and reference states")
        student = select_response(out.hidden_states, self.layers, out.response_mask)
        per_layer = layer_mse(student, out.reference)
        penalty = per_layer.mean()
        if self.normalize == "reference":
            if self.scale is None:
                raise AnchorError("anchor.normalize=reference needs the reference's mean squared activations")
            penalty = (per_layer / torch.tensor(self.scale, device=per_layer.device)).mean()
        term = self.lam * penalty
        total = w2s + term
        share = (term / total).item() if total.item() > 0 else 0.0
        return total, {"w2s": w2s.item(), "anchor_mse": per_layer.mean().item(), "anchor_share": share}
