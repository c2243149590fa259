"""Pairs → token ids with a response-token mask, and the batches the training loop consumes.

The prompt and the response are tokenised separately and concatenated, so the
response mask is exact (no offset arithmetic on rendered text). Truncation
removes the prompt from the left first (the end of a dialogue matters most),
then the response from the right; a pair that keeps too few response tokens on
either side is skipped and counted, so no loss ever divides by an empty mask.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from prefshift.config import EncodeConfig
from prefshift.data.schema import Pair, RowError, SkipCounter

SIDES = ("chosen", "rejected")


@dataclass(frozen=True)
class EncodedSeq:
    input_ids: list[int]
    response_mask: list[int]
    response_tokens: int
    """Response length before truncation (used for length-bias analysis)."""


@dataclass(frozen=True)
class EncodedPair:
    index: int
    pair_id: str
    chosen: EncodedSeq
    rejected: EncodedSeq
    target: float

    @property
    def length(self) -> int:
        return max(len(self.chosen.input_ids), len(self.rejected.input_ids))


def _plain_transcript(messages: Sequence[dict[str, str]]) -> str:
    return "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant: "


def render(tokenizer, prompt: Sequence[dict[str, str]], response: str) -> tuple[str, str]:
    """(prompt text, response text); the chat template when the tokenizer has one."""
    if getattr(tokenizer, "chat_template", None):
        head = tokenizer.apply_chat_template(list(prompt), tokenize=False, add_generation_prompt=True)
        full = tokenizer.apply_chat_template(
            [*prompt, {"role": "assistant", "content": response}], tokenize=False
        )
        if full.startswith(head):
            return head, full[len(head) :]
        return head, response
    return _plain_transcript(prompt), response


def _special_frame(tokenizer) -> tuple[list[int], list[int], list[int]]:
    """Token ids placed before the prompt, between prompt and response, and after the response.

    Encoders read [CLS] and expect [SEP]s; decoders get their BOS unless a chat template
    already writes it into the text.
    """
    cls_id, sep_id = tokenizer.cls_token_id, tokenizer.sep_token_id
    if cls_id is not None and sep_id is not None:
        return [cls_id], [sep_id], [sep_id]
    bos = tokenizer.bos_token_id
    if bos is None or getattr(tokenizer, "chat_template", None):
        return [], [], []
    return [bos], [], []


class Encoder:
    """Turns pairs into `EncodedPair`s under one truncation policy."""

    def __init__(self, tokenizer, cfg: EncodeConfig):
        self.tokenizer = tokenizer
        self.cfg = cfg
        self.head, self.mid, self.tail = _special_frame(tokenizer)

    def _ids(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def encode_one(self, prompt: Sequence[dict[str, str]], response: str) -> EncodedSeq:
        prompt_text, response_text = render(self.tokenizer, prompt, response)
        prompt_ids, response_ids = self._ids(prompt_text), self._ids(response_text)
        full_response = len(response_ids)
        budget = self.cfg.max_length - len(self.head) - len(self.mid) - len(self.tail)
        overflow = len(prompt_ids) + len(response_ids) - budget
        if overflow > 0:
            cut = min(overflow, len(prompt_ids))
            prompt_ids = prompt_ids[cut:]
            overflow -= cut
        if overflow > 0:
            response_ids = response_ids[: max(0, len(response_ids) - overflow)]
        ids = self.head + prompt_ids + self.mid + response_ids + self.tail
        start = len(self.head) + len(prompt_ids) + len(self.mid)
        mask = [0] * len(ids)
        mask[start : start + len(response_ids)] = [1] * len(response_ids)
        return EncodedSeq(ids, mask, full_response)

    def encode_pair(self, index: int, pair: Pair, target: float) -> EncodedPair:
        seqs = [self.encode_one(pair.prompt, getattr(pair, side)) for side in SIDES]
        for side, seq in zip(SIDES, seqs, strict=True):
            kept = sum(seq.response_mask)
            if kept < self.cfg.min_response_tokens:
                raise RowError(
                    "response_truncated",
                    f"pair {pair.pair_id}: {side} response keeps {kept} tokens after truncation to "
                    f"encode.max_length={self.cfg.max_length} (< encode.min_response_tokens="
                    f"{self.cfg.min_response_tokens})",
                )
        return EncodedPair(index, pair.pair_id, seqs[0], seqs[1], float(target))

    def encode_pairs(
        self, pairs: Sequence[Pair], targets: Sequence[float] | None = None, skips: SkipCounter | None = None
    ) -> list[EncodedPair]:
        """Encode every pair; `targets` default to gold. Skipped pairs are counted in `skips`."""
        skips = skips if skips is not None else SkipCounter()
        targets = targets if targets is not None else [p.gold for p in pairs]
        out = []
        for i, (pair, target) in enumerate(zip(pairs, targets, strict=True)):
            try:
                out.append(self.encode_pair(i, pair, target))
            except RowError as err:
                skips.skip(err)
        skips.kept += len(out)
        return out


def length_grouped_batches(
    lengths: Sequence[int], batch_size: int, seed: int, mega: int = 50
) -> list[list[int]]:
    """Seeded shuffle, then sort by length inside mega-batches: little padding, still random order."""
    rng = random.Random(seed)
    order = list(range(len(lengths)))
    rng.shuffle(order)
    span = batch_size * mega
    batches = []
    for start in range(0, len(order), span):
        chunk = sorted(order[start : start + span], key=lambda i: -lengths[i])
        batches.extend(chunk[j : j + batch_size] for j in range(0, len(chunk), batch_size))
    rng.shuffle(batches)
    return batches


def sorted_batches(lengths: Sequence[int], batch_size: int) -> list[list[int]]:
    """Length-sorted batches for inference (deterministic, minimal padding)."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    return [order[j : j + batch_size] for j in range(0, len(order), batch_size)]


def pad_sequences(
    seqs: Sequence[EncodedSeq], pad_id: int, padding_side: str = "right"
) -> dict[str, torch.Tensor]:
    """Dynamic padding to the longest sequence: input_ids, attention_mask, response_mask."""
    width = max(len(s.input_ids) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(seqs), width), dtype=torch.long)
    resp = torch.zeros((len(seqs), width), dtype=torch.bool)
    for row, seq in enumerate(seqs):
        n = len(seq.input_ids)
        cols = slice(width - n, width) if padding_side == "left" else slice(0, n)
        ids[row, cols] = torch.tensor(seq.input_ids)
        attn[row, cols] = 1
        resp[row, cols] = torch.tensor(seq.response_mask, dtype=torch.bool)
    return {"input_ids": ids, "attention_mask": attn, "response_mask": resp}


def collate(
    items: Sequence[EncodedPair], pad_id: int, padding_side: str = "right"
) -> dict[str, torch.Tensor | list]:
    """One batch of 2B sequences: the B chosen rows, then the B rejected rows."""
    seqs = [it.chosen for it in items] + [it.rejected for it in items]
    return {
        **pad_sequences(seqs, pad_id, padding_side),
        "targets": torch.tensor([it.target for it in items], dtype=torch.float32),
        "keys": [(it.pair_id, side) for side in SIDES for it in items],
        "index": [it.index for it in items],
    }
