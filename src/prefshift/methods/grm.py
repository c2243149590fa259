"""GRM's loss: the reward loss plus a text-generation regulariser on the chosen responses, read
through the start's language-model head (Yang et al., NeurIPS 2024, "Regularizing Hidden States
Enables Learning Generalizable Reward Model for LLMs", arXiv 2406.10216).

L = (1 − w) · BT(Δ, q) + w · R, with R = mean over chosen responses of −log σ(β · log p(y | x)),
log p the summed log-probability of the response tokens under the LM head applied to the
student's final hidden states. The paper's most stable variant (SFT on the chosen responses);
w = 0.01 and β = 0.1 are the authors' defaults.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from prefshift.methods.base import BatchOut, Objective, soft_bt_loss


def response_log_probs(
    hidden: torch.Tensor, lm_head: torch.Tensor, input_ids: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """(B,) Σ_t log p(x_{t+1} | x_≤t) over the positions whose next token is a response token.

    `hidden` (B, T, H) final-layer states, `lm_head` (V, H), `input_ids` and `mask` (B, T).
    Logits are formed only at those positions (N × V, never B × T × V).
    """
    targets = mask[:, 1:].bool()
    rows = torch.arange(hidden.shape[0], device=hidden.device).unsqueeze(1).expand_as(targets)[targets]
    states = hidden[:, :-1][targets]
    logits = states.float() @ lm_head.float().T
    picked = logits.log_softmax(-1).gather(-1, input_ids[:, 1:][targets].unsqueeze(-1)).squeeze(-1)
    return torch.zeros(hidden.shape[0], device=hidden.device).index_add(0, rows, picked)


@dataclass
class GRMObjective(Objective):
    weight: float = 0.01
    beta: float = 0.1
    lm_head: torch.Tensor | None = None
    """(V, H): the start's language-model head, frozen (see prefshift.methods.builtin.grm)."""
    compares_to_start: bool = False

    def loss(self, out: BatchOut, step: int, total_steps: int) -> tuple[torch.Tensor, dict[str, float]]:
        if (
            self.lm_head is None
            or out.hidden_states is None
            or out.input_ids is None
            or out.response_mask is None
        ):
            raise ValueError("GRM objective needs the LM head, the final hidden states, the ids and the mask")
        if self.lm_head.device != out.delta.device:
            self.lm_head = self.lm_head.to(out.delta.device)
        reward = soft_bt_loss(out.delta, out.targets)
        chosen = out.delta.shape[0]
        hidden = out.hidden_states[self.layers[0]][:chosen]
        logp = response_log_probs(hidden, self.lm_head, out.input_ids[:chosen], out.response_mask[:chosen])
        regulariser = -F.logsigmoid(self.beta * logp).mean()
        total = (1.0 - self.weight) * reward + self.weight * regulariser
        return total, {"w2s": reward.item(), "grm_reg": regulariser.item(), "chosen_logp": logp.mean().item()}
