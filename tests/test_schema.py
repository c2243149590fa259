"""The pair record: what make_pair rejects (and why), stable ids, lossless parquet round trips."""

from __future__ import annotations

import pytest

from prefshift.data.schema import (
    Group,
    RowError,
    SchemaError,
    SkipCounter,
    make_pair,
    pair_content_hash,
    read_groups,
    read_pairs,
    write_groups,
    write_pairs,
)

PROMPT = [{"role": "user", "content": "Name a colour."}]


def pair(**overrides):
    fields = {"dataset": "d", "category": "helpful", "prompt": PROMPT, "chosen": "Red.", "rejected": "Seven."}
    return make_pair(**{**fields, **overrides})


@pytest.mark.parametrize(
    ("overrides", "reason", "field"),
    [
        ({"category": "funny"}, "bad_category", "category"),
        ({"prompt": []}, "bad_prompt", "prompt"),
        ({"prompt": [{"role": "robot", "content": "x"}]}, "bad_prompt", "prompt[0].role"),
        ({"prompt": [{"role": "user", "content": "x", "extra": 1}]}, "bad_prompt", "prompt[0]"),
        ({"prompt": [{"role": "system", "content": "Be nice."}]}, "empty_prompt", "user message"),
        ({"chosen": None}, "bad_type", "'chosen'"),
        ({"rejected": "   "}, "empty_response", "'rejected'"),
        ({"rejected": " Red. "}, "identical_responses", "identical"),
        ({"gold": 0.5}, "bad_gold", "'gold'"),
        ({"gold": True}, "bad_gold", "'gold'"),
    ],
)
def test_make_pair_rejects_with_reason_and_location(overrides, reason, field):
    with pytest.raises(RowError) as err:
        pair(where="file.jsonl line 7", **overrides)
    assert err.value.reason == reason
    assert "d file.jsonl line 7" in str(err.value) and field in str(err.value)


def test_ids_are_stable_and_content_hash_ignores_order():
    first, again = pair(), pair()
    assert first.pair_id == again.pair_id and len(first.pair_id) == 16
    assert pair(dataset="other").pair_id != first.pair_id
    swapped = pair(chosen="Seven.", rejected="Red.")
    assert swapped.pair_id != first.pair_id
    assert pair_content_hash(swapped) == pair_content_hash(first)
    assert pair_content_hash(pair(dataset="other")) == pair_content_hash(first)


def test_pairs_and_groups_round_trip(tmp_path):
    pairs = [pair(gold=0.75, meta={"k": [1, "two"]}), pair(chosen="Blue.", prompt=[*PROMPT, *PROMPT])]
    write_pairs(tmp_path / "p.parquet", pairs)
    assert read_pairs(tmp_path / "p.parquet") == pairs
    groups = [Group("g1", "d", "helpful", PROMPT, ["a", "b", "c"], [1.0, 3.0, 2.0])]
    write_groups(tmp_path / "g.parquet", groups)
    assert read_groups(tmp_path / "g.parquet") == groups


def test_reading_a_wrong_file_names_it(tmp_path):
    with pytest.raises(SchemaError, match="not found"):
        read_pairs(tmp_path / "absent.parquet")
    write_groups(tmp_path / "g.parquet", [Group("g", "d", "helpful", PROMPT, ["a", "b"], [0.0, 1.0])])
    with pytest.raises(SchemaError, match=r"g\.parquet: not a pairs file"):
        read_pairs(tmp_path / "g.parquet")


def test_skip_counter_counts_reasons_and_keeps_three_examples():
    counter = SkipCounter()
    for index in range(5):
        counter.skip(RowError("tie", f"row {index}: tie"))
    counter.skip(RowError("empty_response", "row 9: empty"))
    counter.kept = 2
    summary = counter.as_dict()
    assert summary["skipped"] == {"empty_response": 1, "tie": 5}
    assert summary["skipped_total"] == 6 and summary["kept"] == 2
    assert summary["examples"]["tie"] == ["row 0: tie", "row 1: tie", "row 2: tie"]
