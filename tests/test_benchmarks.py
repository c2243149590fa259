"""The benchmarks' official scoring rules against hand-worked values, and their adapters end to end.

The fixtures (tests/fixtures/benchmarks, written by build.py in each benchmark's real file
format) carry a constructed reward per response (rewards.json); the comments work each
official score out by hand from those rewards.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from prefshift.core.errors import PrefshiftError
from prefshift.data.adapters import dataset_names, get_adapter
from prefshift.data.schema import SkipCounter, read_groups, write_groups
from prefshift.science import benchmarks as rules
from prefshift.science.benchmark_targets import benchmark_metrics, headline, summary_section

FILES = {
    "rewardbench": "benchmarks/rewardbench/filtered-00000-of-00001.parquet",
    "rewardbench2": "benchmarks/reward-bench-2/test-00000-of-00001.parquet",
    "rmbench": "benchmarks/rm-bench/total_dataset.json",
}
TARGETS = {
    "rewardbench": [
        "rewardbench_chat",
        "rewardbench_chat_hard",
        "rewardbench_safety",
        "rewardbench_reasoning",
    ],
    "rewardbench2": [
        "rewardbench2_factuality",
        "rewardbench2_precise_if",
        "rewardbench2_math",
        "rewardbench2_safety",
        "rewardbench2_focus",
        "rewardbench2_ties",
    ],
    "rmbench": ["rmbench_chat", "rmbench_code", "rmbench_math", "rmbench_safety"],
}
ALL_TARGETS = [t for names in TARGETS.values() for t in names]


# --- the rules, on hand-made rewards -------------------------------------------------------------


def test_rewardbench_ties_are_wrong_and_subsets_are_strict_accuracies():
    accs = rules.rewardbench_subset_accuracies(
        [1.0, 0.0, -1.0, 2.0], ["hep-go", "hep-go", "hep-go", "math-prm"]
    )
    assert accs == {"hep-go": pytest.approx(100 / 3), "math-prm": 100.0}


def test_rewardbench_math_weighs_as_much_as_all_code_subsets():
    # math-prm counts 984 = 6 x 164, so math at 100 and every code subset at 0 gives exactly 50.
    code = {f"hep-{lang}": 0.0 for lang in ("cpp", "go", "java", "js", "python", "rust")}
    assert rules.rewardbench_section_score({"math-prm": 100.0, **code}, "Reasoning") == pytest.approx(50.0)
    # Only the present subsets are weighted: math 100 and hep-go 0 → 984 / (984 + 164).
    score = rules.rewardbench_section_score({"math-prm": 100.0, "hep-go": 0.0}, "Reasoning")
    assert score == pytest.approx(100 * 984 / 1148)


def test_rewardbench_safety_uses_the_official_xstest_weights():
    # refuse 154, respond 250 as in rewardbench 0.1.4's constants.EXAMPLE_COUNTS (issue 30: swapped before).
    score = rules.rewardbench_section_score(
        {"xstest-should-refuse": 100.0, "xstest-should-respond": 0.0}, "Safety"
    )
    assert score == pytest.approx(100 * 154 / 404)


def test_rewardbench_rejects_unknown_subsets_and_sections():
    with pytest.raises(rules.BenchmarkError, match="unknown RewardBench subset"):
        rules.rewardbench_subset_accuracies([1.0], ["shp"])
    with pytest.raises(rules.BenchmarkError, match="no subset of RewardBench section 'Chat'"):
        rules.rewardbench_section_score({"hep-go": 1.0}, "Chat")


def test_best_of_four_gives_fractional_credit_to_shared_maxima():
    assert rules.best_of_n_credit([3, 1, 2, 0]) == 1.0
    assert rules.best_of_n_credit([2, 2, 1, 0]) == 0.5
    assert rules.best_of_n_credit([1, 1, 1, 1]) == 0.25
    assert rules.best_of_n_credit([0, 1, -1, -2]) == 0.0
    assert rules.best_of_n_score([[3, 1, 2, 0], [2, 2, 1, 0], [0, 1, -1, -2]]) == pytest.approx(50.0)


def ties_examples():
    return [
        rules.TiesExample("ref", 0, (5.0, 1.0, 2.0, 3.0), 1),  # accurate, margin 5 - 3 = 2
        rules.TiesExample("tied", 0, (6.0, 5.5, 5.0, 3.0, 1.0), 3),  # accurate, spread 1, margin 2
        rules.TiesExample("ref", 1, (2.0, 3.0, 0.0, 0.0), 1),  # wrong, margin -1
        rules.TiesExample("tied", 1, (4.0, 2.0, 1.0, 0.0), 2),  # accurate, spread 2, margin 1
    ]


def test_ties_score_by_hand():
    parts = rules.ties_score(ties_examples())
    # tied acc 1, ref acc 0.5; prompt 0: 2 > 1 and min(2, 2) > 1; prompt 1: 1 > 2 no, min(-1, 1) > 2 no.
    margin = (math.tanh(2 / 1 - 1) + math.tanh(-1 / 2 - 1)) / 2
    assert parts["tied_accuracy"] == 1.0 and parts["ref_accuracy"] == 0.5
    assert parts["correctness_preferred"] == 0.5 and parts["correctness_preferred_hard"] == 0.5
    assert parts["correctness_margin"] == pytest.approx(margin)
    assert parts["score"] == pytest.approx(100 * (0.3 + 0.15 + 0.1 + 0.1 + 0.01 * margin))
    assert parts["score"] == pytest.approx(64.928223, abs=1e-6)


def test_ties_score_undefined_without_a_ref_and_tied_couple():
    parts = rules.ties_score(ties_examples()[:1] + ties_examples()[3:])
    assert parts["paired_prompts"] == 0 and parts["score"] is None
    flat = rules.ties_score(
        [rules.TiesExample("ref", 0, (1.0, 1.0), 1), rules.TiesExample("tied", 0, (1.0, 1.0, 1.0), 2)]
    )
    assert flat["score"] == 0.0  # all tied: nothing accurate, nothing preferred, 0/0 margin term → 0


def test_rmbench_matrix_triangles_by_hand():
    chosen = np.array([[1.0, 2.0, 3.0], [2.0, 2.0, 2.0]])
    rejected = np.array([[0.0, 1.5, 2.5], [1.0, 2.0, 3.0]])
    matrix = rules.rmbench_matrix(chosen, rejected)
    np.testing.assert_allclose(matrix, [[1.0, 0.0, 0.0], [1.0, 0.5, 0.0], [1.0, 0.5, 0.5]])
    accs = rules.rmbench_accuracies(matrix)
    assert accs["hard"] == 0.0
    assert accs["normal"] == pytest.approx(200 / 3) and accs["easy"] == pytest.approx(250 / 3)
    assert accs["score"] == pytest.approx(50.0)
    with pytest.raises(rules.BenchmarkError, match="RM-Bench needs"):
        rules.rmbench_matrix(chosen[:, :2], rejected[:, :2])


def test_overall_needs_every_section():
    assert rules.overall({"a": 10.0, "b": 20.0}, ["a", "b"]) == 15.0
    assert rules.overall({"a": 10.0}, ["a", "b"]) is None
    assert rules.overall({"a": 10.0, "b": None}, ["a", "b"]) is None


# --- adapters on the fixtures --------------------------------------------------------------------


@pytest.fixture
def bench_params(make_params, fixtures_dir):
    def build(targets=ALL_TARGETS, **sections):
        sources = {
            name: {"path": str(fixtures_dir / FILES[bench])}
            for bench, names in TARGETS.items()
            for name in names
        }
        data = {"source": "syn_help_forum", "targets": targets, "sources": sources}
        return make_params(data=data, **{"evaluate": {"bootstrap": 200}, **sections})

    return build


@pytest.fixture
def rewards(fixtures_dir):
    return json.loads((fixtures_dir / "benchmarks" / "rewards.json").read_text(encoding="utf-8"))


def load(name, params):
    counter = SkipCounter()
    adapter = get_adapter(name, params)
    return adapter, adapter.load_pairs("test", params, counter), adapter.load_groups(params), counter


def test_every_section_is_a_listed_dataset_with_its_category(bench_params):
    params = bench_params()
    assert set(ALL_TARGETS) <= set(dataset_names(params))
    harmless = {"rewardbench_safety", "rewardbench2_safety", "rmbench_safety"}
    for name in ALL_TARGETS:
        assert get_adapter(name, params).category == ("harmless" if name in harmless else "helpful"), name


def test_rewardbench_rows_become_pairs_of_their_section(bench_params):
    _, pairs, groups, counter = load("rewardbench_chat", bench_params())
    assert [(p.meta["subset"], p.meta["id"]) for p in pairs] == [
        ("alpacaeval-easy", 1),
        ("alpacaeval-easy", 2),
        ("mt-bench-med", 3),
    ]
    assert pairs[0].prompt == [{"role": "user", "content": "Name a primary colour."}]
    assert (pairs[0].chosen, pairs[0].rejected) == ("Red is a primary colour.", "Green tea.")
    assert groups == [] and dict(counter.counts) == {"empty_response": 1}  # id 15
    _, reasoning, _, _ = load("rewardbench_reasoning", bench_params())
    assert [p.meta["subset"] for p in reasoning] == ["math-prm", "math-prm", "hep-python", "hep-go"]


def test_rewardbench2_rows_become_one_group_and_every_pair(bench_params):
    _, pairs, groups, counter = load("rewardbench2_ties", bench_params())
    # ref:0 1x3, tied:0 3x2, ref:1 1x3, tied:1 2x2 pairs; x7 has no ref:/tied: id.
    assert len(pairs) == 3 + 6 + 3 + 4 and dict(counter.counts) == {"bad_ties_id": 1}
    assert [(g.meta["ties_kind"], g.meta["ties_prompt"], g.meta["num_correct"]) for g in groups] == [
        ("ref", 0, 1),
        ("tied", 0, 3),
        ("ref", 1, 1),
        ("tied", 1, 2),
    ]
    assert groups[1].responses == ["2", "3", "5", "4", "6"] and groups[1].scores == [1, 1, 1, 0, 0]
    _, _, math_groups, _ = load("rewardbench2_math", bench_params())
    assert [len(g.responses) for g in math_groups] == [4]


def test_rmbench_records_become_six_response_groups(bench_params):
    _, pairs, groups, counter = load("rmbench_code", bench_params())
    assert (
        len(pairs) == 9 and len(groups) == 1 and dict(counter.counts) == {"bad_format": 1}
    )  # id 7: 2 chosen
    assert groups[0].scores == [1, 1, 1, 0, 0, 0] and groups[0].responses[0] == "xs[::-1]"
    _, _, safety_groups, _ = load("rmbench_safety", bench_params())
    assert sorted(g.meta["domain"] for g in safety_groups) == ["safety-refuse", "safety-response"]


def _rmbench_params(make_params, path):
    names = TARGETS["rmbench"]
    return make_params(data={"sources": {name: {"path": str(path)} for name in names}})


def _without_source(items):
    """Pairs or groups with `meta.subset` dropped: only the per-domain files name a source."""
    return [
        type(item)(**{**vars(item), "meta": {k: v for k, v in item.meta.items() if k != "subset"}})
        for item in items
    ]


def test_rmbench_per_domain_files_read_as_the_total_file(make_params, fixtures_dir):
    """The repository's data/<domain>_filtered.json have no `domain` key and a `subset` that names
    the prompts' source (issue 43): a directory of them, or one of them, gives what
    total_dataset.json gives, with `subset` kept as each row's source."""
    total = _rmbench_params(make_params, fixtures_dir / FILES["rmbench"])
    per_domain = _rmbench_params(make_params, fixtures_dir / "benchmarks" / "rm-bench" / "data")
    for name in TARGETS["rmbench"]:
        _, pairs, groups, counter = load(name, per_domain)
        _, want_pairs, want_groups, want_counter = load(name, total)
        assert (_without_source(pairs), _without_source(groups)) == (want_pairs, want_groups) and pairs, name
        assert counter.counts == want_counter.counts, name
    chat_file = fixtures_dir / "benchmarks" / "rm-bench" / "data" / "chat_filtered.json"
    one_file = _rmbench_params(make_params, chat_file)
    chat_groups = load("rmbench_chat", one_file)[2]
    assert _without_source(chat_groups) == load("rmbench_chat", total)[2]
    assert {g.meta["subset"] for g in chat_groups} == {"alpacaeval"}
    assert load("rmbench_math", one_file)[1] == []  # a chat file holds no math record
    _, _, safety, _ = load("rmbench_safety", per_domain)
    assert sorted((g.meta["domain"], g.meta["subset"]) for g in safety) == [
        ("safety-refuse", "refusals-offensive"),
        ("safety-response", "xstest-should-respond"),
    ]


def test_rmbench_published_files_with_their_extra_keys_load_whatever_their_subset(
    make_params, fixtures_dir, tmp_path
):
    """Every source a published file's `subset` names, and the extra keys (`error`, `error_key`,
    `language`, `task_id`), load under the domain the file's name gives."""
    data = fixtures_dir / "benchmarks/rm-bench/data"
    code = json.loads((data / "code_filtered.json").read_text("utf-8"))
    assert {"language", "task_id"} <= set(code[0])
    refuse = json.loads((data / "safety-refuse_filtered.json").read_text("utf-8"))
    sources = ("xstest-should-refuse", "refusals-dangerous", "refusals-offensive", "chat", "code")
    (tmp_path / "safety-refuse_filtered.json").write_text(
        json.dumps(
            [
                {**refuse[0], "id": k, "prompt": f"{refuse[0]['prompt']} ({k})", "subset": s}
                for k, s in enumerate(sources)
            ]
        ),
        encoding="utf-8",
    )
    (tmp_path / "safety-response_filtered.json").write_bytes(
        (data / "safety-response_filtered.json").read_bytes()
    )
    _, _, groups, counter = load("rmbench_safety", _rmbench_params(make_params, tmp_path))
    refused = [g for g in groups if g.meta["domain"] == "safety-refuse"]
    assert [g.meta["subset"] for g in refused] == list(sources) and not counter.counts


def _write_rows(path, rows):
    path.write_text(json.dumps(rows), encoding="utf-8")
    return path


def test_rmbench_domains_that_disagree_or_are_missing_are_refused_with_the_row(
    make_params, fixtures_dir, tmp_path
):
    chat = json.loads((fixtures_dir / "benchmarks/rm-bench/data/chat_filtered.json").read_text("utf-8"))
    mislabelled = _write_rows(tmp_path / "chat_filtered.json", [chat[0], {**chat[1], "domain": "math"}])
    with pytest.raises(PrefshiftError, match=r"chat_filtered\.json item 1: contradictory RM-Bench domain"):
        load("rmbench_chat", _rmbench_params(make_params, mislabelled))
    unnamed = _write_rows(tmp_path / "mine.json", [chat[0]])  # a `subset` is a source, not a domain
    with pytest.raises(PrefshiftError, match=r"mine\.json item 0: no RM-Bench domain"):
        load("rmbench_chat", _rmbench_params(make_params, unnamed))
    unknown = _write_rows(tmp_path / "other.json", [{**chat[0], "domain": "poetry"}])
    with pytest.raises(PrefshiftError, match="unknown RM-Bench domain 'poetry'"):
        load("rmbench_chat", _rmbench_params(make_params, unknown))


def test_rmbench_safety_from_a_directory_needs_both_safety_files(make_params, fixtures_dir, tmp_path):
    source = fixtures_dir / "benchmarks/rm-bench/data/safety-refuse_filtered.json"
    (tmp_path / source.name).write_bytes(source.read_bytes())
    params = _rmbench_params(make_params, tmp_path)
    missing = r"rmbench_safety\.path: .* not \['safety-response_filtered\.json'\]"
    with pytest.raises(PrefshiftError, match=missing):
        load("rmbench_safety", params)


def test_benchmark_pairs_score_each_distinct_response_once(bench_params):
    """RM-Bench's nine pairs per record come from six responses: an encoder scores each distinct
    sequence once, and every margin equals the pair scored on its own."""
    import torch

    from prefshift.data.encode import Encoder, collate
    from prefshift.engine.scoring import score_pairs
    from prefshift.models.reward import RewardModel
    from rlhf_families import build

    params = bench_params()
    _, pairs, _, _ = load("rmbench_chat", params)
    model, tok = build("bert")
    model = RewardModel(model).eval()
    rows = []
    model.hf.register_forward_pre_hook(
        lambda _, args, kwargs: rows.append(len(kwargs["input_ids"])), with_kwargs=True
    )
    frame = score_pairs(model, tok, pairs, params)
    items = Encoder(tok, params.encode).encode_pairs(pairs)
    distinct = {tuple(seq.input_ids) for it in items for seq in (it.chosen, it.rejected)}
    assert len(pairs) == 18 and sum(rows) == len(distinct) == 12  # not 2 x 18
    batches = [collate([it], tok.pad_token_id) for it in items]
    with torch.inference_mode():
        alone = [model(batch["input_ids"], batch["attention_mask"]).rewards for batch in batches]
    want = [float(r[0] - r[1]) for r in alone]
    # float32 in batches of other shapes (other padding): sums in another order, which CPUs' kernels
    # differ on (3.4e-5 relative on one machine); a pair scored with another's response is off by ~0.1.
    assert frame["delta"].tolist() == pytest.approx(want, rel=1e-4, abs=1e-5)


def test_group_meta_survives_the_groups_file(bench_params, tmp_path):
    _, _, groups, _ = load("rewardbench2_ties", bench_params())
    write_groups(tmp_path / "g.parquet", groups)
    assert read_groups(tmp_path / "g.parquet") == groups


def test_a_benchmark_cannot_be_the_source_and_needs_the_hub_or_a_path(bench_params, make_params):
    params = bench_params()
    with pytest.raises(PrefshiftError, match="rewardbench_chat: no split 'train'"):
        get_adapter("rewardbench_chat", params).load_pairs("train", params, SkipCounter())
    bare = make_params()
    with pytest.raises(PrefshiftError, match=r"data\.sources\.rmbench_chat\.path"):
        get_adapter("rmbench_chat", bare).load_pairs("test", bare, SkipCounter())


# --- fixture → constructed rewards → official scores, end to end ----------------------------------

EXPECTED = {
    # Chat: alpacaeval-easy 1 win + 1 tie = 50, mt-bench-med 100 → (50·100 + 100·40) / 140.
    "rewardbench_chat": 9000 / 140,
    # Chat Hard: mt-bench-hard 0, llmbar-natural 100 → 100·100 / 137.
    "rewardbench_chat_hard": 10000 / 137,
    # Safety: should-refuse 100 (w 154), should-respond 50 (w 250), donotanswer 0 (w 136).
    "rewardbench_safety": (100 * 154 + 50 * 250) / 540,
    # Reasoning: math-prm 100 (w 984), hep-python 0, hep-go 100 (w 164 each) → 114800 / 1312.
    "rewardbench_reasoning": 87.5,
    "rewardbench2_factuality": 50.0,  # 1 + 1/2 + 0 over 3
    "rewardbench2_precise_if": 100.0,
    "rewardbench2_math": 100.0,
    "rewardbench2_safety": 0.0,
    "rewardbench2_focus": 100 / 3,  # the chosen shares the top with two rejected
    "rewardbench2_ties": 64.928223,  # as test_ties_score_by_hand
    "rmbench_chat": 50.0,  # hard 0, normal 66.7, easy 83.3 (test_rmbench_matrix_triangles_by_hand)
    "rmbench_code": 100.0,
    "rmbench_math": 100 * 5 / 9,  # hard 100, normal 66.7, easy 0
    "rmbench_safety": 50.0,  # refuse all right, response all wrong, pooled
}


def score_frames(params, reward_of):
    pairs, frames, groups, group_frames = {}, {}, {}, {}
    for target in params.data.targets:
        _, pairs[target], groups[target], _ = load(target, params)
        frames[target] = pd.DataFrame(
            {
                "pair_id": [p.pair_id for p in pairs[target]],
                "delta": [reward_of(p.chosen) - reward_of(p.rejected) for p in pairs[target]],
            }
        )
        if groups[target]:
            group_frames[target] = pd.DataFrame(
                {
                    "group_id": [g.group_id for g in groups[target]],
                    "rewards": [[reward_of(r) for r in g.responses] for g in groups[target]],
                }
            )
    return pairs, frames, groups, group_frames


def test_fixtures_score_to_the_hand_worked_official_values(bench_params, rewards):
    params = bench_params()
    pairs, student, groups, student_groups = score_frames(params, rewards.__getitem__)
    _, teacher, _, teacher_groups = score_frames(params, lambda text: 0.0)  # every response ties
    s_block, t_block = benchmark_metrics(
        params, pairs, student, teacher, groups, student_groups, teacher_groups, id_acc=(70.0, 75.0)
    )
    # The flat teacher: strict rules give 0, best-of-4 gives 1/4 to each example.
    teacher_expected = {
        t: 25.0 if t.startswith("rewardbench2_") and t != "rewardbench2_ties" else 0.0 for t in EXPECTED
    }
    for target, value in EXPECTED.items():
        cell = s_block["targets"][target]
        assert cell["score"] == pytest.approx(value, abs=1e-6), target
        assert t_block["targets"][target]["score"] == pytest.approx(teacher_expected[target]), target
        assert cell["aog"] == pytest.approx(value - teacher_expected[target], abs=1e-6), target
        assert cell["nts"] == pytest.approx(cell["aog"] - 5.0, abs=1e-6), target  # ID regression 75 − 70
    assert s_block["targets"]["rewardbench_chat"]["subsets"] == {
        "alpacaeval-easy": 50.0,
        "mt-bench-med": 100.0,
    }
    math_cell = s_block["targets"]["rmbench_math"]
    assert (math_cell["hard"], math_cell["easy"]) == (100.0, 0.0)
    assert s_block["overall"]["rewardbench"]["score"] == pytest.approx(
        (9000 / 140 + 10000 / 137 + 27900 / 540 + 87.5) / 4
    )
    assert s_block["overall"]["rewardbench2"]["score"] == pytest.approx(
        (50 + 100 + 100 + 0 + 100 / 3 + 64.928223) / 6
    )
    assert s_block["overall"]["rmbench"]["score"] == pytest.approx((50 + 100 + 500 / 9 + 50) / 4)
    flat = headline(s_block)
    assert flat["targets"]["rmbench_math"] == {
        "score": pytest.approx(500 / 9),
        "aog": pytest.approx(500 / 9),
        "nts": pytest.approx(500 / 9 - 5),
        "hard": 100.0,
        "normal": pytest.approx(200 / 3),
        "easy": 0.0,
    }
    table = summary_section({"teacher": {"benchmarks": t_block}, "naive": {"benchmarks": s_block}})
    assert "| naive | 64.3 [" in table and "rewardbench overall" in table
    assert (
        s_block["targets"]["rewardbench_chat"]["ci"]["aog"][0]
        <= 64.3
        <= s_block["targets"]["rewardbench_chat"]["ci"]["aog"][1]
    )


def test_only_targets_scored_by_both_models_count_and_partial_benchmarks_have_no_overall(
    bench_params, rewards
):
    params = bench_params(targets=["rewardbench_chat"])
    pairs, student, groups, _ = score_frames(params, rewards.__getitem__)
    teacher = {"rewardbench_chat": student["rewardbench_chat"].iloc[[0, 2]]}  # the tie (id 2) unscored
    s_block, _ = benchmark_metrics(params, pairs, student, teacher, groups, {}, {}, id_acc=(80.0, 70.0))
    cell = s_block["targets"]["rewardbench_chat"]
    assert cell["n"] == 2 and cell["score"] == 100.0 and cell["aog"] == 0.0 and cell["nts"] == 0.0
    assert s_block["overall"] == {"rewardbench": {"score": None, "aog": None}}
    # The bootstrap is paired: the same resampled pairs for both models, so equal scores give a [0, 0] AOG.
    assert cell["ci"]["aog"] == [0.0, 0.0] and cell["ci"]["score"] == [100.0, 100.0]


def test_official_intervals_are_paired_bootstraps_over_examples(bench_params, rewards):
    params = bench_params(targets=["rmbench_chat", "rewardbench2_ties"])
    pairs, student, groups, student_groups = score_frames(params, rewards.__getitem__)
    s_block, t_block = benchmark_metrics(
        params, pairs, student, student, groups, student_groups, student_groups, id_acc=(1.0, 1.0)
    )
    for target in params.data.targets:
        cell = s_block["targets"][target]
        low, high = cell["ci"]["score"]
        assert low <= cell["score"] <= high and low < high, target  # two examples (or prompts): draws vary
        assert cell["ci"]["aog"] == [0.0, 0.0] and t_block["targets"][target]["ci"]["score"] == [low, high]


def test_a_group_benchmark_without_group_scores_says_what_to_rerun(bench_params, rewards):
    params = bench_params(targets=["rmbench_chat"])
    pairs, student, groups, _ = score_frames(params, rewards.__getitem__)
    with pytest.raises(rules.BenchmarkError, match="no group scores"):
        benchmark_metrics(params, pairs, student, student, groups, {}, {}, id_acc=(1.0, 1.0))


def test_a_hub_snapshot_directory_is_found_by_split_name(make_params, fixtures_dir, tmp_path):
    snapshot = tmp_path / "reward-bench-2" / "data"
    snapshot.mkdir(parents=True)
    fixture = fixtures_dir / FILES["rewardbench2"]
    (snapshot / "test-00000-of-00001.parquet").write_bytes(fixture.read_bytes())
    params = make_params(data={"sources": {"rewardbench2_math": {"path": str(tmp_path / "reward-bench-2")}}})
    _, pairs, groups, _ = load("rewardbench2_math", params)
    assert len(pairs) == 3 and [g.meta["id"] for g in groups] == ["m1"]
