"""Each adapter against a small fixture in its source's real format (tests/fixtures/<source>/).

Expected pairs and skip reasons are read off the fixture rows by hand; the comments
name the row each expectation comes from.
"""

from __future__ import annotations

import gzip
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from prefshift.config.params import SYNTHETIC_DATASETS, ConfigError
from prefshift.core.errors import PrefshiftError
from prefshift.data.adapters import ADAPTERS, SourceUnavailable, dataset_names, get_adapter, print_catalogue
from prefshift.data.adapters.hh_rlhf import parse_turns
from prefshift.data.schema import RowError, SchemaError, SkipCounter

SOURCE_DIRS = {
    "helpsteer3": "helpsteer3",
    "hh_helpful": "hh_rlhf/helpful-base",
    "hh_harmless": "hh_rlhf/harmless-base",
    "ultrafeedback": "ultrafeedback",
    "ultrafeedback_full": "ultrafeedback_full",
    "pku_saferlhf": "pku_saferlhf",
    "pku_saferlhf_helpful": "pku_saferlhf",
    "rail": "rail",
}


@pytest.fixture
def fixture_params(make_params, fixtures_dir):
    def build(**data):
        sources = {name: {"path": str(fixtures_dir / sub)} for name, sub in SOURCE_DIRS.items()}
        sources.update(data.pop("sources", {}))
        return make_params(data={"sources": sources, **data})

    return build


def load(name, split, params):
    counter = SkipCounter()
    pairs = get_adapter(name, params).load_pairs(split, params, counter)
    return pairs, dict(counter.counts), counter


def triples(pairs):
    return [(p.prompt[-1]["content"], p.chosen, p.rejected) for p in pairs]


def test_helpsteer3_sign_of_preference_picks_the_response(fixture_params):
    pairs, skipped, counter = load("helpsteer3", "train", fixture_params())
    assert triples(pairs) == [
        (
            "What is the boiling point of water at sea level?",
            "100 degrees Celsius.",
            "About 50 degrees.",
        ),  # -2
        ("Write a Python one-liner that reverses a string s.", "s[::-1]", "s.reverse()"),  # +3
        (
            "In April. What should I see?",
            "April is cherry blossom season: visit Kyoto's Philosopher's Path and Ueno Park in Tokyo.",
            "Go anywhere.",
        ),  # +1
    ]
    assert [round(p.gold, 4) for p in pairs] == [0.8333, 1.0, 0.6667]
    assert [m["role"] for m in pairs[2].prompt] == ["user", "assistant", "user"]
    assert skipped == {"tie": 1, "empty_response": 1, "identical_responses": 1, "missing_field": 1}
    assert counter.kept == 3 and counter.as_dict()["skipped_total"] == 4


def test_helpsteer3_test_split_is_validation(fixture_params):
    pairs, skipped, _ = load("helpsteer3", "test", fixture_params())
    assert triples(pairs) == [
        ("Give one tip for better sleep.", "Keep a regular bedtime.", "Drink coffee at night."),
        ("Capital of Italy?", "Rome.", "Paris."),
    ]
    assert pairs[1].prompt[0] == {"role": "system", "content": "Answer briefly."}
    assert skipped == {"tie": 1}


def test_hh_transcripts_split_into_prompt_and_replies(fixture_params):
    pairs, skipped, _ = load("hh_helpful", "train", fixture_params())
    assert triples(pairs) == [
        (
            "How do I boil an egg?",
            "Put it in boiling water for about nine minutes, then cool it.",
            "Eggs are oval.",
        ),
        (
            "Science fiction, mostly.",
            "Try The Left Hand of Darkness by Ursula K. Le Guin.",
            "I don't read books.",
        ),
    ]
    assert pairs[1].prompt == [
        {"role": "user", "content": "Can you recommend a book?"},
        {"role": "assistant", "content": "Sure, what genres do you like?"},
        {"role": "user", "content": "Science fiction, mostly."},
    ]
    assert skipped == {
        "prompt_mismatch": 1,  # row 3: "2+2" vs "2 plus 2"
        "identical_responses": 1,  # row 4
        "empty_response": 1,  # row 5: nothing after the last Assistant:
        "bad_transcript": 1,  # row 6: no "\n\nAssistant:" at all
        "duplicate": 1,  # row 7 repeats row 1
    }
    harmless, skipped, _ = load("hh_harmless", "test", fixture_params())
    assert harmless[0].category == "harmless" and harmless[0].chosen.startswith("I won't give instructions")
    assert skipped == {}


def test_parse_turns_multi_turn_and_errors():
    text = "\n\nHuman: Hi\nthere\n\nAssistant: Hello.\n\nHuman: Bye"
    assert parse_turns(text, "t") == [
        {"role": "user", "content": "Hi\nthere"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Bye"},
    ]
    assert parse_turns("Human: a\nAssistant: b", "t") == [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
    ]
    with pytest.raises(RowError) as err:
        parse_turns("preamble\n\nHuman: a", "somewhere")
    assert err.value.reason == "bad_transcript" and "somewhere" in str(err.value)


def test_ultrafeedback_binarized_drops_ties_and_bad_rows(fixture_params):
    pairs, skipped, _ = load("ultrafeedback", "train", fixture_params())
    assert triples(pairs) == [
        ("List three fruits.", "Apple, banana, cherry.", "Carrot."),
        ("Opposite of hot?", "Cold.", "Warm."),
    ]
    assert pairs[1].prompt[0]["role"] == "system"
    assert pairs[0].meta["score_chosen"] == 8.0 and pairs[0].meta["prompt_id"] == "p1"
    assert skipped == {"tie": 1, "bad_format": 1, "bad_label": 1}
    test_pairs, skipped, _ = load("ultrafeedback", "test", fixture_params())
    assert triples(test_pairs) == [("Translate 'cat' to German.", "Katze.", "Hund.")]
    assert skipped == {"empty_response": 1}


def test_ultrafeedback_binarized_reads_parquet(fixture_params, fixtures_dir, tmp_path):
    for split in ("train_prefs", "test_prefs"):
        rows = [json.loads(line) for line in (fixtures_dir / "ultrafeedback" / f"{split}.jsonl").open()]
        pq.write_table(pa.Table.from_pylist(rows), tmp_path / f"{split}-00000-of-00001.parquet")
    params = fixture_params(sources={"ultrafeedback": {"path": str(tmp_path)}})
    pairs, skipped, _ = load("ultrafeedback", "train", params)
    assert [p.chosen for p in pairs] == ["Apple, banana, cherry.", "Cold."]
    assert skipped == {"tie": 1, "bad_format": 1, "bad_label": 1}


def test_ultrafeedback_full_best_vs_worst_with_hash_held_out_test(fixture_params):
    params = fixture_params()
    pairs, skipped, _ = load("ultrafeedback_full", "train", params)
    assert triples(pairs) == [
        ("Name three primary colors.", "Red, yellow and blue.", "Colours are nice."),  # 4.5 vs 1.75
        ("How many legs does a spider have?", "Eight.", "Ten."),  # mean of ratings 5,5,4 = 4.67 beats 4.0
    ]
    assert skipped == {"tie": 1, "too_few_rated": 1}
    test_pairs, skipped, _ = load("ultrafeedback_full", "test", params)
    assert [p.prompt[0]["content"] for p in test_pairs] == ["Explain why the sky is blue."]
    assert test_pairs[0].rejected == "Blue paint."
    assert skipped == {"too_few_rated": 1}
    groups = get_adapter("ultrafeedback_full", params).load_groups(params)
    assert len(groups) == 1
    assert groups[0].prompt == [{"role": "user", "content": "Explain why the sky is blue."}]
    assert groups[0].scores == [4.75, 1.5, 3.5, 1.0] and len(groups[0].responses) == 4


def test_pku_harmless_by_safer_id_drops_same_safety(fixture_params):
    pairs, skipped, _ = load("pku_saferlhf", "train", fixture_params())
    assert [(p.prompt[0]["content"], p.chosen[:18]) for p in pairs] == [
        ("How can I make a weapon at home?", "I can't help make "),
        ("Where can I buy stolen phones?", "I won't help with "),
    ]
    assert skipped == {"same_safety": 1, "empty_response": 1, "bad_label": 1}
    kept, skipped, _ = load("pku_saferlhf", "train", fixture_params(pku_keep_same_safety=True))
    assert len(kept) == 3 and kept[1].chosen == "Spend time with them and listen."  # safer_response_id 0
    assert skipped == {"empty_response": 1, "bad_label": 1}


def test_pku_helpful_by_better_id(fixture_params):
    pairs, skipped, _ = load("pku_saferlhf_helpful", "train", fixture_params())
    assert [p.chosen for p in pairs] == [
        "Sharpen a steel rod and wrap the handle.",
        "Send a kind message and invite them out.",
        "I won't help with buying stolen goods.",
        "Use a password cracker.",
    ]
    assert {p.category for p in pairs} == {"helpful"}
    assert skipped == {"empty_response": 1}


def test_rail_context_becomes_history(fixture_params):
    pairs, skipped, _ = load("rail", "train", fixture_params())
    assert [len(p.prompt) for p in pairs] == [1, 3, 3]  # row 3's context already ends with its prompt
    assert pairs[1].prompt[:2] == [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello! How can I help?"},
    ]
    assert pairs[0].meta["chosen_score"] == 8.5
    assert skipped == {"empty_response": 1, "bad_transcript": 1}
    test_pairs, skipped, _ = load("rail", "test", fixture_params())  # test.csv
    assert [p.rejected for p in test_pairs] == [
        "Use chocolate or antifreeze.",
        "Leave a dead rat at his door.",
    ]
    assert skipped == {}


def test_rail_without_answer_columns_names_what_it_found(fixture_params, tmp_path):
    (tmp_path / "test.jsonl").write_text(json.dumps({"prompt": "q", "answer_a": "x", "answer_b": "y"}) + "\n")
    params = fixture_params(sources={"rail": {"path": str(tmp_path)}})
    with pytest.raises(SchemaError, match=r"answer_a"):
        load("rail", "test", params)


def test_local_schema_and_hh_files(make_params, fixtures_dir):
    params = make_params(
        data={
            "sources": {
                "mine": {
                    "adapter": "local",
                    "path": str(fixtures_dir / "local/schema"),
                    "category": "harmless",
                },
                "hh_file": {
                    "adapter": "local",
                    "path": str(fixtures_dir / "local/hh_pairs.jsonl"),
                    "category": "helpful",
                },
            }
        }
    )
    pairs, skipped, _ = load("mine", "train", params)
    assert triples(pairs) == [
        ("Capital of France?", "Paris.", "Lyon."),
        ("What is 3 times 3?", "9", "6"),  # plain-string prompt
        ("Tell me a fact.", "Octopuses have three hearts.", "Octopuses are fish."),  # prompt as JSON text
    ]
    assert pairs[0].gold == 0.9 and pairs[0].meta == {"source": "mine"} and pairs[2].meta == {"n": 1}
    assert {p.dataset for p in pairs} == {"mine"} and {p.category for p in pairs} == {"harmless"}
    assert skipped == {"identical_responses": 1, "empty_response": 1}
    hh, skipped, _ = load("hh_file", "test", params)
    assert [p.chosen[:10] for p in hh] == ["Put it in ", "Try The Le"]
    with pytest.raises(PrefshiftError, match="test split only"):
        load("hh_file", "train", params)


@pytest.mark.parametrize(
    ("folder", "message"),
    [
        ("bad_json", r"bad_json/test\.jsonl line 3: not valid JSON"),
        ("missing_column", r"line 2: missing column"),
    ],
)
def test_local_malformed_file_is_fatal_and_located(make_params, fixtures_dir, folder, message):
    params = make_params(
        data={
            "sources": {
                "x": {"adapter": "local", "path": str(fixtures_dir / "local" / folder), "category": "helpful"}
            }
        }
    )
    with pytest.raises(SchemaError, match=message):
        load("x", "test", params)


def test_alias_reads_a_builtin_format_under_another_name(make_params, fixtures_dir):
    params = make_params(
        data={
            "sources": {
                "hh_copy": {"adapter": "hh_helpful", "path": str(fixtures_dir / "hh_rlhf/helpful-base")}
            }
        }
    )
    pairs, _, _ = load("hh_copy", "test", params)
    assert [p.dataset for p in pairs] == ["hh_copy", "hh_copy"]


def test_offline_without_path_says_how_to_provide_data(make_params):
    with pytest.raises(SourceUnavailable) as err:
        load("hh_helpful", "test", make_params())
    message = str(err.value)
    assert "data.sources.hh_helpful.path" in message and "HF_HUB_OFFLINE" in message
    assert "Anthropic/hh-rlhf" in message


def test_missing_local_path_is_named(make_params, tmp_path):
    params = make_params(data={"sources": {"helpsteer3": {"path": str(tmp_path / "nope")}}})
    with pytest.raises(PrefshiftError, match=r"data\.sources\.helpsteer3\.path: .*nope does not exist"):
        load("helpsteer3", "train", params)
    empty = tmp_path / "empty"
    empty.mkdir()
    params = make_params(data={"sources": {"helpsteer3": {"path": str(empty)}}})
    with pytest.raises(PrefshiftError, match=r"no validation\.jsonl"):
        load("helpsteer3", "test", params)


def test_unknown_names_list_the_valid_ones(make_params):
    with pytest.raises(ConfigError) as err:
        get_adapter("hh_helpfull", make_params())
    assert "hh_helpful" in str(err.value) and "syn_help_forum" in str(err.value)
    with pytest.raises(ConfigError, match="local"):
        get_adapter("local", make_params())
    params = make_params(data={"sources": {"x": {"adapter": "nonesuch", "path": "p"}}})
    with pytest.raises(ConfigError, match=r"data\.sources\.x\.adapter: unknown adapter 'nonesuch'"):
        get_adapter("x", params)


def test_registry_and_catalogue(capsys):
    assert set(SYNTHETIC_DATASETS) <= set(dataset_names())
    assert "local" not in dataset_names() and "local" in ADAPTERS
    assert ADAPTERS["helpsteer3"].hf_config == "preference"
    assert ADAPTERS["hh_harmless"].data_dir == "harmless-base"
    assert ADAPTERS["ultrafeedback"].splits == {"train": "train_prefs", "test": "test_prefs"}
    print_catalogue()
    out = capsys.readouterr().out
    for name in ("pku_saferlhf_helpful", "nvidia/HelpSteer3", "syn_harm_chat"):
        assert name in out


def test_synthetic_adapter_validates_generated_rows(make_params):
    params = make_params(synthetic={"train_pairs": 40, "test_pairs": 20, "groups": 3})
    for name, category in SYNTHETIC_DATASETS.items():
        pairs, _, _ = load(name, "test", params)
        assert pairs and {p.category for p in pairs} == {category} and {p.dataset for p in pairs} == {name}
        groups = get_adapter(name, params).load_groups(params)
        assert len(groups) == 3 and all(len(g.responses) == len(g.scores) for g in groups)
    again, _, _ = load("syn_help_forum", "test", params)
    first, _, _ = load("syn_help_forum", "test", params)
    assert [p.pair_id for p in again] == [p.pair_id for p in first]


def test_gzip_json_array_and_split_placeholder_paths(fixture_params, fixtures_dir, tmp_path):
    for split in ("train", "validation"):
        text = (fixtures_dir / "helpsteer3" / f"{split}.jsonl").read_text(encoding="utf-8")
        with gzip.open(tmp_path / f"{split}.jsonl.gz", "wt", encoding="utf-8") as handle:
            handle.write(text)
        rows = [json.loads(line) for line in text.splitlines()]
        (tmp_path / f"hs3-{split}.json").write_text(json.dumps(rows), encoding="utf-8")
    expected, _, _ = load("helpsteer3", "test", fixture_params())
    for path in (tmp_path, tmp_path / "hs3-{split}.json"):
        params = fixture_params(sources={"helpsteer3": {"path": str(path)}})
        pairs, skipped, _ = load("helpsteer3", "test", params)
        assert pairs == expected and skipped == {"tie": 1}


def test_synthetic_shortcut_cue_follows_the_datasets_role(make_params):
    """Through the adapter: the source keeps the cue on the chosen side, targets get it reversed."""
    params = make_params(
        synthetic={"train_pairs": 400, "test_pairs": 400, "groups": 2, "shortcut_strength": 0.8},
        data={"source": "syn_harm_chat", "category": "harmless", "targets": ["syn_harm_forum"]},
    )

    def cue_on_chosen(name: str, split: str) -> float:
        pairs, _, _ = load(name, split, params)
        return sum(p.meta["shortcut_on"] == "chosen" for p in pairs) / len(pairs)

    assert cue_on_chosen("syn_harm_chat", "train") == pytest.approx(0.8, abs=0.01)
    assert cue_on_chosen("syn_harm_chat", "test") == pytest.approx(0.8, abs=0.01)
    assert cue_on_chosen("syn_harm_forum", "test") == pytest.approx(0.2, abs=0.01)


def test_qa_feedback_six_judgements_become_pairs_ties_skipped(make_params, fixtures_dir):
    """FineGrainedRLHF's qa-feedback files as published: `preference` judges 1v2, 1v3, 1v4, 2v3, 2v4,
    3v4 (1 = the first preferred, 2 = the second, 0 = none)."""
    params = make_params(data={"sources": {"qa_feedback": {"path": str(fixtures_dir / "qa_feedback")}}})
    pairs, skipped, _ = load("qa_feedback", "train", params)
    light = "It first opened in 1902 and was rebuilt in 1950."
    one, two, four = "It opened in 1902.", "The lighthouse opened in 1950.", "Lighthouses guide ships."
    ada, ada_1931, sailor = "Ada Reed wrote it.", "Ada Reed wrote it in 1931.", "A sailor wrote it."
    assert [(p.chosen, p.rejected) for p in pairs] == [
        (one, two), (light, one), (one, four), (light, two), (two, four), (light, four),  # [1, 2, 1, 2, 1, 1]
        (ada_1931, ada), (ada, sailor), (ada_1931, sailor),  # [2, 1, 0, 1, 1, 2]: 2v4 and 3v4 repeat 1v2, 1v3
    ]  # fmt: skip
    assert skipped == {"tie": 1, "duplicate": 2}
    assert pairs[0].prompt == [{"role": "user", "content": "When did the lighthouse on the hill first open?"}]
    assert pairs[0].meta == {"compared": "1v2", "preferred": 1} and pairs[1].meta["preferred"] == 3
    assert {p.category for p in pairs} == {"helpful"}
    test_pairs, test_skipped, _ = load("qa_feedback", "test", params)  # dev_feedback.json
    assert len(test_pairs) == 2 and test_skipped == {"tie": 2, "duplicate": 2}
    alone = make_params(
        data={"sources": {"qa_feedback": {"path": str(fixtures_dir / "qa_feedback" / "dev_feedback.json")}}}
    )
    assert load("qa_feedback", "test", alone)[0] == test_pairs  # one file: a target's test split


def test_qa_feedback_bad_judgements_are_counted(make_params, tmp_path, fixtures_dir):
    rows = json.loads((fixtures_dir / "qa_feedback" / "dev_feedback.json").read_text("utf-8"))
    bad = [{**rows[0], "preference": [1, 3, 1, 1, 1, 1]}, {**rows[0], "preference": [1, 1]}]
    (tmp_path / "dev_feedback.json").write_text(json.dumps(bad), encoding="utf-8")
    params = make_params(data={"sources": {"qa_feedback": {"path": str(tmp_path)}}})
    pairs, skipped, counter = load("qa_feedback", "test", params)
    # row 0: 1v2 identical texts, 1v3 judged 3, 2v4 repeats 1v4, three kept; row 1: two judgements only
    assert skipped == {"bad_label": 2, "identical_responses": 1, "duplicate": 1} and len(pairs) == 3
    assert any("1v3: a judgement must be 0, 1 or 2, got 3" in e for e in counter.examples["bad_label"])
