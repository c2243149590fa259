"""Pairs → token ids with a response-token mask, and the batches the training loop consumes.

One rendering. The text a reward model sees is the tokenizer's chat template applied
to prompt + [assistant response] (`render`), and its ids are that text tokenised
once with `add_special_tokens=False`: exactly what TRL's reward path and other RLHF
tools compute, so a model scores the same inside and outside prefshift. A tokenizer
without a template gets prefshift's own (`plain_chat_template`): the "role: content"
transcript with the family's special-token frame written as literal token text (BOS
for decoders; [CLS] prompt [SEP] response [SEP] for BERT-style encoders), which
`load_reward_model` installs and every saved model carries.

The response mask comes from the tokenizer's character offsets, so a token that BPE
merges across the prompt/response boundary is handled exactly (it counts as
response). Truncation keeps the leading special tokens and everything after the
response, removes the prompt from the left first (the end of a dialogue matters
most), then the response from the right; a pair that keeps too few response tokens
on either side is skipped and counted, so no loss ever divides by an empty mask.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from prefshift.config import EncodeConfig
from prefshift.data.schema import Pair, RowError, SkipCounter
from prefshift.errors import PrefshiftError

SIDES = ("chosen", "rejected")
ENCODE_CHUNK = 512
"""Pairs per tokenizer call in `encode_pairs`: one call per chunk, not per text."""


class RenderError(PrefshiftError):
    """A tokenizer or chat template that cannot give an exact response mask."""


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


def _frame(tokenizer) -> tuple[str, str, str]:
    """Special-token text before the transcript, between prompt and response, and after the response."""
    if tokenizer.cls_token and tokenizer.sep_token and tokenizer.cls_token_id is not None:
        return tokenizer.cls_token, tokenizer.sep_token, tokenizer.sep_token
    return tokenizer.bos_token or "", "", ""


def plain_chat_template(tokenizer) -> str:
    """The Jinja template prefshift writes into a tokenizer that ships none.

    Prompt turns render as "role: content\\n", the response as "assistant: " + frame +
    content + frame; the frame tokens are literal text, so tokenising the rendered
    text without special tokens still yields [CLS]/[SEP] or BOS.
    """
    head, mid, tail = (json.dumps(part) for part in _frame(tokenizer))
    return (
        f"{{{{ {head} }}}}"
        "{% for message in messages %}"
        "{% if loop.last and message['role'] == 'assistant' %}"
        f"{{{{ 'assistant: ' + {mid} + message['content'] + {tail} }}}}"
        "{% else %}{{ message['role'] + ': ' + message['content'] + '\\n' }}{% endif %}"
        "{% endfor %}"
        f"{{% if add_generation_prompt %}}{{{{ 'assistant: ' + {mid} }}}}{{% endif %}}"
    )


def chat_template(tokenizer) -> str:
    """The template every rendering uses: the tokenizer's own, else prefshift's plain one."""
    return getattr(tokenizer, "chat_template", None) or plain_chat_template(tokenizer)


def ensure_chat_template(tokenizer) -> None:
    """Install prefshift's plain template where none exists, so a saved tokenizer carries it."""
    if not getattr(tokenizer, "chat_template", None):
        tokenizer.chat_template = plain_chat_template(tokenizer)


_SLOT = "\u2063prefshift-response\u2063"
"""Stands in for the response to find where the template puts it (no template alters it)."""


def _conversation(prompt: Sequence[dict[str, str]], content: str) -> list[dict[str, str]]:
    return [
        *({"role": m["role"], "content": m["content"]} for m in prompt),
        {"role": "assistant", "content": content},
    ]


def _apply(tokenizer, conversations: list[list[dict[str, str]]]) -> list[str]:
    """Texts of several conversations under `chat_template`, in one call (cheaper than one each)."""
    return list(
        tokenizer.apply_chat_template(conversations, chat_template=chat_template(tokenizer), tokenize=False)
    )


def slotted(tokenizer, prompt: Sequence[dict[str, str]]) -> str:
    """The prompt rendered with `_SLOT` as the assistant's content: where any response of it goes."""
    return _apply(tokenizer, [_conversation(prompt, _SLOT)])[0]


def render(
    tokenizer, prompt: Sequence[dict[str, str]], response: str, frame: str | None = None
) -> tuple[str, tuple[int, int]]:
    """(text, (start, end) character span of the response in it) under `chat_template`.

    The span is where the template puts the assistant's content, found in `frame` (the prompt's
    `slotted` rendering; computed here when not given), so a response that also occurs in the
    frame (say "end" in "<|im_end|>") is still located exactly; a template that trims content is
    allowed.
    """
    text = _apply(tokenizer, [_conversation(prompt, response)])[0]
    return text, _locate(text, response, slotted(tokenizer, prompt) if frame is None else frame)


def _locate(text: str, response: str, frame: str) -> tuple[int, int]:
    at = frame.find(_SLOT)
    if at >= 0:
        head, tail = frame[:at], frame[at + len(_SLOT) :]
        if text == head + response + tail:
            return at, at + len(response)
        start = text.find(response.strip(), at)
        if start >= 0 and response.strip():
            return start, start + len(response.strip())
    raise RenderError(
        "the tokenizer's chat template does not write the assistant's content into the text, so the "
        "response tokens cannot be found; use a template that renders message['content']"
    )


class Encoder:
    """Turns pairs into `EncodedPair`s under one truncation policy."""

    def __init__(self, tokenizer, cfg: EncodeConfig):
        if not getattr(tokenizer, "is_fast", False):
            raise RenderError(
                f"{type(tokenizer).__name__} is a slow tokenizer; prefshift needs a fast (Rust) tokenizer "
                "for exact response masks (load it with use_fast=True or convert it)"
            )
        self.tokenizer = tokenizer
        self.cfg = cfg
        self.special = set(tokenizer.all_special_ids)
        self._last_frame: tuple[tuple, str] | None = None

    def encode_one(self, prompt: Sequence[dict[str, str]], response: str) -> EncodedSeq:
        return self.encode_many([(prompt, response)])[0]

    def encode_many(self, requests: Sequence[tuple[Sequence[dict[str, str]], str]]) -> list[EncodedSeq]:
        """(prompt, response) → EncodedSeq, in order, with one tokenizer call for all of them.

        A prompt's frame is rendered once for consecutive requests that share it (both sides of
        a pair, every response of a group): rendering was most of the encoding time.
        """
        if not requests:
            return []
        texts = _apply(self.tokenizer, [_conversation(prompt, response) for prompt, response in requests])
        spans = [
            _locate(text, response, self._frame(prompt))
            for text, (prompt, response) in zip(texts, requests, strict=True)
        ]
        enc = self.tokenizer(texts, add_special_tokens=False, return_offsets_mapping=True)
        return [
            self._cut(ids, offsets, span)
            for ids, offsets, span in zip(enc["input_ids"], enc["offset_mapping"], spans, strict=True)
        ]

    def _frame(self, prompt: Sequence[dict[str, str]]) -> str:
        key = tuple((m["role"], m["content"]) for m in prompt)
        if self._last_frame is None or self._last_frame[0] != key:
            self._last_frame = (key, slotted(self.tokenizer, prompt))
        return self._last_frame[1]

    def _cut(self, ids: list[int], offsets: list[tuple[int, int]], span: tuple[int, int]) -> EncodedSeq:
        """The response mask from the character span, then truncation to `max_length`."""
        start, end = span
        inside = [i for i, (s, e) in enumerate(offsets) if s < end and e > start]
        first = inside[0] if inside else sum(1 for _, e in offsets if e <= start)
        last = inside[-1] + 1 if inside else first
        lead = 0
        while lead < first and ids[lead] in self.special:
            lead += 1
        head, prompt_ids, response_ids, tail = ids[:lead], ids[lead:first], ids[first:last], ids[last:]
        full_response = len(response_ids)
        overflow = len(ids) - self.cfg.max_length
        if overflow > 0:
            cut = min(overflow, len(prompt_ids))
            prompt_ids = prompt_ids[cut:]
            overflow -= cut
        if overflow > 0:
            response_ids = response_ids[: max(0, len(response_ids) - overflow)]
        kept = head + prompt_ids + response_ids + tail
        begin = len(head) + len(prompt_ids)
        mask = [0] * len(kept)
        mask[begin : begin + len(response_ids)] = [1] * len(response_ids)
        return EncodedSeq(kept, mask, full_response)

    def encode_pair(self, index: int, pair: Pair, target: float) -> EncodedPair:
        return self._paired(
            index, pair, target, self.encode_many([(pair.prompt, getattr(pair, side)) for side in SIDES])
        )

    def _paired(self, index: int, pair: Pair, target: float, seqs: Sequence[EncodedSeq]) -> EncodedPair:
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
        if len(targets) != len(pairs):
            raise ValueError(f"{len(targets)} targets for {len(pairs)} pairs")
        out = []
        for start in range(0, len(pairs), ENCODE_CHUNK):
            chunk = pairs[start : start + ENCODE_CHUNK]
            seqs = self.encode_many([(p.prompt, getattr(p, side)) for p in chunk for side in SIDES])
            for offset, pair in enumerate(chunk):
                i = start + offset
                try:
                    out.append(self._paired(i, pair, targets[i], seqs[2 * offset : 2 * offset + 2]))
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
