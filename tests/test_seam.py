"""SEAM labels: parsing, node selection and aggregation by hand, the generation cache, the stage."""

from __future__ import annotations

import math
import shutil
from dataclasses import replace

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from prefshift.config.params import Params, SeamConfig
from prefshift.core.paths import Layout
from prefshift.data.schema import make_pair, read_pairs, write_pairs
from prefshift.engine.scoring import score_pairs
from prefshift.engine.seam import (
    DEFAULT_PRINCIPLES,
    PREAMBLE,
    TEMPLATE_VERSION,
    GenerationCache,
    PrincipleGenerator,
    SeamError,
    aggregate,
    condition,
    generation_context,
    parse_principles,
    principles_for,
)
from prefshift.models.reward import load_reward_model, save_reward_model
from prefshift.pipeline.stages import seam_label, seam_principles
from prefshift.pipeline.stages.label import read_labels
from split_manifests import write_split_manifests
from tiny_models import base_dir, install_backbones, reward_model, tokenizer

WELL_FORMED = """Sure! Here are the questions:
1. Does the response answer the question that was asked?
2) Is it polite?
- does the response answer the question   that was asked?
* **Is the response accurate and complete?**
Q5: Should the assistant mention safety risks?
How do I fix the door?
Does it?
"""


def test_parse_keeps_numbered_and_bulleted_yes_no_questions_once():
    assert parse_principles(WELL_FORMED, 10) == [
        "Does the response answer the question that was asked?",
        "Is it polite?",
        "Is the response accurate and complete?",
        "Should the assistant mention safety risks?",
    ]
    assert parse_principles(WELL_FORMED, 2) == [
        "Does the response answer the question that was asked?",
        "Is it polite?",
    ]


@pytest.mark.parametrize(
    "junk",
    ["", "the door the door the door", "user: how do I fix the door?\nassistant: first fix it", "Is?\n???"],
)
def test_junk_falls_back_to_the_category_defaults(junk):
    assert parse_principles(junk, 4) == []
    assert principles_for(junk, "harmless", 3) == (list(DEFAULT_PRINCIPLES["harmless"][:3]), True)
    assert principles_for(WELL_FORMED, "harmless", 1) == (
        ["Does the response answer the question that was asked?"],
        False,
    )


def test_selection_keeps_the_most_confident_nodes_and_weights_them():
    nodes = np.array(
        [
            [0.9, 0.6, 0.2, math.nan],  # keeps 0.9 and 0.2 (|q-0.5| = 0.4, 0.3)
            [0.5, 0.5, math.nan, math.nan],  # no information: 0.5
            [math.nan, 0.7, math.nan, math.nan],  # one node present
            [math.nan] * 4,  # nothing to aggregate
            [0.3, 0.7, 0.6, 0.55],  # tie 0.3/0.7: the earlier node wins the first slot, 0.7 the second
        ]
    )
    q, kept = aggregate(nodes, keep_top_k=2, weighting="confidence")
    # weights |2q-1|: 0.8 and 0.6 → (0.8·0.9 + 0.6·0.2) / 1.4 = 0.6
    assert q[:3] == pytest.approx([0.6, 0.5, 0.7])
    assert math.isnan(q[3])
    assert q[4] == pytest.approx(0.5)  # weights 0.4, 0.4 → (0.12 + 0.28) / 0.8
    assert kept.tolist() == [2, 2, 1, 0, 2]
    q, _ = aggregate(nodes, keep_top_k=2, weighting="entropy")
    # 1 - H2(0.9) = 0.531004, 1 - H2(0.2) = 0.278072 → (0.477904 + 0.055614) / 0.809076
    assert q[0] == pytest.approx(0.659417, abs=1e-6)
    q, kept = aggregate(nodes, keep_top_k=1, weighting="entropy")
    assert q[:3] == pytest.approx([0.9, 0.5, 0.7]) and kept.tolist() == [1, 1, 1, 0, 1]


def test_principle_goes_before_the_last_user_turn_or_into_a_system_turn():
    pair = make_pair(
        dataset="toy",
        category="helpful",
        prompt=[
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello"},
            {"role": "user", "content": "fix the door?"},
        ],
        chosen="yes",
        rejected="no",
    )
    preamble = PREAMBLE.format(principle="Is it kind?")
    user = condition(pair, "Is it kind?", "last_user", 2)
    assert user.pair_id == f"{pair.pair_id}#2"
    assert [m["content"] for m in user.prompt] == ["hi", "hello", preamble + "fix the door?"]
    assert generation_context(pair, "request") == [pair.prompt[2]]
    assert generation_context(pair, "conversation") == pair.prompt
    system = condition(pair, "Is it kind?", "system", 1)
    assert system.prompt[0] == {"role": "system", "content": preamble.rstrip()}
    assert system.prompt[1:] == pair.prompt
    assert pair.prompt[2]["content"] == "fix the door?"  # the original pair is untouched


def test_cache_rejects_a_foreign_file(tmp_path):
    path = tmp_path / "generations.parquet"
    write_pairs(path, [])
    with pytest.raises(SeamError, match=r"generations\.parquet: generation cache needs columns"):
        GenerationCache.load(path)


def _pairs():
    """Seven pairs over three requests (the last one after small talk): principles are made per request."""
    out = []
    for i in range(6):
        noun = ("door", "window", "lamp")[i % 3]
        out.append(
            make_pair(
                dataset="toy",
                category="helpful",
                prompt=[{"role": "user", "content": f"how do I fix the {noun}?"}],
                chosen=f"first fix it gently, then check the {noun}" + " again" * i,
                rejected="no idea" + " really" * i,
            )
        )
    small_talk = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    out.append(replace(out[0], pair_id="after-small-talk", prompt=small_talk + out[0].prompt))
    return out


def _project(root) -> Layout:
    """student_train, id_test, the split manifests, a tiny strong LM and a tiny, decisive teacher."""
    layout = Layout(root, seed=0)
    write_pairs(layout.split("student_train"), _pairs())
    write_pairs(layout.split("id_test"), _pairs()[:2])  # train scores id_test (targets: score-target)
    write_split_manifests(layout)
    install_backbones(layout, base_dir(root), base_dir(root))
    teacher = reward_model(seed=3)
    with torch.no_grad():
        teacher.hf.score.weight.mul_(10.0)
    save_reward_model(teacher, tokenizer(), layout.teacher_dir)
    return layout


PARAMS = Params.model_validate(
    {
        "seam": {"max_new_tokens": 12, "keep_top_k": 2, "weighting": "confidence"},
        "data": {"teacher_noise": 0.0},
    }
)
"""The teacher as it is (no annotator noise): the labels below are checked against its own scores."""


def test_principles_are_generated_once_for_every_seed_and_junk_falls_back(tmp_path):
    layout = _project(tmp_path)
    alone = seam_label.run(PARAMS, layout)  # by hand, before seam-principles: generated, not stored
    assert (alone["generated"], alone["cache_hits"]) == (3, 0)
    assert not layout.seam_generations.exists()

    first = seam_principles.run(PARAMS, layout)
    assert (first["prompts"], first["generated"], first["cache_hits"], first["generate_calls"]) == (
        3,
        3,
        0,
        1,
    )
    assert first["fallback"] == 3 and first["parsed_ok"] == 0 and first["pairs_fallback"] == 7
    labelled = seam_label.run(PARAMS, layout)
    assert (labelled["generated"], labelled["cache_hits"], labelled["generate_calls"]) == (0, 3, 0)
    labels = pq.read_table(layout.seam_labels)
    assert labels.schema.metadata[b"split_version"] == b"v1"
    assert labels.column_names == ["pair_id", "q", "teacher_delta", "n_principles", "fallback"]
    assert labels.column("n_principles").to_pylist() == [4] * 7
    assert all(labels.column("fallback").to_pylist())
    assert set(read_labels(layout.seam_labels, layout)) == {p.pair_id for p in _pairs()}

    second = seam_principles.run(PARAMS, layout)
    assert (second["generated"], second["cache_hits"], second["generate_calls"]) == (0, 3, 0)
    assert pq.read_table(layout.seam_generations).num_rows == 3
    shutil.copytree(layout.teacher_dir, layout.for_seed(1).teacher_dir)
    other_seed = seam_label.run(PARAMS, layout.for_seed(1))  # another seed's labels: no generation
    assert other_seed["generated"] == 0 and layout.for_seed(1).seam_labels.exists()
    unlisted = PARAMS.model_copy(update={"methods": ["naive"]})
    assert seam_principles.run(unlisted, layout)["prompts"] == 0
    assert pq.read_table(layout.seam_generations).num_rows == 0


def test_seam_labels_follow_the_teacher_under_the_parsed_principles(tmp_path):
    layout = _project(tmp_path)
    principles = ["Does the reply fix the problem?", "Is the reply polite and clear?"]
    strong = layout.base_model("strong")
    generator = PrincipleGenerator(strong, PARAMS.seam)
    key = seam_label.model_key(strong)
    cache = GenerationCache({})
    for pair in _pairs()[:3]:
        rendered = generator.render("helpful", pair.prompt)
        cache.put(
            seam_label.content_hash(key, TEMPLATE_VERSION, rendered, PARAMS.seam.max_new_tokens),
            "\n".join(f"{i}. {p}" for i, p in enumerate(principles, start=1)),
        )
    cache.save(layout.seam_generations)

    counts = seam_label.run(PARAMS, layout)
    assert (counts["generated"], counts["parsed_ok"], counts["fallback"]) == (0, 3, 0)
    labels = pq.read_table(layout.seam_labels).to_pandas()
    assert labels["n_principles"].tolist() == [2] * 7 and not labels["fallback"].any()

    model, tok = load_reward_model(layout.teacher_dir)
    pairs = read_pairs(layout.split("student_train"))
    plain = score_pairs(model, tok, pairs, PARAMS)["delta"].tolist()
    under = [
        score_pairs(model, tok, [condition(p, text, "last_user", 1) for p in pairs], PARAMS)["delta"].tolist()
        for text in principles
    ]
    for row, delta in enumerate(plain):
        nodes = sorted(
            (1 / (1 + math.exp(-d)) for d in (delta, under[0][row], under[1][row])),
            key=lambda q: -abs(q - 0.5),
        )[:2]
        weights = [abs(2 * q - 1) for q in nodes]
        expected = sum(w * q for w, q in zip(weights, nodes, strict=True)) / sum(weights)
        assert labels["q"][row] == pytest.approx(expected, abs=1e-5)
        assert labels["teacher_delta"][row] == pytest.approx(delta, abs=1e-5)
    plain_q = 1 / (1 + np.exp(-np.array(plain)))
    assert np.abs(labels["q"].to_numpy() - plain_q).max() > 0.01  # the principles changed the labels
    assert counts["mean_abs_change_vs_plain"] > 0.0


def test_a_noisy_teacher_reverses_the_same_pairs_for_seam(tmp_path):
    """data.teacher_noise reverses the teacher's judgement of the pairs it picks in the teacher's
    own scores, so SEAM's labels carry the same annotator noise as naive's (q → 1 − q there)."""
    from prefshift.data.splits import noisy_pairs

    layout = _project(tmp_path)
    seam_label.run(PARAMS, layout)
    clean = pq.read_table(layout.seam_labels).to_pandas().set_index("pair_id")
    noisy_params = PARAMS.model_copy(update={"data": PARAMS.data.model_copy(update={"teacher_noise": 0.3})})
    seam_label.run(noisy_params, layout)
    noisy = pq.read_table(layout.seam_labels).to_pandas().set_index("pair_id")
    picked = noisy_pairs(clean.index.tolist(), 0.3, noisy_params.seed)
    assert len(picked) == 2
    for pair_id in clean.index:
        flip = pair_id in picked
        assert noisy.loc[pair_id, "q"] == pytest.approx(
            1 - clean.loc[pair_id, "q"] if flip else clean.loc[pair_id, "q"]
        )
        assert noisy.loc[pair_id, "teacher_delta"] == pytest.approx(
            (-1 if flip else 1) * clean.loc[pair_id, "teacher_delta"]
        )


def test_generation_is_bounded_and_deterministic(tmp_path):
    generator = PrincipleGenerator(base_dir(tmp_path), SeamConfig(max_new_tokens=5, generation_batch_size=2))
    texts = [generator.render("helpful", p.prompt) for p in _pairs()[:3]]
    first = generator.generate(texts)
    assert generator.generate(texts[::-1]) == first[::-1]  # batching and left padding do not change outputs
    assert all(len(tokenizer()(t, add_special_tokens=False)["input_ids"]) <= 5 for t in first)
    assert generator.calls == 4


@pytest.mark.slow
def test_train_seam_reads_the_seam_labels(tmp_path):
    from prefshift.pipeline.stages import train

    layout = _project(tmp_path)
    params = Params.model_validate(
        {**PARAMS.model_dump(include={"seam"}), "student": {"batch_size": 4, "epochs": 1, "drift_every": 1}}
    )
    seam_label.run(params, layout)
    assert train._targets(layout, "seam", _pairs()) == pytest.approx(
        pq.read_table(layout.seam_labels).column("q").to_pylist()
    )
    train.run(params, layout, "seam")
    model, _ = load_reward_model(layout.student_dir("seam"))
    assert model.num_layers == 2
