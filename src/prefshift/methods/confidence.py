"""Auxiliary confidence loss (Burns et al. 2023), pairwise form.

The student's own hardened predictions pull it away from imitating the teacher's
mistakes; the threshold is a batch quantile so the share of hard positives equals
the teacher's mean label, and the weight ramps up linearly over a warmup.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from prefshift.methods.base import BatchOut, Objective


def confidence_alpha(alpha: float, warmup_frac: float, step: int, total_steps: int) -> float:
    """α_t = α · min(1, t / (w · T)); no warmup means the full weight from the start."""
    ramp = warmup_frac * total_steps
    return alpha if ramp <= 0 else alpha * min(1.0, step / ramp)


def hardened_predictions(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """h_i = 1[p_i > τ], τ the (1 - mean q) quantile of p: mean(h) matches mean(q). Detached."""
    p = p.detach()
    tau = torch.quantile(p, (1.0 - q.mean()).clamp(0.0, 1.0).to(p.dtype))
    return (p > tau).to(p.dtype)


def confidence_loss(
    delta: torch.Tensor, q: torch.Tensor, alpha: float, warmup_frac: float, step: int, total_steps: int
) -> tuple[torch.Tensor, float]:
    """BCE(p, (1 - α_t) q + α_t h); returns (loss, α_t)."""
    alpha_t = confidence_alpha(alpha, warmup_frac, step, total_steps)
    h = hardened_predictions(torch.sigmoid(delta), q)
    target = (1.0 - alpha_t) * q + alpha_t * h
    return F.binary_cross_entropy_with_logits(delta, target), alpha_t


@dataclass
class ConfidenceObjective(Objective):
    alpha: float = 0.5
    warmup_frac: float = 0.1

    def loss(self, out: BatchOut, step: int, total_steps: int) -> tuple[torch.Tensor, dict[str, float]]:
        loss, alpha_t = confidence_loss(
            out.delta, out.targets, self.alpha, self.warmup_frac, step, total_steps
        )
        return loss, {"alpha_t": alpha_t}
