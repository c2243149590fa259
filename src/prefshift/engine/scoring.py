"""Inference with a trained reward model: margins for pairs, rewards for best-of-n groups.

Label (teacher) and evaluate (students) both score through here, so a model is
always read under the same encoding and truncation it was trained with.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from prefshift.config.params import Params
from prefshift.core.errors import PrefshiftError
from prefshift.core.progress import track
from prefshift.data.encode import (
    EncodedPair,
    Encoder,
    TruncationCount,
    collate,
    pad_sequences,
    sorted_batches,
)
from prefshift.data.schema import Group, Pair, RowError, SkipCounter
from prefshift.models.reward import RewardModel, load_reward_model

PAIR_COLUMNS = ["pair_id", "delta", "gold", "len_chosen", "len_rejected", "reward_chosen", "reward_rejected"]


def load_for_scoring(model_dir: str | Path, params: Params):
    """(RewardModel in eval mode on the best device, tokenizer); a model without a trained head is refused."""
    model, tokenizer = load_reward_model(
        model_dir,
        trust_remote_code=params.backbone.trust_remote_code,
        trained_head=True,
        pair_forward=params.encode.pair_forward,
    )
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model.to(device)
    model.eval()
    return model, tokenizer


class NonFiniteRewardError(PrefshiftError):
    """A model that gives NaN or an infinite reward: its weights are broken, so nothing it scores stands."""


def _rewards(model: RewardModel, batch: dict) -> torch.Tensor:
    """Rewards of one batch, refused unless every one is finite (checked where they are produced).
    A batch with `groups` (rows that share a prompt) may compute their common prefix once."""
    device = next(model.parameters()).device
    groups = batch["groups"].to(device) if "groups" in batch else None
    out = model(batch["input_ids"].to(device), batch["attention_mask"].to(device), groups=groups)
    rewards = out.rewards.float().cpu()
    if not torch.isfinite(rewards).all():
        count = int((~torch.isfinite(rewards)).sum())
        raise NonFiniteRewardError(
            f"the reward model gave {count} non-finite reward(s) (NaN or infinity) in a batch of "
            f"{len(rewards)}: its weights are broken (diverged training or a damaged file); retrain it"
        )
    return rewards


def score_pairs(
    model: RewardModel,
    tokenizer,
    pairs: Sequence[Pair],
    params: Params,
    skips: SkipCounter | None = None,
    label: str = "score pairs",
) -> pd.DataFrame:
    """Δ = r(chosen) - r(rejected) per pair, with both rewards; len_* are response token counts
    before truncation.

    Pairs whose response does not survive truncation are left out and counted in `skips`;
    `attrs["truncation"]` counts the pairs truncation cut (`TruncationCount`). A pair whose two
    sides encode to the same tokens is an exact tie (Δ = 0, one reward for both): two rows of a
    batch can differ in the last bits, and a tie must not count as a win. `label` names the pass
    in its progress lines.
    """
    skips = skips if skips is not None else SkipCounter()
    truncation = TruncationCount()
    items = Encoder(tokenizer, params.encode).encode_pairs(pairs, skips=skips, truncation=truncation)
    if model.pair_path() == "shared_prefix":
        scored = _pair_rewards(model, tokenizer, items, params.evaluate.batch_size, label)
    else:
        scored = _distinct_rewards(model, tokenizer, items, params.evaluate.batch_size, label)
    rows = []
    for item, (r_chosen, r_rejected) in zip(items, scored, strict=True):
        delta = r_chosen - r_rejected
        if item.chosen.input_ids == item.rejected.input_ids:
            delta, r_rejected = 0.0, r_chosen
        lengths = (item.chosen.response_tokens, item.rejected.response_tokens)
        rows.append((item.index, item.pair_id, delta, item.target, *lengths, r_chosen, r_rejected))
    rows.sort()
    frame = pd.DataFrame([row[1:] for row in rows], columns=PAIR_COLUMNS)
    frame.attrs["skips"] = skips.as_dict()
    frame.attrs["truncation"] = truncation.as_dict()
    return frame


def _pair_rewards(
    model: RewardModel, tokenizer, items: Sequence[EncodedPair], batch_size: int, label: str
) -> list[tuple[float, float]]:
    """(chosen, rejected) rewards per item, a pair's two sides in one batch: the shared-prefix
    forward computes their common prompt once."""
    out: list[tuple[float, float]] = [(0.0, 0.0)] * len(items)
    with torch.inference_mode():
        for idx in track(sorted_batches([it.length for it in items], batch_size), label, len(items)):
            chunk = [items[i] for i in idx]
            rewards = _rewards(model, collate(chunk, tokenizer.pad_token_id)).tolist()
            for k, i in enumerate(idx):
                out[i] = (rewards[k], rewards[len(chunk) + k])
    return out


def _distinct_rewards(
    model: RewardModel, tokenizer, items: Sequence[EncodedPair], batch_size: int, label: str
) -> list[tuple[float, float]]:
    """(chosen, rejected) rewards per item, each distinct token sequence scored once.

    Benchmark pairs share responses (RM-Bench's nine pairs per record come from six responses; a
    chat target's 2 x 1,341 sequences held 942 distinct ones), and a response's reward depends on
    its tokens alone when sequences go through the model separately. Batches hold 2 x batch_size
    sequences, as a batch of pairs does, sorted by length.
    """
    index: dict[tuple[int, ...], int] = {}
    seqs = []
    for item in items:
        for seq in (item.chosen, item.rejected):
            key = tuple(seq.input_ids)
            if key not in index:
                index[key] = len(seqs)
                seqs.append(seq)
    rewards = [0.0] * len(seqs)
    with torch.inference_mode():
        batches = sorted_batches([len(seq.input_ids) for seq in seqs], 2 * batch_size)
        for idx in track(batches, label, len(seqs), "sequences"):
            batch = pad_sequences([seqs[i] for i in idx], tokenizer.pad_token_id)
            for i, value in zip(idx, _rewards(model, batch).tolist(), strict=True):
                rewards[i] = value
    return [
        (rewards[index[tuple(it.chosen.input_ids)]], rewards[index[tuple(it.rejected.input_ids)]])
        for it in items
    ]


def reward_stats(model: RewardModel, tokenizer, pairs: Sequence[Pair], params: Params) -> dict[str, float]:
    """`rewards_mean_std` of the model's scores of `pairs`."""
    return rewards_mean_std(score_pairs(model, tokenizer, pairs, params))


def rewards_mean_std(frame: pd.DataFrame) -> dict[str, float]:
    """{"mean", "std"} of the rewards of both responses of every scored pair: OpenRLHF's `mean`/`std`
    config keys. std is the sample standard deviation, floored at 1e-8 so normalising never divides
    by zero."""
    if frame.empty:
        raise RowError("no_pairs", "no pair survives encoding, so the reward mean/std are undefined")
    values = np.concatenate([frame["reward_chosen"], frame["reward_rejected"]]).astype(np.float64)
    std = float(values.std(ddof=1)) if len(values) > 1 else 0.0
    stats = {"mean": float(values.mean()), "std": max(std, 1e-8)}
    if not all(np.isfinite(list(stats.values()))):
        raise NonFiniteRewardError(f"the reward mean/std are not finite ({stats}); the rewards overflow")
    return stats


def score_groups(
    model: RewardModel, tokenizer, groups: Sequence[Group], params: Params, label: str = "score responses"
) -> pd.DataFrame:
    """One reward per response of each group (group_id, rewards: list[float]), same order as given.

    Responses of a group that encode to the same tokens get the same reward (the first one's),
    so identical texts tie exactly; `attrs["truncation"]` counts the groups truncation cut.
    """
    encoder = Encoder(tokenizer, params.encode)
    records = []
    skips = SkipCounter()
    truncation = TruncationCount()
    for group in groups:
        seqs = encoder.encode_many([(group.prompt, response) for response in group.responses])
        if seqs:
            truncation.add(seqs)
        if any(sum(seq.response_mask) < params.encode.min_response_tokens for seq in seqs):
            skips.skip(
                RowError("response_truncated", f"group {group.group_id}: a response is truncated away")
            )
        elif seqs:
            records.append((group.group_id, seqs))
    flat = [(g, j, seq) for g, (_, seqs) in enumerate(records) for j, seq in enumerate(seqs)]
    rewards: dict[tuple[int, int], float] = {}
    with torch.inference_mode():
        if model.pair_path() == "shared_prefix":
            batches = group_batches([len(seqs) for _, seqs in records], params.evaluate.batch_size, flat)
        else:
            batches = sorted_batches([len(seq.input_ids) for _, _, seq in flat], params.evaluate.batch_size)
        for idx in track(batches, label, len(flat), "responses"):
            batch = pad_sequences([flat[i][2] for i in idx], tokenizer.pad_token_id)
            if model.pair_path() == "shared_prefix":
                batch["groups"] = torch.tensor([flat[i][0] for i in idx]).unique(return_inverse=True)[1]
            for i, value in zip(idx, _rewards(model, batch).tolist(), strict=True):
                rewards[flat[i][:2]] = value
    skips.kept = len(records)
    frame = pd.DataFrame(
        [
            (gid, [rewards[(g, _first_same(seqs, j))] for j in range(len(seqs))])
            for g, (gid, seqs) in enumerate(records)
        ],
        columns=["group_id", "rewards"],
    )
    frame.attrs["skips"] = skips.as_dict()
    frame.attrs["truncation"] = truncation.as_dict()
    return frame


def group_batches(sizes: Sequence[int], batch_size: int, flat: Sequence[tuple]) -> list[list[int]]:
    """Batches of `flat`'s indices that keep each group whole (so its responses can share their
    prompt), groups sorted longest first, each batch closed once it holds `batch_size` responses."""
    starts = [0]
    for size in sizes:
        starts.append(starts[-1] + size)
    longest = [max(len(flat[i][2].input_ids) for i in range(a, b)) for a, b in itertools.pairwise(starts)]
    batches: list[list[int]] = [[]]
    for g in sorted(range(len(sizes)), key=lambda g: -longest[g]):
        if batches[-1] and len(batches[-1]) + sizes[g] > batch_size:
            batches.append([])
        batches[-1].extend(range(starts[g], starts[g + 1]))
    return [batch for batch in batches if batch]


def _first_same(seqs: Sequence, j: int) -> int:
    """The first response of a group encoded to the same tokens as response `j`."""
    return next(i for i in range(j + 1) if seqs[i].input_ids == seqs[j].input_ids)


def score_samples(
    model: RewardModel, tokenizer, samples: pd.DataFrame, params: Params, label: str = "score samples"
) -> pd.DataFrame:
    """One reward per policy sample (unit, sample, reward), through `score_groups` (one group per prompt).

    A prompt any of whose samples is truncated away is left out whole (and counted in
    `attrs["skips"]`), so every kept prompt has all its samples and best-of-n stays exact.
    """
    import json

    groups = [
        Group(
            unit,
            rows["dataset"].iloc[0],
            rows["category"].iloc[0],
            json.loads(rows["prompt"].iloc[0]),
            list(rows.sort_values("sample")["response"]),
            [0.0] * len(rows),
        )
        for unit, rows in samples.groupby("unit", sort=False)
    ]
    scored = score_groups(model, tokenizer, groups, params, label)
    frame = scored.explode("rewards").rename(columns={"group_id": "unit", "rewards": "reward"})
    frame["sample"] = frame.groupby("unit").cumcount()
    frame = frame[["unit", "sample", "reward"]].astype({"reward": float}).reset_index(drop=True)
    frame.attrs["skips"] = scored.attrs["skips"]
    return frame
