"""Truncation is counted and shown: per split, the share of pairs whose prompt or a response was
cut and the tokens lost, counted against the untruncated text (a 200k-character response is a
truncation), in the score files, the metrics file, the stage output and the report."""

from __future__ import annotations

import json

import pytest

from prefshift.config.params import EncodeConfig
from prefshift.data import encode
from prefshift.data.encode import Encoder, TruncationCount
from prefshift.data.schema import make_pair
from prefshift.pipeline.heldout_scores import read_truncation, truncation_path
from prefshift.pipeline.stages import report, teacher
from prefshift.pipeline.stages.report_truncation import truncation_section
from tiny_models import pairs, tokenizer
from tiny_project import copy_project, pipeline_root, tiny_params

MAX_LENGTH = 32
WORDS = ["first", "fix", "the", "door", "gently", "then", "check", "the", "window", "again"]


def _prose(words: int) -> str:
    return " ".join(WORDS[i % len(WORDS)] for i in range(words))


def _pair(prompt: str, chosen: str, rejected: str = "no idea"):
    return make_pair(dataset="t", category="helpful", prompt=prompt, chosen=chosen, rejected=rejected)


def _count(items, max_length: int = MAX_LENGTH) -> dict:
    counter = TruncationCount()
    Encoder(tokenizer(), EncodeConfig(max_length=max_length)).encode_pairs(items, truncation=counter)
    return counter.as_dict()


def test_short_pairs_are_not_truncated():
    counts = _count(pairs(6), max_length=128)
    assert counts == {"items": 6, "truncated": 0, "share": 0.0, "prompt_cut": 0, "response_cut": 0,
                      "prompt_tokens_lost": 0, "response_tokens_lost": 0}  # fmt: skip


def test_a_200k_character_response_is_a_truncation_with_its_tokens_counted(monkeypatch):
    """The character bound cuts the response before tokenising; the lost tokens are estimated from
    the kept slice, and come within 5% of what tokenising the whole text loses."""
    huge = _pair("how do I fix the door?", _prose(40_000))
    assert len(huge.chosen) > 200_000
    counts = _count([huge, *pairs(3)], max_length=128)
    assert counts["items"] == 4 and counts["truncated"] == counts["response_cut"] == 1
    assert counts["share"] == 0.25
    with monkeypatch.context() as patch:
        patch.setattr(encode, "CHARS_PER_TOKEN", 10**9)  # tokenise everything: the exact count
        exact = _count([huge, *pairs(3)], max_length=128)
    assert exact["truncated"] == 1
    assert exact["response_tokens_lost"] > 30_000
    assert counts["response_tokens_lost"] == pytest.approx(exact["response_tokens_lost"], rel=0.05)


def _exact_prompt_loss(pair) -> int:
    """Prompt tokens truncation removes from both sides, from the whole texts tokenised."""
    full, kept = (Encoder(tokenizer(), EncodeConfig(max_length=n)) for n in (100_000, MAX_LENGTH))
    return sum(
        len(full.encode_one(pair.prompt, side).input_ids) - len(kept.encode_one(pair.prompt, side).input_ids)
        for side in (pair.chosen, pair.rejected)
    )


def test_a_prompt_cut_by_tokens_alone_is_counted_exactly():
    long_prompt = _pair(_prose(80), "first fix it gently")
    assert len(long_prompt.prompt[0]["content"]) < MAX_LENGTH * encode.CHARS_PER_TOKEN  # no character cut
    counts = _count([long_prompt])
    assert counts["prompt_cut"] == counts["truncated"] == 1 and counts["response_cut"] == 0
    assert counts["prompt_tokens_lost"] == _exact_prompt_loss(long_prompt)


def test_a_prompt_cut_by_characters_is_estimated_within_5_percent():
    long_prompt = _pair(_prose(5_000), "first fix it gently")
    counts = _count([long_prompt])
    assert counts["prompt_cut"] == 1
    assert counts["prompt_tokens_lost"] == pytest.approx(_exact_prompt_loss(long_prompt), rel=0.05)


def test_pairs_skipped_for_truncation_are_counted_too():
    cut_away = _pair(_prose(5000), _prose(40))
    counter = TruncationCount()
    cfg = EncodeConfig(max_length=16, min_response_tokens=20)
    assert Encoder(tokenizer(), cfg).encode_pairs([cut_away], truncation=counter) == []
    assert counter.as_dict()["truncated"] == 1


def test_the_report_section_shows_the_table_and_warns_once(capsys):
    split = {"items": 32, "truncated": 13, "share": 13 / 32, "prompt_cut": 2, "response_cut": 12,
             "prompt_tokens_lost": 40, "response_tokens_lost": 900}  # fmt: skip
    clean = {**split, "truncated": 0, "share": 0.0, "prompt_cut": 0, "response_cut": 0,
             "prompt_tokens_lost": 0, "response_tokens_lost": 0}  # fmt: skip
    metrics = {
        "naive": {"truncation": {"student": {"id_test": clean, "rmb": split}, "teacher": {"id_test": clean}}},
        "seam": {"truncation": {"student": {"id_test": clean, "rmb": split}, "teacher": {"id_test": clean}}},
    }
    text = truncation_section(metrics, 0.05)
    assert "| split | teacher | naive | seam |" in text
    assert "| rmb | — | 40.6% (13/32), 940 tok | 40.6% (13/32), 940 tok |" in text
    assert "| id_test | 0.0% (0/32), 0 tok | 0.0% (0/32), 0 tok | 0.0% (0/32), 0 tok |" in text
    assert "**warning: truncation cut more than 5%" in text and "of the pairs of rmb 41% (the most" in text
    assert capsys.readouterr().err.count("warning: truncation cut more than 5%") == 1
    assert "warning" not in truncation_section(metrics, 0.5)
    assert truncation_section({"naive": {}}, 0.05) is None  # metrics written before truncation was counted


def test_the_pipeline_counts_shows_and_warns(tmp_path_factory, tmp_path, capsys):
    """The tiny pipeline (encode.max_length 64) cuts most texts: the score directory, the metrics file
    and the report all say so, and the training stage warns once."""
    layout = copy_project(pipeline_root(tmp_path_factory), tmp_path / "project")
    params = tiny_params()
    student = read_truncation(layout, "naive", params.data.targets)
    splits = ["id_test", *params.data.targets]
    assert set(splits) <= set(student) and all(student[s]["items"] > 0 for s in splits)
    assert student["id_test"]["share"] > params.evaluate.warn_truncated_share
    metrics = json.loads(layout.metrics("naive").read_text())
    assert metrics["truncation"]["student"]["id_test"]["truncated"] == student["id_test"]["truncated"]
    assert metrics["truncation"]["teacher"] == read_truncation(layout, "teacher", params.data.targets)
    target = params.data.targets[0]  # a target's counts live with its scores, written by score-target
    assert student[target] == json.loads(truncation_path(layout, "naive", target).read_text())[target]

    capsys.readouterr()
    teacher.run(params, layout)
    assert capsys.readouterr().err.count("warning: truncation to encode.max_length cut") == 1

    report.run(params, layout)
    summary = layout.summary.read_text(encoding="utf-8")
    assert "## Truncation" in summary and "**warning: truncation cut more than 5%" in summary
    [row] = [line for line in summary.splitlines() if line.startswith("| id_test |")]
    assert f"| {student['id_test']['share']:.1%} ({student['id_test']['truncated']}/" in row


def test_score_says_how_many_rows_were_cut(tmp_path):
    """`prefshift score` used to say "0 truncated away" for a 200k-character response."""
    from typer.testing import CliRunner

    from prefshift.cli import app
    from test_registry import tiny_reward_model

    rows = tmp_path / "rows.jsonl"
    rows.write_text(
        json.dumps({"prompt": "what is prime?", "response": "two divisors " * 16_000}) + "\n"
        + json.dumps({"prompt": "what is prime?", "response": "two divisors"}) + "\n"
    )  # fmt: skip
    model = tiny_reward_model(tmp_path / "hf", 0)
    result = CliRunner().invoke(app, ["score", "--model", str(model), "--input", str(rows)])
    assert result.exit_code == 0, result.output
    assert "0 skipped (no response token left after truncation); 1 cut to encode.max_length (50.0%)" in (
        result.stderr
    )


# --- a truncation or padding block inside tokenizer.json never cuts: encode.max_length does ---------


def _limited_model_dir(tmp_path, limit: int = 8, padded: int = 64):
    """A tiny model directory whose tokenizer.json carries a truncation block at `limit` and fixed
    padding to `padded`, as sentence-transformers' MiniLM snapshot carries both at 128."""
    from tiny_models import base_dir

    source = base_dir(tmp_path)
    path = source / "tokenizer.json"
    data = json.loads(path.read_text("utf-8"))
    data["truncation"] = {"direction": "Right", "max_length": limit, "strategy": "LongestFirst", "stride": 0}
    data["padding"] = {"strategy": {"Fixed": padded}, "direction": "Right", "pad_to_multiple_of": None,
                       "pad_id": 0, "pad_type_id": 0, "pad_token": "<pad>"}  # fmt: skip
    path.write_text(json.dumps(data), encoding="utf-8")
    return source


def test_a_tokenizer_json_truncation_block_cuts_nothing_that_max_length_keeps(tmp_path):
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    from prefshift.models.reward import load_reward_model, save_reward_model
    from tiny_models import tokenizer

    model_dir = _limited_model_dir(tmp_path)
    long_text = _prose(60)
    raw = Tokenizer.from_file(str(model_dir / "tokenizer.json")).encode(long_text)
    assert (sum(raw.attention_mask), len(raw.ids)) == (8, 64)  # the raw library cuts to 8, pads to 64
    pair = _pair("how do I fix the door?", long_text, rejected="no")
    cfg = EncodeConfig(max_length=MAX_LENGTH)
    want = Encoder(tokenizer(), cfg).encode_pair(0, pair, 1.0)  # the same vocabulary, no block
    assert len(want.chosen.input_ids) == MAX_LENGTH and len(want.rejected.input_ids) < 64
    fresh = AutoTokenizer.from_pretrained(model_dir)
    assert fresh.backend_tokenizer.truncation is not None  # loaded, and not yet called: the block is live
    for tok in (fresh, load_reward_model(model_dir)[1]):
        assert Encoder(tok, cfg).encode_pair(0, pair, 1.0) == want  # cut to ours, never to 8, nor padded
        assert tok.backend_tokenizer.truncation is None and tok.backend_tokenizer.padding is None
    model, tok = load_reward_model(model_dir)
    save_reward_model(model, tok, tmp_path / "exported")
    exported = json.loads((tmp_path / "exported" / "tokenizer.json").read_text("utf-8"))
    assert exported["truncation"] is None and exported["padding"] is None  # nothing hidden passed on
    raw = Tokenizer.from_file(str(tmp_path / "exported" / "tokenizer.json"))
    assert len(raw.encode(long_text).ids) > MAX_LENGTH
