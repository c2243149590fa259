"""Rendering, response masks, the truncation policy, skips and batching."""

from __future__ import annotations

import pytest
import torch

from prefshift.config.params import EncodeConfig
from prefshift.data.encode import Encoder, collate, ensure_chat_template, length_grouped_batches, render
from prefshift.data.schema import SkipCounter, make_pair
from tiny_models import fresh_tokenizer, pairs, tokenizer

PROMPT = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "how do I fix the door?"}]


def _decode(ids):
    return tokenizer().decode(ids)


def test_plain_transcript_render():
    text, (start, end) = render(tokenizer(), PROMPT, "oil it")
    assert text == "<bos>system: be brief\nuser: how do I fix the door?\nassistant: oil it"
    assert text[start:end] == "oil it"


def test_plain_template_is_the_rendering_and_tokenises_to_the_same_ids():
    """What TRL computes from a saved tokenizer: template text, then ids without added specials."""
    tok = fresh_tokenizer()
    ensure_chat_template(tok)
    messages = [*PROMPT, {"role": "assistant", "content": "oil it"}]
    text = tok.apply_chat_template(messages, tokenize=False)
    assert text == render(tokenizer(), PROMPT, "oil it")[0]
    seq = Encoder(tokenizer(), EncodeConfig(max_length=128)).encode_one(PROMPT, "oil it")
    assert tok(text, add_special_tokens=False)["input_ids"] == seq.input_ids
    head = tok.apply_chat_template(PROMPT, tokenize=False, add_generation_prompt=True)
    assert head == "<bos>system: be brief\nuser: how do I fix the door?\nassistant: "


def test_a_token_merged_across_the_boundary_counts_as_response():
    """'assistant: first' tokenises 'Ġfirst' as one token spanning the boundary's space."""
    seq = Encoder(tokenizer(), EncodeConfig(max_length=128)).encode_one(PROMPT, "first fix it")
    tokens = tokenizer().convert_ids_to_tokens(seq.input_ids)
    masked = [t for t, m in zip(tokens, seq.response_mask, strict=True) if m]
    assert masked[0] == "Ġfirst"
    separate = tokenizer()("assistant: ", add_special_tokens=False)["input_ids"]
    assert tokenizer().convert_ids_to_tokens(separate)[-1] == "Ġ"  # what separate tokenising would keep


def test_response_mask_marks_exactly_the_response():
    seq = Encoder(tokenizer(), EncodeConfig(max_length=128)).encode_one(PROMPT, "first fix it gently")
    ids = torch.tensor(seq.input_ids)
    mask = torch.tensor(seq.response_mask, dtype=torch.bool)
    assert seq.input_ids[0] == tokenizer().bos_token_id
    assert _decode(ids[mask].tolist()).strip() == "first fix it gently"
    assert (
        _decode(ids[~mask].tolist()) + _decode(ids[mask].tolist())
        == render(tokenizer(), PROMPT, "first fix it gently")[0]
    )
    assert seq.response_tokens == int(mask.sum())


def test_prompt_is_truncated_from_the_left_first():
    enc = Encoder(tokenizer(), EncodeConfig(max_length=128))
    response = "first fix it gently"
    full = enc.encode_one(PROMPT, response)
    n_resp = sum(full.response_mask)
    short = Encoder(tokenizer(), EncodeConfig(max_length=n_resp + 4)).encode_one(PROMPT, response)
    assert len(short.input_ids) == n_resp + 4
    assert sum(short.response_mask) == n_resp  # response untouched
    assert short.input_ids[1:4] == full.input_ids[-n_resp - 3 : -n_resp]  # the prompt's end survives
    assert short.input_ids[0] == tokenizer().bos_token_id


def test_response_is_truncated_from_the_right_after_the_prompt():
    response = "first fix it gently, then check the door again and again"
    enc = Encoder(tokenizer(), EncodeConfig(max_length=8))
    seq = enc.encode_one(PROMPT, response)
    assert len(seq.input_ids) == 8
    assert seq.response_mask == [0] + [1] * 7  # BOS, then no prompt left, the response's head
    full = Encoder(tokenizer(), EncodeConfig(max_length=128)).encode_one(PROMPT, response)
    full_ids = [i for i, m in zip(full.input_ids, full.response_mask, strict=True) if m]
    assert seq.input_ids[1:] == full_ids[:7]
    assert seq.response_tokens == len(full_ids)


def test_pairs_losing_their_response_are_skipped_and_counted():
    skips = SkipCounter()
    cfg = EncodeConfig(max_length=8, min_response_tokens=10)
    out = Encoder(tokenizer(), cfg).encode_pairs(pairs(3), skips=skips)
    assert out == []
    assert skips.as_dict()["skipped"] == {"response_truncated": 3}
    assert skips.kept == 0


def test_targets_default_to_gold_and_can_be_given():
    pair = make_pair(dataset="t", category="helpful", prompt=PROMPT, chosen="a b", rejected="c", gold=0.8)
    enc = Encoder(tokenizer(), EncodeConfig())
    assert enc.encode_pairs([pair])[0].target == pytest.approx(0.8)
    assert enc.encode_pairs([pair], [0.3])[0].target == pytest.approx(0.3)


@pytest.mark.parametrize("side", ["right", "left"])
def test_collate_puts_chosen_then_rejected_in_one_padded_batch(side):
    items = Encoder(tokenizer(), EncodeConfig()).encode_pairs(pairs(3))
    batch = collate(items, pad_id=tokenizer().pad_token_id, padding_side=side)
    assert batch["input_ids"].shape[0] == 6
    assert batch["keys"][:3] == [(it.pair_id, "chosen") for it in items]
    assert batch["keys"][3:] == [(it.pair_id, "rejected") for it in items]
    for row, seq in enumerate([it.chosen for it in items] + [it.rejected for it in items]):
        attn = batch["attention_mask"][row].bool()
        assert batch["input_ids"][row][attn].tolist() == seq.input_ids
        assert batch["response_mask"][row][attn].tolist() == [bool(m) for m in seq.response_mask]
        assert not batch["response_mask"][row][~attn].any()
        pads = batch["input_ids"][row][~attn]
        assert (pads == tokenizer().pad_token_id).all()
        if side == "left" and (~attn).any():
            assert not attn[0]


def test_length_grouped_batches_are_seeded_and_complete():
    lengths = [5, 40, 7, 33, 12, 9, 50, 2, 18, 21]
    a = length_grouped_batches(lengths, 3, seed=1, mega=2)
    assert a == length_grouped_batches(lengths, 3, seed=1, mega=2)
    assert sorted(i for b in a for i in b) == list(range(10))
    assert a != length_grouped_batches(lengths, 3, seed=2, mega=2)
    for batch in a:  # inside a mega-batch, batches are length-sorted
        assert [lengths[i] for i in batch] == sorted((lengths[i] for i in batch), reverse=True)


def test_encoder_tokenizers_get_cls_and_sep():
    from transformers import BertTokenizerFast

    words = [
        "[PAD]",
        "[UNK]",
        "[CLS]",
        "[SEP]",
        "[MASK]",
        "user",
        ":",
        "fix",
        "door",
        "assistant",
        "oil",
        "it",
    ]
    tok = BertTokenizerFast(vocab={w: i for i, w in enumerate(words)})
    seq = Encoder(tok, EncodeConfig()).encode_one([{"role": "user", "content": "fix door"}], "oil it")
    ids = seq.input_ids
    assert ids[0] == tok.cls_token_id and ids[-1] == tok.sep_token_id
    resp = [i for i, m in zip(ids, seq.response_mask, strict=True) if m]
    assert tok.convert_ids_to_tokens(resp) == ["oil", "it"]


def test_chat_template_is_used_when_the_tokenizer_has_one():
    tok = fresh_tokenizer()
    tok.chat_template = (
        "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}"
    )
    text, (start, end) = render(tok, PROMPT[1:], "oil it")
    assert text == "<|user|>how do I fix the door?<|end|><|assistant|>oil it<|end|>"
    assert text[start:end] == "oil it"
    seq = Encoder(tok, EncodeConfig()).encode_one(PROMPT[1:], "oil it")
    assert seq.input_ids[0] != tok.bos_token_id  # the template owns the framing
    assert seq.input_ids == tok(text, add_special_tokens=False)["input_ids"]
    masked = [i for i, m in zip(seq.input_ids, seq.response_mask, strict=True) if m]
    assert tok.decode(masked) == "oil it"
    text, (start, end) = render(tok, PROMPT[1:], "end")  # "end" also occurs in the frame's "<|end|>"
    assert start == len("<|user|>how do I fix the door?<|end|><|assistant|>")
    assert text[start:end] == "end" and text[end:] == "<|end|>"
