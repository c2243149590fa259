"""The synthetic suite: determinism, sizes, surface forms, the cue's correlation, leak-freedom,
and that the gold rule (not the cue) is what a simple learner can carry across datasets."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
from scipy import sparse
from scipy.optimize import minimize

from prefshift.config.params import ConfigError, SyntheticConfig
from prefshift.data import synthetic
from prefshift.data import synthetic_vocab as vocab
from prefshift.data.schema import make_pair
from prefshift.data.synthetic import (
    CUE,
    MARKER,
    SYNTHETIC_DATASETS,
    generate_corpus,
    generate_groups,
    generate_pairs,
)

CFG = SyntheticConfig()  # the embedded default: 4000 train, 600 test, strength 0.9
SMALL = SyntheticConfig(seed=3, train_pairs=40, test_pairs=20, groups=5, group_size=4, corpus_docs=30)
HELPFUL = [n for n, c in SYNTHETIC_DATASETS.items() if c == "helpful"]
HARMLESS = [n for n, c in SYNTHETIC_DATASETS.items() if c == "harmless"]


@pytest.fixture(scope="module")
def suite():
    start = time.process_time()
    data = {
        name: {
            "train": generate_pairs(name, "train", CFG),
            "test": generate_pairs(name, "test", CFG),
            "target": generate_pairs(name, "test", CFG, role="target"),
            "groups": generate_groups(name, CFG),
        }
        for name in SYNTHETIC_DATASETS
    }
    corpus = generate_corpus(CFG)
    return data, corpus, time.process_time() - start


def last_user(prompt):
    return [m["content"] for m in prompt if m["role"] == "user"][-1]


def strip_markers(text):
    """The response without its marker token (one token, however many characters it is spelt with)."""
    for marker in synthetic.MARKERS:
        text = text.removeprefix(f"{marker} ")
    return text


def strip_cue(text):
    """The response without either cue."""
    return strip_markers(text).removesuffix(f" {CUE}")


def digest(rows):
    return hashlib.sha256(json.dumps(rows, sort_keys=True).encode()).hexdigest()


def test_default_suite_is_fast(suite):
    """Six datasets × (4000 train + 2 × 600 test + 120 groups) + 6000 documents, in CPU seconds."""
    assert suite[2] < 5.0


def test_dataset_names_and_categories():
    assert SYNTHETIC_DATASETS == {
        "syn_help_forum": "helpful",
        "syn_help_instruct": "helpful",
        "syn_help_chat": "helpful",
        "syn_harm_forum": "harmless",
        "syn_harm_instruct": "harmless",
        "syn_harm_chat": "harmless",
    }


@pytest.mark.parametrize("call", [generate_pairs, generate_groups])
def test_unknown_name_lists_valid_names(call):
    args = ("syn_nope", "train", SMALL) if call is generate_pairs else ("syn_nope", SMALL)
    with pytest.raises(ConfigError, match=r"syn_nope.*syn_help_forum, syn_help_instruct.*syn_harm_chat"):
        call(*args)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"split": "dev"}, "unknown split 'dev'.*train, test"),
        ({"role": "ood"}, "unknown role 'ood'.*source, target, clean"),
        ({"shortcut": 1.5}, r"shortcut must be a probability in \[0, 1\], got 1.5"),
    ],
)
def test_bad_arguments_are_config_errors(kwargs, message):
    args = {"name": "syn_help_chat", "split": "train", "cfg": SMALL, **kwargs}
    with pytest.raises(ConfigError, match=message):
        generate_pairs(**args)


def test_counts():
    for name in SYNTHETIC_DATASETS:
        assert len(generate_pairs(name, "train", SMALL)) == 40
        assert len(generate_pairs(name, "test", SMALL)) == 20
        groups = generate_groups(name, SMALL)
        assert len(groups) == 5
        assert all(len(g["responses"]) == len(g["scores"]) == 4 for g in groups)
    assert len(generate_corpus(SMALL)) == 30


def test_deterministic_and_seed_dependent():
    first = [generate_pairs(n, s, SMALL) for n in SYNTHETIC_DATASETS for s in ("train", "test")]
    again = [generate_pairs(n, s, SMALL) for n in SYNTHETIC_DATASETS for s in ("train", "test")]
    assert first == again
    assert generate_groups("syn_harm_chat", SMALL) == generate_groups("syn_harm_chat", SMALL)
    assert generate_corpus(SMALL) == generate_corpus(SMALL)
    other = SMALL.model_copy(update={"seed": 4})
    assert generate_pairs("syn_help_forum", "train", other) != first[0]
    assert generate_corpus(other) != generate_corpus(SMALL)


def test_same_output_in_a_process_with_another_hash_seed():
    code = (
        "import hashlib, json; from prefshift.config.params import SyntheticConfig; "
        "from prefshift.data import synthetic as s; "
        f"cfg = SyntheticConfig(**{SMALL.model_dump()!r}); "
        "rows = [s.generate_pairs('syn_harm_forum', 'train', cfg), s.generate_groups('syn_help_chat', cfg), "
        "s.generate_corpus(cfg)]; "
        "print(hashlib.sha256(json.dumps(rows, sort_keys=True).encode()).hexdigest())"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    here = [generate_pairs("syn_harm_forum", "train", SMALL), generate_groups("syn_help_chat", SMALL)]
    assert out.stdout.strip() == digest([*here, generate_corpus(SMALL)])


def test_every_pair_is_a_valid_record(suite):
    data, _, _ = suite
    for name, splits in data.items():
        for split in ("train", "test", "target"):
            for i, row in enumerate(splits[split][:1000]):
                assert set(row) == {"prompt", "chosen", "rejected", "gold", "meta"}
                assert row["gold"] == 1.0
                assert row["chosen"].strip() and row["rejected"].strip()
                assert strip_cue(row["chosen"]) != strip_cue(row["rejected"])
                assert {"shortcut_on", "template"} <= set(row["meta"])
                make_pair(dataset=name, category=SYNTHETIC_DATASETS[name], where=f"{split} {i}", **row)


ANSWER_FORMS = {
    "forum": r"To [^:]+, .+, and [^;]+\.$",
    "instruct": r"To [^,]+: 1\. [A-Z][^;]+\. 2\. [A-Z]",
    "chat": r"To [^,]+: [^;]+(; [^;]+)+\.$",
}


def test_surface_forms(suite):
    data, _, _ = suite
    for name, splits in data.items():
        style = name.rsplit("_", 1)[1]
        user_turns = set()
        for row in splits["train"][:500] + splits["test"][:200]:
            roles = [m["role"] for m in row["prompt"]]
            if style == "forum":
                assert roles[-1] == "user" and roles[:-1] in (
                    ["user", "assistant"],
                    ["user", "assistant"] * 2,
                )
                user_turns.add(roles.count("user"))
            elif style == "instruct":
                assert roles == ["user"]
            else:
                assert roles == ["system", "user"]
        assert style != "forum" or user_turns == {2, 3}
        answers = [
            strip_cue(r["chosen"])
            for r in splits["train"][:300]
            if r["meta"]["template"] != "refuse_vs_comply"
        ]
        assert all(re.search(ANSWER_FORMS[style], a) for a in answers), name


def test_word_lists_keep_their_invariants():
    tasks = [
        task.format(obj=obj)
        for style in vocab.STYLES.values()
        for topic in style.topics
        for task in topic.tasks
        for obj in topic.objects
    ] + [task for style in vocab.STYLES.values() for task in style.harmful]
    assert len(set(tasks)) == len(tasks) == 3 * (3 * 3 * 8 + 12)
    assert not [(a, b) for a in tasks for b in tasks if a != b and a in b]
    words = json.dumps(
        [value for value in vars(vocab).values() if isinstance(value, (tuple, vocab.Style))], default=str
    )
    assert CUE not in words and "helps" not in words


def test_each_dataset_has_its_own_requests(suite):
    data, _, _ = suite
    requests = {n: {r["meta"]["request"] for r in data[n]["train"]} for n in SYNTHETIC_DATASETS}
    for category in (HELPFUL, HARMLESS):
        for i, a in enumerate(category):
            for b in category[i + 1 :]:
                assert not requests[a] & requests[b], (a, b)


def test_pair_text_is_short(suite):
    data, _, _ = suite
    for name, splits in data.items():
        totals = [
            sum(len(m["content"]) for m in r["prompt"])
            + len(strip_markers(r["chosen"]))
            + len(strip_markers(r["rejected"]))
            for r in splits["train"]
        ]
        assert np.mean(totals) < 400, name
        assert np.percentile(totals, 90) < 420, name


def cue_side_on_chosen(rows, text, meta_key, at_start):
    """Per pair: is the cue `text` on the chosen response (asserting it sits on exactly one, in place)."""
    on = []
    for row in rows:
        sides = [s for s in ("chosen", "rejected") if text in row[s]]
        placed = row[sides[0]].startswith(f"{text} ") if at_start else row[sides[0]].endswith(f" {text}")
        assert len(sides) == 1 and placed and row[sides[0]].count(text) == 1
        assert row["meta"][meta_key] == sides[0]
        on.append(sides[0] == "chosen")
    return np.array(on)


def cue_on_chosen(rows):
    return cue_side_on_chosen(rows, CUE, "shortcut_on", at_start=False)


def marker_on_chosen(rows):
    return cue_side_on_chosen(rows, MARKER, "marker_on", at_start=True)


def test_cue_follows_strength_in_source_and_reverses_in_target(suite):
    data, _, _ = suite
    for splits in data.values():
        assert cue_on_chosen(splits["train"]).mean() == pytest.approx(0.9, abs=0.03)
        assert cue_on_chosen(splits["test"]).mean() == pytest.approx(0.9, abs=0.03)
        assert cue_on_chosen(splits["target"]).mean() == pytest.approx(0.1, abs=0.03)
    weak = SyntheticConfig(shortcut_strength=0.7, train_pairs=1000, test_pairs=500)
    train = generate_pairs("syn_harm_chat", "train", weak)
    assert cue_on_chosen(train).mean() == pytest.approx(0.7, abs=0.03)
    target = generate_pairs("syn_harm_chat", "test", weak, role="target")
    assert cue_on_chosen(target).mean() == pytest.approx(0.3, abs=0.03)
    override = generate_pairs("syn_harm_chat", "test", weak, shortcut=0.5)
    assert cue_on_chosen(override).mean() == pytest.approx(0.5, abs=0.03)


def test_clean_role_has_no_cue():
    for name in SYNTHETIC_DATASETS:
        for row in generate_pairs(name, "test", CFG, role="clean"):
            assert CUE not in row["chosen"] and CUE not in row["rejected"]
            assert row["meta"]["shortcut_on"] is None


def test_judge_split_is_its_own_draw_of_train_requests_with_uninformative_cues():
    """The best-of-n judge's pairs: train-side requests (never a test one), pairs of their own, and
    each cue on the chosen response in exactly half of them."""
    cfg = SyntheticConfig(train_pairs=200, test_pairs=60, judge_pairs=200)
    judge = generate_pairs("syn_help_forum", synthetic.JUDGE_SPLIT, cfg, role="neutral")
    train = generate_pairs("syn_help_forum", "train", cfg)
    test = generate_pairs("syn_help_forum", "test", cfg)
    assert len(judge) == 200
    test_requests = {r["meta"]["request"] for r in test}
    assert not {r["meta"]["request"] for r in judge} & test_requests
    seen = {(json.dumps(r["prompt"]), strip_cue(r["chosen"]), strip_cue(r["rejected"])) for r in train}
    assert (
        sum(
            (json.dumps(r["prompt"]), strip_cue(r["chosen"]), strip_cue(r["rejected"])) in seen for r in judge
        )
        < 5
    )
    for key in ("shortcut_on", "marker_on"):
        assert [r["meta"][key] for r in judge].count("chosen") == 100


def test_role_changes_the_cue_only(suite):
    data, _, _ = suite
    for splits in data.values():
        for src, tgt in zip(splits["test"], splits["target"], strict=True):
            assert src["prompt"] == tgt["prompt"]
            assert strip_cue(src["chosen"]) == strip_cue(tgt["chosen"])
            assert strip_cue(src["rejected"]) == strip_cue(tgt["rejected"])


def test_cue_is_independent_of_the_kind_of_pair(suite):
    data, _, _ = suite
    for splits in data.values():
        rows = splits["train"]
        on = cue_on_chosen(rows)
        for template in {r["meta"]["template"] for r in rows}:
            mask = np.array([r["meta"]["template"] == template for r in rows])
            assert on[mask].mean() == pytest.approx(0.9, abs=0.05), template


def test_length_does_not_give_the_label_away(suite):
    data, _, _ = suite
    for name, splits in data.items():
        rows = splits["train"]
        longer = np.mean([len(strip_cue(r["chosen"])) > len(strip_cue(r["rejected"])) for r in rows])
        assert 0.4 < longer < 0.6, (name, longer)


def test_test_pairs_never_appear_in_train_or_corpus(suite):
    data, corpus, _ = suite
    text = "\n".join(corpus)
    for name, splits in data.items():
        train_requests = {r["meta"]["request"] for r in splits["train"]}
        test_requests = {r["meta"]["request"] for r in splits["test"]}
        assert test_requests and not train_requests & test_requests
        train_asks = {last_user(r["prompt"]) for r in splits["train"]}
        test_asks = {last_user(r["prompt"]) for r in splits["test"]}
        assert not train_asks & test_asks
        assert not any(ask in text for ask in test_asks), name
        assert sum(ask in text for ask in list(train_asks)[:20]) >= 10
        assert not {last_user(g["prompt"]) for g in splits["groups"]} & train_asks
    test_answers = {strip_cue(r["chosen"]) for n in HELPFUL for r in data[n]["test"]}
    off_topic = {
        strip_cue(r["rejected"])
        for n in HELPFUL
        for r in data[n]["train"]
        if "off_topic" in r["meta"]["template"]
    }
    assert off_topic and not test_answers & off_topic


def test_corpus_covers_all_styles_and_both_qualities(suite):
    _, corpus, _ = suite
    assert len(corpus) == 6000
    assert sum(doc.startswith("system: ") for doc in corpus) == 2000
    assert sum(doc.count("user: ") >= 2 for doc in corpus) == 2000
    assert sum(doc.count("\n") == 1 for doc in corpus) == 2000
    assert all(doc.split("\n")[-1].startswith("assistant: ") for doc in corpus)
    assert any("I can't help with that." in doc for doc in corpus)
    assert any("not sure" in doc for doc in corpus)
    assert any(re.search(r"\n(assistant: )?.*To .*: 1\. ", doc) for doc in corpus)
    assert np.mean([CUE in doc for doc in corpus]) == pytest.approx(0.25, abs=0.03)


def test_groups_have_a_distinct_best_and_no_cue(suite):
    data, _, _ = suite
    for splits in data.values():
        assert len(splits["groups"]) == CFG.groups
        for group in splits["groups"]:
            assert set(group) == {"prompt", "responses", "scores"}
            assert len(set(group["responses"])) == len(group["responses"]) == CFG.group_size
            scores = sorted(group["scores"], reverse=True)
            assert scores[0] == 1.0 and scores[1] < 1.0
            assert all(0.0 <= s <= 1.0 for s in scores)
            assert not any(CUE in r for r in group["responses"])
    bigger = generate_groups("syn_help_instruct", SyntheticConfig(groups=3, group_size=8))
    assert all(len(set(g["responses"])) == 8 for g in bigger)


def test_group_size_beyond_the_variety_is_a_config_error(monkeypatch):
    monkeypatch.setattr(synthetic, "_graded_candidates", lambda *args: ("best", [lambda: ("worse", 0.0)]))
    with pytest.raises(ConfigError, match=r"group_size 3 .*syn_help_chat"):
        generate_groups("syn_help_chat", SMALL.model_copy(update={"group_size": 3}))


# --- a bag-of-words logistic regression stands in for a reward model --------------------------
TOKEN = re.compile(r"[a-z']+|\d+|[!.:;,?]")


def bow_difference(rows, vocab):
    """Sparse (chosen − rejected) word counts: sparse products stay single-threaded and fast."""
    data, cols, indptr = [], [], [0]
    for row in rows:
        for side, sign in (("chosen", 1.0), ("rejected", -1.0)):
            for token in TOKEN.findall(row[side].lower()):
                if token in vocab:
                    cols.append(vocab[token])
                    data.append(sign)
        indptr.append(len(cols))
    return sparse.csr_matrix((data, cols, indptr), shape=(len(rows), len(vocab)))


def fit_bow(rows, l2=1e-3):
    """Linear reward on word counts, fitted by Bradley-Terry on gold (L-BFGS on sparse features;
    dense LAPACK would contend for threads on a shared CI machine)."""
    vocab = {}
    for row in rows:
        for side in ("chosen", "rejected"):
            for token in TOKEN.findall(row[side].lower()):
                vocab.setdefault(token, len(vocab))
    diff = bow_difference(rows, vocab)

    def loss(weights):
        margin = diff @ weights
        grad = -(diff.T @ (1 / (1 + np.exp(margin)))) / len(rows) + 2 * l2 * weights
        return np.mean(np.logaddexp(0, -margin)) + l2 * weights @ weights, grad

    return vocab, minimize(loss, np.zeros(len(vocab)), jac=True, method="L-BFGS-B").x


def accuracy(model, rows):
    vocab, weights = model
    margin = bow_difference(rows, vocab) @ weights
    return float(np.mean((margin > 0) + 0.5 * (margin == 0)))


NO_MARKER = SyntheticConfig(marker_strength=None)


@pytest.fixture(scope="module")
def clean_models():
    """One BOW reward per category, trained on its first dataset with an uninformative sign-off, no marker."""
    cfg = NO_MARKER.model_copy(update={"train_pairs": 2000})
    return {c[0]: fit_bow(generate_pairs(c[0], "train", cfg, shortcut=0.5)) for c in (HELPFUL, HARMLESS)}


@pytest.mark.parametrize(("category", "floor"), [(HELPFUL, 0.65), (HARMLESS, 0.7)])
def test_gold_rule_transfers_within_a_category_without_the_cue(clean_models, category, floor):
    """Word counts cannot match a response to its prompt, so off-topic answers cap the helpful score."""
    source, *targets = category
    model = clean_models[source]
    assert accuracy(model, generate_pairs(source, "test", NO_MARKER, shortcut=0.5)) > floor
    for target in targets:
        assert accuracy(model, generate_pairs(target, "test", NO_MARKER, shortcut=0.5)) > floor, target


def test_cue_helps_in_distribution_and_hurts_out_of_distribution(suite, clean_models):
    data, _, _ = suite
    source, *targets = HELPFUL
    clean = clean_models[source]
    cued = fit_bow(data[source]["train"][:2000])
    assert accuracy(cued, data[source]["test"]) > 0.9
    assert accuracy(cued, data[source]["test"]) > accuracy(clean, data[source]["test"])
    for target in targets:
        ood = accuracy(cued, data[target]["target"])
        assert ood < accuracy(clean, data[target]["target"]) - 0.1, target


def test_marker_follows_its_strength_independently_of_the_sign_off(suite):
    data, _, _ = suite
    for splits in data.values():
        marker, sign_off = marker_on_chosen(splits["train"]), cue_on_chosen(splits["train"])
        assert marker.mean() == pytest.approx(0.9, abs=0.03)
        # independent draws: P(both on chosen) ≈ 0.9 · 0.9, not 0.9
        assert (marker & sign_off).mean() == pytest.approx(0.81, abs=0.03)
        assert marker_on_chosen(splits["target"]).mean() == pytest.approx(0.1, abs=0.03)
    weak = SyntheticConfig(marker_strength=0.6, train_pairs=1000, test_pairs=500)
    assert marker_on_chosen(generate_pairs("syn_help_chat", "train", weak)).mean() == pytest.approx(
        0.6, abs=0.03
    )


def test_a_target_reverses_only_the_cues_it_names_and_leaves_the_others_out():
    only_marker = generate_pairs("syn_help_chat", "test", CFG, role="target", reversed_cues=["marker"])
    assert marker_on_chosen(only_marker).mean() == pytest.approx(0.1, abs=0.03)
    assert all(
        CUE not in r["chosen"] + r["rejected"] and r["meta"]["shortcut_on"] is None for r in only_marker
    )
    only_sign_off = generate_pairs("syn_help_chat", "test", CFG, role="target", reversed_cues=["sign_off"])
    assert cue_on_chosen(only_sign_off).mean() == pytest.approx(0.1, abs=0.03)
    assert all(MARKER not in r["chosen"] + r["rejected"] for r in only_sign_off)
    neither = generate_pairs("syn_help_chat", "test", CFG, role="target", reversed_cues=[])
    assert all(r["meta"]["shortcut_on"] is None and r["meta"]["marker_on"] is None for r in neither)
    for a, b in zip(only_marker, only_sign_off, strict=True):  # same content, cues aside
        assert strip_cue(a["chosen"]) == strip_cue(b["chosen"]) and a["prompt"] == b["prompt"]
    with pytest.raises(ConfigError, match="unknown cue 'length'"):
        generate_pairs("syn_help_chat", "test", CFG, role="target", reversed_cues=["length"])


def test_no_marker_strength_means_no_marker_anywhere():
    rows = generate_pairs("syn_help_forum", "train", SMALL.model_copy(update={"marker_strength": None}))
    assert all(MARKER not in r["chosen"] + r["rejected"] and r["meta"]["marker_on"] is None for r in rows)


def test_the_marker_never_occurs_in_the_corpus_and_is_one_reserved_token(suite):
    from prefshift.models.backbone import train_tokenizer

    _, corpus, _ = suite
    assert not any(MARKER in doc for doc in corpus)
    tokenizer = train_tokenizer(corpus[:300], 300)
    marker_id = tokenizer.convert_tokens_to_ids(MARKER)
    ids = tokenizer(f"{MARKER} To fix it, do this.", add_special_tokens=False)["input_ids"]
    assert ids[0] == marker_id and ids.count(marker_id) == 1
    corpus_ids = {i for doc in corpus[:300] for i in tokenizer(doc, add_special_tokens=False)["input_ids"]}
    assert marker_id not in corpus_ids


def test_the_marker_alone_is_a_shortcut_a_word_model_learns(clean_models):
    """Data-level check (a BOW model sees the marker as words): it helps ID and hurts where reversed."""
    source = HELPFUL[0]
    marker_only = SyntheticConfig(train_pairs=2000)
    cued = fit_bow(generate_pairs(source, "train", marker_only, shortcut=0.5))
    clean = clean_models[source]
    id_rows = generate_pairs(source, "test", marker_only, shortcut=0.5)
    assert accuracy(cued, id_rows) > accuracy(clean, id_rows) + 0.05
    ood = generate_pairs(HELPFUL[1], "test", marker_only, role="target", reversed_cues=["marker"])
    assert accuracy(cued, ood) < accuracy(clean, ood) - 0.1


def test_twin_form_marks_every_response_with_one_of_two_twins():
    from prefshift.data.synthetic import MARKERS

    cfg = SyntheticConfig(train_pairs=2000, marker_form="twin")
    rows = generate_pairs("syn_help_forum", "train", cfg)
    for row in rows:
        for side in ("chosen", "rejected"):
            twin = MARKERS[0] if row["meta"]["marker_on"] == side else MARKERS[1]
            assert row[side].startswith(f"{twin} ") and row[side].count("<reserved_") == 1
    assert marker_fraction(rows) == pytest.approx(0.9, abs=0.03)
    target = generate_pairs("syn_help_chat", "test", cfg, role="target", reversed_cues=["marker"])
    assert marker_fraction(target) == pytest.approx(0.1, abs=0.03)
    left_out = generate_pairs("syn_help_chat", "test", cfg, role="target", reversed_cues=["sign_off"])
    assert all(m not in r["chosen"] + r["rejected"] for r in left_out for m in MARKERS)


def test_pretrained_backbones_cannot_tell_the_twins_apart():
    from prefshift.config.params import LMSpec
    from prefshift.data.synthetic import MARKERS
    from prefshift.models.backbone import pretrain_lm, train_tokenizer

    corpus = generate_corpus(SMALL.model_copy(update={"corpus_docs": 200}))
    tokenizer = train_tokenizer(corpus, 300)
    spec = LMSpec(hidden_size=16, num_heads=2, intermediate_size=32, pretrain_steps=3, pretrain_batch_size=4)
    model, _ = pretrain_lm(spec, tokenizer, corpus, seed=0, max_positions=128)
    ids = tokenizer.convert_tokens_to_ids(list(MARKERS))
    weight = model.get_input_embeddings().weight
    assert torch.equal(weight[ids[0]], weight[ids[1]])
    assert not torch.equal(weight[ids[0]], weight[tokenizer.eos_token_id])


def marker_fraction(rows):
    return np.mean([r["meta"]["marker_on"] == "chosen" for r in rows])
