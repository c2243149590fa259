"""The split protocol and the prepare/split stages on small inputs."""

from __future__ import annotations

import json

import pytest

from prefshift.config.params import ConfigError, DataConfig
from prefshift.data.schema import make_pair, pair_content_hash, read_groups, read_pairs
from prefshift.data.splits import (
    SplitError,
    assert_disjoint,
    build_splits,
    build_target_split,
    check_split_version,
    check_version,
    current_version,
    file_sha256,
    load_manifest,
    noisy_pairs,
    seeded_order,
    split_entries,
    split_version,
)
from prefshift.pipeline.stages import prepare, split


def pairs(dataset, start, stop):
    return [
        make_pair(
            dataset=dataset,
            category="helpful",
            prompt=[{"role": "user", "content": f"question {i}"}],
            chosen=f"good answer {i}",
            rejected=f"bad answer {i}",
        )
        for i in range(start, stop)
    ]


def data_config(**fields):
    caps = {"teacher_train": None, "student_train": None, "id_test": None, "ood": None, "groups": None}
    caps.update(fields.pop("caps", {}))
    return DataConfig(source="src", targets=["tgt"], caps=caps, **fields)


def test_fraction_and_caps():
    built = build_splits(
        pairs("src", 0, 100),
        pairs("src", 100, 120),
        {"tgt": pairs("tgt", 200, 230)},
        data_config(teacher_fraction=0.3),
        0,
    )
    sizes = {name: len(split_pairs) for name, split_pairs in built.splits.items()}
    assert sizes == {"teacher_train": 30, "student_train": 70, "id_test": 20, "ood/tgt": 30}
    capped = build_splits(
        pairs("src", 0, 100),
        pairs("src", 100, 120),
        {"tgt": pairs("tgt", 200, 230)},
        data_config(caps={"teacher_train": 10, "student_train": 5, "id_test": 7, "ood": 4}),
        0,
    )
    sizes = {name: len(split_pairs) for name, split_pairs in capped.splits.items()}
    assert sizes == {"teacher_train": 10, "student_train": 5, "id_test": 7, "ood/tgt": 4}
    uncapped = build_splits(
        pairs("src", 0, 100), pairs("src", 100, 120), {"tgt": pairs("tgt", 200, 230)}, data_config(), 0
    )
    assert capped.splits["teacher_train"] == uncapped.splits["teacher_train"][:10]  # a cap takes a prefix


def test_order_depends_on_seed_only():
    items = pairs("src", 0, 50)
    assert seeded_order(items, 1) == seeded_order(list(reversed(items)), 1)
    assert seeded_order(items, 1) != seeded_order(items, 2)
    assert sorted(p.pair_id for p in seeded_order(items, 2)) == sorted(p.pair_id for p in items)


def test_teacher_noise_picks_an_exact_seeded_share_by_pair():
    ids = [p.pair_id for p in pairs("src", 0, 200)]
    assert noisy_pairs(ids, 0.0, seed=0) == set()
    picked = noisy_pairs(ids, 0.15, seed=0)
    assert len(picked) == 30 and picked <= set(ids)
    assert noisy_pairs(list(reversed(ids)), 0.15, seed=0) == picked  # by pair, not by position
    assert noisy_pairs(ids, 0.15, seed=1) != picked
    with pytest.raises(ValueError, match="teacher_noise"):  # 0.5 would erase the teacher's signal
        data_config(teacher_noise=0.5)


def test_test_side_copies_of_training_content_are_removed_and_counted():
    train = pairs("src", 0, 40)
    leaked = make_pair(  # same content as a training pair, label order swapped
        dataset="src",
        category="helpful",
        prompt=[{"role": "user", "content": "question 3"}],
        chosen="bad answer 3",
        rejected="good answer 3",
    )
    test = [*pairs("src", 40, 50), leaked]
    target = [*pairs("tgt", 50, 60), *pairs("tgt", 45, 47), *pairs("tgt", 45, 46)]  # 45, 46 are in id_test
    built = build_splits(train, test, {"tgt": target}, data_config(), 0)
    assert len(built.splits["id_test"]) == 10 and built.removed["id_test"] == {"overlap": 1, "duplicate": 0}
    assert len(built.splits["ood/tgt"]) == 10 and built.removed["ood/tgt"] == {"overlap": 3, "duplicate": 0}
    assert_disjoint(built.splits)


def test_overlap_is_caught():
    shared = pairs("src", 0, 3)
    with pytest.raises(SplitError, match="in a and b"):
        assert_disjoint({"a": shared, "b": shared[:1]})
    with pytest.raises(SplitError, match="split a twice"):
        assert_disjoint({"a": [*shared, shared[0]]})
    swapped = make_pair(
        dataset="other",
        category="helpful",
        prompt=shared[0].prompt,
        chosen=shared[0].rejected,
        rejected=shared[0].chosen,
    )
    with pytest.raises(SplitError, match=r"content .* in a and b"):
        assert_disjoint({"a": shared, "b": [swapped]})


def test_empty_splits_name_the_split_and_the_cause():
    with pytest.raises(
        SplitError, match=r"split teacher_train is empty: data\.teacher_fraction=0\.5 of 1 train"
    ):
        build_splits(pairs("src", 0, 1), pairs("src", 1, 3), {"tgt": pairs("tgt", 5, 8)}, data_config(), 0)
    with pytest.raises(SplitError, match=r"split ood/tgt is empty: all 2 test pairs of tgt repeat"):
        build_splits(pairs("src", 0, 10), pairs("src", 10, 12), {"tgt": pairs("tgt", 0, 2)}, data_config(), 0)
    with pytest.raises(SplitError, match=r"split id_test is empty: no pairs in the test split of src"):
        build_splits(pairs("src", 0, 10), [], {"tgt": pairs("tgt", 20, 22)}, data_config(), 0)


@pytest.fixture
def small_params(make_params):
    def build(**data):
        return make_params(
            seed=data.pop("seed", 0),
            synthetic={"train_pairs": 60, "test_pairs": 20, "groups": 5},
            data={
                "caps": {"teacher_train": 25, "student_train": 25, "id_test": 15, "ood": 12, "groups": 4},
                **data,
            },
        )

    return build


def test_prepare_and_split_on_the_synthetic_suite(small_params, tmp_layout):
    params = small_params()
    prepare.run(params, tmp_layout)
    skips = json.loads(tmp_layout.skips("syn_help_forum").read_text())
    assert set(skips) == {"train", "test"} and skips["train"]["kept"] == 60
    assert set(json.loads(tmp_layout.skips("syn_help_chat").read_text())) == {"test"}
    assert not tmp_layout.pairs("syn_help_chat", "train").exists()
    split.run(params, tmp_layout)
    manifest = load_manifest(tmp_layout)
    entries = split_entries(tmp_layout, params.data.targets)
    counts = {name: entry["count"] for name, entry in entries.items()}
    assert counts == {
        "teacher_train": 25,
        "student_train": 25,
        "id_test": 15,
        "ood/syn_help_instruct": 12,
        "ood/syn_help_chat": 12,
        "groups/syn_help_forum": 4,
        "groups/syn_help_instruct": 4,
        "groups/syn_help_chat": 4,
    }
    for name, entry in entries.items():
        path = tmp_layout.root / entry["path"]
        assert file_sha256(path) == entry["sha256"], name
        assert entry["version"] == split_version(entry["sha256"]) == current_version(tmp_layout, name)
    assert set(manifest["splits"]) == {"teacher_train", "student_train", "id_test", "groups/syn_help_forum"}
    assert len(read_pairs(tmp_layout.split("syn_help_chat"))) == 12
    assert len(read_groups(tmp_layout.split_groups("syn_help_forum", "syn_help_forum"))) == 4
    assert manifest["params"]["teacher_fraction"] == 0.5
    everything = {
        name: read_pairs(tmp_layout.root / e["path"]) for name, e in entries.items() if "groups" not in name
    }
    assert_disjoint(everything)
    assert len({pair_content_hash(p) for ps in everything.values() for p in ps}) == 25 + 25 + 15 + 12 + 12


def test_split_is_reproducible_and_seeded(small_params, tmp_path):
    from prefshift.core.paths import Layout

    runs = {}
    for name, seed in (("a", 0), ("b", 0), ("c", 1)):
        layout = Layout(tmp_path / name, seed=0)
        params = small_params(seed=seed)
        prepare.run(params, layout)
        split.run(params, layout)
        runs[name] = (layout, load_manifest(layout))
    (layout_a, first), (layout_b, second), (layout_c, third) = runs["a"], runs["b"], runs["c"]
    assert first["splits"] == second["splits"] and first["version"] == second["version"]
    assert layout_a.split("teacher_train").read_bytes() == layout_b.split("teacher_train").read_bytes()
    assert third["version"] != first["version"]
    ids_a = [p.pair_id for p in read_pairs(layout_a.split("teacher_train"))]
    ids_c = [p.pair_id for p in read_pairs(layout_c.split("teacher_train"))]
    assert ids_a != ids_c
    check_version(layout_a, first["version"], "test")
    with pytest.raises(SplitError, match="split version"):
        check_version(layout_a, third["version"], "weak labels")


def test_split_without_prepare_says_what_to_run(small_params, tmp_layout):
    with pytest.raises(SplitError, match="run `prefshift prepare --dataset syn_help_forum`"):
        split.run(small_params(), tmp_layout)
    with pytest.raises(SplitError, match="run `prefshift split`"):
        load_manifest(tmp_layout)


def test_prepare_on_real_format_fixtures(make_params, fixtures_dir, tmp_layout):
    params = make_params(
        data={
            "source": "hh_helpful",
            "targets": ["helpsteer3", "ultrafeedback_full"],
            "sources": {
                "hh_helpful": {"path": str(fixtures_dir / "hh_rlhf/helpful-base")},
                "helpsteer3": {"path": str(fixtures_dir / "helpsteer3")},
                "ultrafeedback_full": {"path": str(fixtures_dir / "ultrafeedback_full")},
            },
        }
    )
    prepare.run(params, tmp_layout)
    skips = json.loads(tmp_layout.skips("hh_helpful").read_text())
    assert skips["train"]["skipped"] == {
        "bad_transcript": 1,
        "duplicate": 1,
        "empty_response": 1,
        "identical_responses": 1,
        "prompt_mismatch": 1,
    }
    assert json.loads(tmp_layout.skips("helpsteer3").read_text())["test"]["skipped"] == {"tie": 1}
    assert len(read_groups(tmp_layout.pair_groups("ultrafeedback_full"))) == 1
    assert not tmp_layout.pair_groups("helpsteer3").exists()
    split.run(params, tmp_layout)
    counts = {name: e["count"] for name, e in split_entries(tmp_layout, params.data.targets).items()}
    assert counts == {
        "teacher_train": 1,
        "student_train": 1,
        "id_test": 2,
        "ood/helpsteer3": 2,
        "ood/ultrafeedback_full": 1,
        "groups/ultrafeedback_full": 1,
    }


def test_prepare_refuses_a_source_of_the_other_category(make_params, tmp_layout):
    params = make_params(
        data={"category": "helpful", "source": "syn_harm_forum", "targets": ["syn_harm_chat"]}
    )
    with pytest.raises(ConfigError, match="harmless dataset"):
        prepare.run(params, tmp_layout)


def test_annotator_noise_reverses_exactly_the_picked_judgements():
    import pandas as pd

    from prefshift.pipeline.heldout_scores import with_annotator_noise

    ids = [p.pair_id for p in pairs("src", 0, 40)]
    frame = pd.DataFrame(
        {
            "pair_id": ids,
            "delta": [1.0 + i for i in range(40)],
            "reward_chosen": [2.0 + i for i in range(40)],
            "reward_rejected": [1.0] * 40,
        }
    )
    assert with_annotator_noise(frame, 0.0, seed=3) is frame
    noisy = with_annotator_noise(frame, 0.25, seed=3)
    flipped = noisy["delta"] < 0
    assert set(noisy.loc[flipped, "pair_id"]) == noisy_pairs(ids, 0.25, seed=3) and flipped.sum() == 10
    assert (noisy["delta"].abs() == frame["delta"]).all()  # the margins' size is the teacher's own
    assert (noisy["reward_chosen"] - noisy["reward_rejected"] == noisy["delta"]).all()
    assert sorted(noisy[["reward_chosen", "reward_rejected"]].to_numpy().ravel()) == sorted(
        frame[["reward_chosen", "reward_rejected"]].to_numpy().ravel()
    )


def test_a_target_split_depends_on_the_source_alone_never_on_another_target():
    data = data_config()
    source = build_splits(pairs("src", 0, 10), pairs("src", 10, 14), {}, data, 0).splits
    shared = pairs("both", 50, 54)  # the same content in two targets: each is its own benchmark
    alone = build_target_split("a", [*pairs("a", 20, 24), *shared], source, None, 0)
    together = build_splits(
        pairs("src", 0, 10), pairs("src", 10, 14), {"b": shared, "a": [*pairs("a", 20, 24), *shared]}, data, 0
    )
    assert together.splits["ood/a"] == alone.splits["ood/a"]  # b, listed first, took nothing from a
    assert together.removed["ood/a"] == {"overlap": 0, "duplicate": 0}
    copy = build_target_split("c", [*pairs("c", 30, 32), *pairs("src", 10, 11)], source, None, 0)
    assert copy.removed["ood/c"] == {"overlap": 1, "duplicate": 0}  # id_test's content still blocked


def _project(small_params, root, targets):
    from prefshift.core.paths import Layout

    layout = Layout(root, seed=0)
    params = small_params().model_copy(deep=True)
    params.data.targets = list(targets)
    prepare.run(params, layout)
    split.run(params, layout)
    return params, layout


def test_adding_a_target_splits_it_alone_and_keeps_every_other_splits_bytes(small_params, tmp_path):
    params, layout = _project(small_params, tmp_path, ["syn_help_instruct"])
    before = {p: p.read_bytes() for p in (tmp_path / "data").rglob("*") if p.is_file()}
    versions = {
        name: current_version(layout, name) for name in ("id_test", "student_train", "syn_help_instruct")
    }
    params.data.targets = ["syn_help_instruct", "syn_help_chat"]
    prepare.run(params, layout, "syn_help_chat")
    split.run(params, layout, "syn_help_chat")
    after = {p: p.read_bytes() for p in (tmp_path / "data").rglob("*") if p.is_file()}
    assert {p: b for p, b in after.items() if p in before} == before  # nothing else rewritten
    new = {p.relative_to(tmp_path).as_posix() for p in set(after) - set(before)}
    assert {p.split("/")[2] for p in new} <= {"syn_help_chat", "ood"}
    assert layout.split("syn_help_chat").exists()
    for name, version in versions.items():  # a model of the first project still checks out
        check_split_version(layout, name, version, "a model trained before")
    with pytest.raises(SplitError, match=r"version .* of split 'id_test'"):
        check_split_version(layout, "id_test", "0" * 16, "a model of other splits")


def test_a_one_dataset_run_names_what_it_accepts(small_params, tmp_layout):
    with pytest.raises(ConfigError, match=r"--dataset nope: neither data\.source"):
        prepare.run(small_params(), tmp_layout, "nope")
    with pytest.raises(ConfigError, match=r"--dataset nope: neither data\.source"):
        split.run(small_params(), tmp_layout, "nope")
