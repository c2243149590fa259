"""How far training moved a reward model's representation where the reward is read.

The mechanism ANCHOR and the robust fine-tuning family act on is drift from the starting
checkpoint. The training log's drift rows follow it during training on a probe batch, layer by
layer, over response tokens; this measures the finished model (after any post-training step,
such as WiSE-FT's interpolation) at the one place its head reads: the final layer's hidden state
at the reward position, against the start's, on the first READ_PAIRS id_test pairs.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from prefshift.config.params import Params
from prefshift.data.encode import Encoder, collate, sorted_batches
from prefshift.data.schema import Pair
from prefshift.models.reward import RewardModel, reading_states

READ_PAIRS = 256
"""Pairs read (both responses): the same fixed sample for every method of a run, and cheap next
to training on any backbone."""


def reading_rows(model: RewardModel, tokenizer, pairs: Sequence[Pair], params: Params) -> torch.Tensor:
    """[2N, H] final-layer states at the reward position of the first READ_PAIRS pairs (chosen
    rows then rejected rows per batch, in a fixed batch order), on the CPU in float32. Run in
    eval mode, so no dropout and no random numbers are drawn; the model's mode is restored."""
    items = Encoder(tokenizer, params.encode).encode_pairs(list(pairs)[:READ_PAIRS])
    batches = sorted_batches([it.length for it in items], params.evaluate.batch_size)
    device = next(model.parameters()).device
    training = model.training
    model.eval()
    rows = []
    try:
        with torch.inference_mode():
            for idx in batches:
                batch = collate([items[i] for i in idx], tokenizer.pad_token_id)
                states = reading_states(
                    model,
                    batch["input_ids"].to(device),
                    batch["attention_mask"].to(device),
                    [model.num_layers],
                    batch["groups"].to(device),
                )
                rows.append(states[model.num_layers].float().cpu())
    finally:
        model.train(training)
    return torch.cat(rows) if rows else torch.zeros(0, 0)


def mean_cosine(start: torch.Tensor, current: torch.Tensor) -> float | None:
    """Mean over rows of cos(start_i, current_i); None when there are no rows."""
    if start.shape != current.shape:
        raise ValueError(
            f"reading states of different shapes: {tuple(start.shape)} vs {tuple(current.shape)}"
        )
    if start.shape[0] == 0:
        return None
    return F.cosine_similarity(start, current, dim=-1).mean().item()
