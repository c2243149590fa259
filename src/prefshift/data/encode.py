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
import math
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from prefshift.config.params import EncodeConfig
from prefshift.core.errors import PrefshiftError
from prefshift.data.schema import Pair, RowError, SkipCounter

SIDES = ("chosen", "rejected")
ENCODE_CHUNK = 512
"""Pairs per tokenizer call in `encode_pairs`: one call per chunk, not per text."""
CHARS_PER_TOKEN = 16
"""Characters kept per token of encode.max_length, per side, before tokenising. Generous (English
runs about 4 per token), and a slice that still yields too few tokens is cut again, wider."""
CUT_MARGIN = 16
"""Tokens a cut slice must yield beyond max_length, so the tokens a cut in the middle of a word
changes lie outside what truncation keeps."""


class RenderError(PrefshiftError):
    """A tokenizer or chat template that cannot give an exact response mask."""


@dataclass(frozen=True)
class EncodedSeq:
    input_ids: list[int]
    response_mask: list[int]
    response_tokens: int
    """Response length before truncation (used for length-bias analysis)."""
    prompt_tokens_lost: int = 0
    response_tokens_lost: int = 0
    """Tokens truncation removed from the prompt (its template included) and from the response,
    against the untruncated text: what the cut to max_length removed, plus, where the character
    bound cut the text first, the removed characters at the kept slice's tokens per character
    (an estimate, rounded up, so any cut counts)."""


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


_SPACE = re.compile(r"\s")


def _keep_head(text: str, limit: int) -> int:
    """Where to end `text` to keep at most `limit` characters of its start: at a whitespace in the
    last half when there is one, so no word is split (tokens before the cut stay as they were)."""
    if len(text) <= limit:
        return len(text)
    spaces = [m.start() for m in _SPACE.finditer(text, limit // 2, limit + 1)]
    return spaces[-1] if spaces else limit


def _keep_tail(text: str, limit: int) -> int:
    """Where to start `text` to keep at most `limit` characters of its end, at a whitespace in the
    first half when there is one."""
    if len(text) <= limit:
        return 0
    low = len(text) - limit
    space = _SPACE.search(text, low, low + limit // 2)
    return space.start() if space else low


def bound_response(response: str, limit: int) -> tuple[str, int]:
    """(the response's first characters, at most `limit`; how many characters were cut)."""
    end = _keep_head(response, limit)
    return response[:end], len(response) - end


def bound_prompt(prompt: Sequence[dict[str, str]], limit: int) -> tuple[list[dict[str, str]], int]:
    """(the prompt's last `limit` characters of content, in its messages; characters cut).

    Truncation keeps the end of a dialogue, so contents are kept from the last message back; the
    message the bound falls in keeps its tail, and earlier messages keep their role with empty
    content (a template that checks the order of roles still sees it). Beyond `limit` messages
    in all, the earliest are dropped in pairs (after a leading system turn), which keeps that order
    too: each message renders to at least one token, so they lie outside the kept window anyway.
    """
    messages = [{"role": m["role"], "content": m["content"]} for m in prompt]
    cut = 0
    start = 1 if messages and messages[0]["role"] == "system" else 0
    extra = len(messages) - limit
    if extra > 0:
        drop = extra + extra % 2
        cut += sum(len(m["content"]) + 1 for m in messages[start : start + drop])  # + its frame
        del messages[start : start + drop]
    left = limit
    for message in reversed(messages):
        content = message["content"]
        begin = _keep_tail(content, left)
        message["content"] = content[begin:]
        cut += begin
        left = max(0, left - len(message["content"]))
    return messages, cut


def clear_backend_limits(tokenizer) -> None:
    """Drop the truncation and padding a `tokenizer.json` may carry in its Rust backend.

    Hub snapshots often ship one (sentence-transformers' MiniLM: truncation and fixed padding at
    128). The raw `tokenizers` library applies it silently to every encode; transformers clears it
    on its first call, so whether it acts depended on which library touched the tokenizer first,
    and a tokenizer saved before any call passed it on to every exported model. prefshift
    truncates in one place, to `encode.max_length` (`Encoder`), so the backend must never cut.
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return
    if backend.truncation is not None:
        backend.no_truncation()
    if backend.padding is not None:
        backend.no_padding()


class Encoder:
    """Turns pairs into `EncodedPair`s under one truncation policy."""

    def __init__(self, tokenizer, cfg: EncodeConfig):
        if not getattr(tokenizer, "is_fast", False):
            raise RenderError(
                f"{type(tokenizer).__name__} is a slow tokenizer; prefshift needs a fast (Rust) tokenizer "
                "for exact response masks (load it with use_fast=True or convert it)"
            )
        clear_backend_limits(tokenizer)
        self.tokenizer = tokenizer
        self.cfg = cfg
        self.special = set(tokenizer.all_special_ids)
        self._last_frame: tuple[tuple, str] | None = None

    def encode_one(self, prompt: Sequence[dict[str, str]], response: str) -> EncodedSeq:
        return self.encode_many([(prompt, response)])[0]

    def encode_many(self, requests: Sequence[tuple[Sequence[dict[str, str]], str]]) -> list[EncodedSeq]:
        """(prompt, response) → EncodedSeq, in order, with one tokenizer call for all of them.

        Texts are cut to the character bound first (`bound_prompt`, `bound_response`); the few whose
        cut slice yields too few tokens are encoded again with twice the bound until it does or
        nothing is cut. A prompt's frame is rendered once for consecutive requests that share it
        (both sides of a pair, every response of a group): rendering was most of the encoding time.
        """
        limit = self.cfg.max_length * CHARS_PER_TOKEN
        out: list[EncodedSeq | None] = [None] * len(requests)
        pending = list(range(len(requests)))
        while pending:
            encoded = self._encode_bounded([requests[i] for i in pending], limit)
            retry = []
            for i, (seq, too_short) in zip(pending, encoded, strict=True):
                out[i] = seq
                if too_short:
                    retry.append(i)
            pending, limit = retry, limit * 2
        return out  # type: ignore[return-value]

    def _encode_bounded(
        self, requests: Sequence[tuple[Sequence[dict[str, str]], str]], limit: int
    ) -> list[tuple[EncodedSeq, bool]]:
        """(EncodedSeq, whether a cut slice yielded too few tokens) per request, texts cut to `limit`."""
        if not requests:
            return []
        bounded = []
        for prompt, response in requests:
            kept_prompt, prompt_cut = bound_prompt(prompt, limit)
            kept_response, response_cut = bound_response(response, limit)
            bounded.append((kept_prompt, kept_response, prompt_cut, response_cut))
        texts = _apply(
            self.tokenizer, [_conversation(prompt, response) for prompt, response, _, _ in bounded]
        )
        spans = [
            _locate(text, response, self._frame(prompt))
            for text, (prompt, response, _, _) in zip(texts, bounded, strict=True)
        ]
        enc = self.tokenizer(texts, add_special_tokens=False, return_offsets_mapping=True)
        return [
            self._cut(ids, offsets, span, (prompt_cut, response_cut))
            for ids, offsets, span, (_, _, prompt_cut, response_cut) in zip(
                enc["input_ids"], enc["offset_mapping"], spans, bounded, strict=True
            )
        ]

    def _frame(self, prompt: Sequence[dict[str, str]]) -> str:
        key = tuple((m["role"], m["content"]) for m in prompt)
        if self._last_frame is None or self._last_frame[0] != key:
            self._last_frame = (key, slotted(self.tokenizer, prompt))
        return self._last_frame[1]

    def _cut(
        self,
        ids: list[int],
        offsets: list[tuple[int, int]],
        span: tuple[int, int],
        chars_cut: tuple[int, int],
    ) -> tuple[EncodedSeq, bool]:
        """The response mask from the character span, then truncation to `max_length`; and whether a
        side the character bound cut yielded fewer than max_length + CUT_MARGIN tokens."""
        start, end = span
        inside = [i for i, (s, e) in enumerate(offsets) if s < end and e > start]
        first = inside[0] if inside else sum(1 for _, e in offsets if e <= start)
        last = inside[-1] + 1 if inside else first
        lead = 0
        while lead < first and ids[lead] in self.special:
            lead += 1
        head, prompt_ids, response_ids, tail = ids[:lead], ids[lead:first], ids[first:last], ids[last:]
        prompt_cut, response_cut = chars_cut
        need = self.cfg.max_length + CUT_MARGIN
        too_short = (prompt_cut > 0 and len(prompt_ids) < need) or (
            response_cut > 0 and len(response_ids) < need
        )
        prompt_beyond = _tokens_for(prompt_cut, len(prompt_ids), start)
        response_beyond = _tokens_for(response_cut, len(response_ids), end - start)
        full_prompt, full_response = len(prompt_ids), len(response_ids)
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
        seq = EncodedSeq(
            kept,
            mask,
            full_response + response_beyond,
            full_prompt - len(prompt_ids) + prompt_beyond,
            full_response - len(response_ids) + response_beyond,
        )
        return seq, too_short

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
        self,
        pairs: Sequence[Pair],
        targets: Sequence[float] | None = None,
        skips: SkipCounter | None = None,
        truncation: TruncationCount | None = None,
    ) -> list[EncodedPair]:
        """Encode every pair; `targets` default to gold. Skipped pairs are counted in `skips`, and
        every pair (skipped ones too) in `truncation`."""
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
                if truncation is not None:
                    truncation.add(seqs[2 * offset : 2 * offset + 2])
                try:
                    out.append(self._paired(i, pair, targets[i], seqs[2 * offset : 2 * offset + 2]))
                except RowError as err:
                    skips.skip(err)
        skips.kept += len(out)
        return out


def _tokens_for(chars_cut: int, tokens: int, chars: int) -> int:
    """Tokens the `chars_cut` characters the bound removed would have made, at the kept slice's
    rate of `tokens` per `chars` characters, rounded up (at least one when anything was cut)."""
    if chars_cut <= 0:
        return 0
    return max(1, math.ceil(chars_cut * tokens / max(chars, 1)))


@dataclass
class TruncationCount:
    """How much of a split truncation removed: items (pairs, or groups of responses) whose prompt
    or any response was cut, and the tokens lost, summed over every scored sequence.

    Lost tokens count against the untruncated text (`EncodedSeq.prompt_tokens_lost`); where the
    character bound cut a text before tokenising, its share is estimated from the kept slice.
    """

    items: int = 0
    truncated: int = 0
    prompt_cut: int = 0
    response_cut: int = 0
    prompt_tokens_lost: int = 0
    response_tokens_lost: int = 0

    def add(self, seqs: Sequence[EncodedSeq]) -> None:
        """Count one item from the sequences it was scored as (both sides of a pair, a group)."""
        self.items += 1
        prompt = any(seq.prompt_tokens_lost for seq in seqs)
        response = any(seq.response_tokens_lost for seq in seqs)
        self.truncated += prompt or response
        self.prompt_cut += prompt
        self.response_cut += response
        self.prompt_tokens_lost += sum(seq.prompt_tokens_lost for seq in seqs)
        self.response_tokens_lost += sum(seq.response_tokens_lost for seq in seqs)

    def as_dict(self) -> dict[str, int | float]:
        return {
            "items": self.items,
            "truncated": self.truncated,
            "share": self.truncated / self.items if self.items else 0.0,
            "prompt_cut": self.prompt_cut,
            "response_cut": self.response_cut,
            "prompt_tokens_lost": self.prompt_tokens_lost,
            "response_tokens_lost": self.response_tokens_lost,
        }


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
    """One batch of 2B sequences: the B chosen rows, then the B rejected rows; `groups` gives each
    row its pair (the sequences that share a prompt, for the shared-prefix forward)."""
    seqs = [it.chosen for it in items] + [it.rejected for it in items]
    return {
        **pad_sequences(seqs, pad_id, padding_side),
        "groups": torch.arange(len(items)).repeat(2),
        "targets": torch.tensor([it.target for it in items], dtype=torch.float32),
        "keys": [(it.pair_id, side) for side in SIDES for it in items],
        "index": [it.index for it in items],
    }
