"""Bad input gives a readable error that names the file, row or key, or a counted skip (issue 8, item 3).

Never a bare traceback, never silent success. The CLI cases run the real commands
(typer's runner, in-process) and check the exit code 2, the message on stderr and
the absence of a traceback; the rest call the stage or library function that meets
the input first and check the exception type and its text.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from typer.testing import CliRunner

from prefshift.cli import app
from prefshift.config.params import (
    AnchorConfig,
    ConfigError,
    EncodeConfig,
    LMSpec,
    Params,
    TrainConfig,
    load_params,
)
from prefshift.core.errors import PrefshiftError
from prefshift.core.paths import Layout
from prefshift.data.adapters import get_adapter
from prefshift.data.encode import Encoder
from prefshift.data.schema import SchemaError, SkipCounter, make_pair
from prefshift.data.splits import SplitError, assert_disjoint, build_splits
from prefshift.engine.train import TrainingError, train_reward_model
from prefshift.methods import build_objective
from prefshift.methods.layers import AnchorError, anchor_layers
from prefshift.models.reward import ModelLoadError, load_reward_model
from prefshift.pipeline.stages import prepare
from prefshift.pipeline.stages.label import StaleLabelsError, read_labels
from tiny_models import base_dir, items, pairs, reward_model, tokenizer

GOOD = {"prompt": "how do I open the door?", "chosen": "turn the handle, then push", "rejected": "no idea"}


def _row(**changes) -> dict:
    return {**GOOD, **changes}


def _jsonl(path: Path, rows: list) -> Path:
    """Rows as JSONL; a str row is written verbatim (a malformed line), a bytes row as raw bytes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [
        r if isinstance(r, bytes) else (r if isinstance(r, str) else json.dumps(r)).encode() for r in rows
    ]
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def _local_params(root: Path, train_rows: list, test_rows: list | None = None, **extra) -> dict:
    """Raw params with one local source (train + test files) and one local target."""
    source, target = root / "raw" / "mine", root / "raw" / "theirs.jsonl"
    _jsonl(source / "train.jsonl", train_rows)
    _jsonl(source / "test.jsonl", test_rows or [_row(chosen=f"answer {i}") for i in range(4)])
    _jsonl(target, [_row(prompt=f"q{i}", chosen=f"reply {i}") for i in range(4)])
    raw = {
        "data": {
            "source": "mine",
            "targets": ["theirs"],
            "sources": {
                "mine": {"adapter": "local", "path": str(source), "category": "helpful"},
                "theirs": {"adapter": "local", "path": str(target), "category": "helpful"},
            },
        }
    }
    for section, values in extra.items():
        raw[section] = values
    return raw


def _params_file(root: Path, raw: dict) -> Path:
    path = root / "params.yaml"
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    return path


def _cli_error(*args: str) -> str:
    """Run a command that must fail cleanly; return its stderr."""
    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    assert "Traceback" not in result.stderr and "Traceback" not in result.output
    assert "error: " in result.stderr
    return result.stderr


def _prepare_error(root: Path, raw: dict) -> str:
    return _cli_error("prepare", "--params", str(_params_file(root, raw)), "--root", str(root))


# --- through the CLI -------------------------------------------------------------------------


def test_cli_malformed_jsonl_line_names_file_and_line(tmp_path):
    message = _prepare_error(tmp_path, _local_params(tmp_path, [GOOD, '{"prompt": "x", "chosen": ']))
    assert "mine/train.jsonl line 2: not valid JSON" in message


def test_cli_errors_print_paths_and_brackets_verbatim(tmp_path):
    """A message is printed as written: a path with brackets in it is not read as markup (dropped, or
    a MarkupError traceback for `[/...]`), and a path longer than the terminal is not broken mid-word."""
    root = tmp_path / "[/runs] [naive, seam]" / ("a-directory-name-longer-than-a-terminal-line-" * 3)
    root.mkdir(parents=True)
    message = _prepare_error(root, _local_params(root, [GOOD, '{"prompt": "x", "chosen": ']))
    assert f"{root / 'raw' / 'mine' / 'train.jsonl'} line 2: not valid JSON" in message


def test_cli_invalid_utf8_names_file_and_line(tmp_path):
    bad = b'{"prompt": "hi", "chosen": "caf\xe9", "rejected": "no"}'
    message = _prepare_error(tmp_path, _local_params(tmp_path, [GOOD, GOOD, bad]))
    assert "mine/train.jsonl line 3: not valid UTF-8" in message


def test_cli_missing_key_names_line_and_column(tmp_path):
    message = _prepare_error(tmp_path, _local_params(tmp_path, [GOOD, {"prompt": "p", "chosen": "c"}]))
    assert "mine/train.jsonl line 2: missing column(s) ['rejected']" in message


def test_cli_file_of_neither_format_is_named(tmp_path):
    message = _prepare_error(tmp_path, _local_params(tmp_path, [{"question": "q", "answer": "a"}]))
    assert "mine/train.jsonl line 1: neither the pair schema" in message and "'answer'" in message


def test_cli_all_rows_skipped_reports_the_counts(tmp_path):
    message = _prepare_error(tmp_path, _local_params(tmp_path, [_row(rejected=GOOD["chosen"])] * 3))
    assert "mine train: no usable pairs in" in message and "mine/train.jsonl" in message
    assert "skipped {'identical_responses': 3}" in message


def test_cli_unknown_dataset(tmp_path):
    message = _prepare_error(tmp_path, {"data": {"source": "no_such_set", "targets": ["syn_help_chat"]}})
    assert "unknown dataset 'no_such_set'; valid names:" in message and "syn_help_forum" in message


def test_cli_unknown_method(tmp_path):
    message = _cli_error("train", "--method", "anchr_last", "--root", str(tmp_path))
    assert "unknown method 'anchr_last'; valid methods: naive, confidence" in message


def test_cli_negative_lambda_names_the_key(tmp_path):
    path = _params_file(tmp_path, {})
    message = _cli_error("train", "-m", "anchor_last", "-p", str(path), "-S", "anchor.lambda=-0.5")
    assert "anchor.lambda: Input should be greater than or equal to 0 (got -0.5)" in message


def test_cli_misspelled_params_key(tmp_path):
    path = _params_file(tmp_path, {"student": {"bach_size": 4}})
    message = _cli_error("split", "-p", str(path), "--root", str(tmp_path))
    assert f"{path}: invalid params" in message
    assert "student.bach_size: unknown key (check its spelling" in message


def test_cli_unknown_section_in_override(tmp_path):
    message = _cli_error("split", "-p", str(_params_file(tmp_path, {})), "-S", "studnet.epochs=3")
    assert "studnet: unknown key" in message


def test_cli_wrong_typed_params_value(tmp_path):
    path = _params_file(tmp_path, {"student": {"epochs": "many"}})
    message = _cli_error("split", "-p", str(path), "--root", str(tmp_path))
    assert "student.epochs: Input should be a valid integer" in message and "(got 'many')" in message


def test_cli_non_existent_model_path(tmp_path):
    missing = {"name_or_path": str(tmp_path / "nowhere")}
    path = _params_file(tmp_path, {"backbone": {"weak": missing, "strong": missing}})
    message = _cli_error("backbone", "-p", str(path), "--root", str(tmp_path))
    assert f"backbone directory {tmp_path / 'nowhere'} does not exist" in message


def test_cli_truncated_safetensors_model(tmp_path):
    model = tmp_path / "model"
    shutil.copytree(base_dir(tmp_path), model)
    weights = model / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    _jsonl(tmp_path / "rows.jsonl", [GOOD])
    message = _cli_error(
        "score", "--model", str(model), "-i", str(tmp_path / "rows.jsonl"), "--root", str(tmp_path)
    )
    assert f"cannot load model {model}: its safetensors weights are corrupt or truncated" in message


# --- rows that are valid JSON but unusable: skipped and counted, with their line ------------


@pytest.mark.parametrize(
    ("row", "reason", "text"),
    [
        (_row(chosen=7), "bad_type", "field 'chosen' must be a string, got int"),
        (_row(rejected="   "), "empty_response", "field 'rejected' is empty"),
        (_row(rejected=GOOD["chosen"] + " "), "identical_responses", "'chosen' and 'rejected' are identical"),
        (_row(gold=0.5), "bad_gold", "field 'gold' must be a number in (0.5, 1], got 0.5"),
        (_row(prompt=[{"role": "user", "content": ""}]), "empty_prompt", "prompt has no non-empty user"),
        (_row(prompt=[{"role": "robot", "content": "hi"}]), "bad_prompt", "prompt[0].role 'robot'"),
    ],
    ids=["wrong_type", "empty_string", "identical", "tie", "empty_prompt", "unknown_role"],
)
def test_unusable_rows_are_skipped_counted_and_located(tmp_path, row, reason, text):
    raw = _local_params(tmp_path, [GOOD, row, _row(chosen="push it")])
    params = load_params(_params_file(tmp_path, raw))
    counter = SkipCounter()
    kept = get_adapter("mine", params).load_pairs("train", params, counter)
    assert len(kept) == 2
    counts = counter.as_dict()
    assert counts["skipped"] == {reason: 1} and counts["kept"] == 2
    assert (
        counts["examples"][reason][0].startswith("mine ")
        and "train.jsonl line 2: " + text in (counts["examples"][reason][0])
    )


def test_prepare_writes_the_skip_counts_next_to_the_pairs(tmp_path):
    rows = [GOOD, _row(gold=0.5), _row(rejected=""), _row(chosen="x", rejected="x"), GOOD]
    prepare.run(load_params(_params_file(tmp_path, _local_params(tmp_path, rows))), Layout(tmp_path, seed=0))
    skips = json.loads(Layout(tmp_path, seed=0).skips("mine").read_text())["train"]
    assert skips["kept"] == 1 and skips["skipped_total"] == 4
    assert skips["skipped"] == {"bad_gold": 1, "duplicate": 1, "empty_response": 1, "identical_responses": 1}


# --- lengths -----------------------------------------------------------------------------------


def _long_pair(prompt_words: int, response_words: int):
    return make_pair(
        dataset="toy",
        category="helpful",
        prompt=[{"role": "user", "content": " ".join(["door"] * prompt_words)}],
        chosen=" ".join(["gently"] * response_words),
        rejected="no",
    )


def test_rows_longer_than_max_length_are_truncated_to_it():
    encoded = Encoder(tokenizer(), EncodeConfig(max_length=32)).encode_pairs([_long_pair(5, 200)])
    assert len(encoded) == 1
    chosen = encoded[0].chosen
    assert len(chosen.input_ids) == 32 and sum(chosen.response_mask) < chosen.response_tokens


def test_a_prompt_too_long_is_cut_from_the_left_and_the_response_survives():
    encoder = Encoder(tokenizer(), EncodeConfig(max_length=32))
    [encoded] = encoder.encode_pairs([_long_pair(500, 3)])
    assert len(encoded.chosen.input_ids) == 32
    assert sum(encoded.chosen.response_mask) == encoded.chosen.response_tokens


def test_a_response_that_cannot_keep_enough_tokens_is_a_counted_skip():
    encoder = Encoder(tokenizer(), EncodeConfig(max_length=16, min_response_tokens=20))
    skips = SkipCounter()
    assert encoder.encode_pairs([_long_pair(500, 40), *pairs(2)], skips=skips) == []
    counts = skips.as_dict()
    assert counts["skipped"] == {"response_truncated": 3}
    assert "response keeps" in counts["examples"]["response_truncated"][0]
    assert (
        "encode.max_length=16 (< encode.min_response_tokens=20)"
        in counts["examples"]["response_truncated"][0]
    )


def test_nothing_left_to_train_on_is_an_error_not_an_empty_model():
    with pytest.raises(TrainingError, match="toy: no training pairs left after encoding"):
        train_reward_model(reward_model(), tokenizer(), [], build_objective("naive", Params(), 2),
                           TrainConfig(), seed=0, name="toy", progress=False)  # fmt: skip


# --- anchors and layers ------------------------------------------------------------------------


@pytest.mark.parametrize("fractions", [[0.0], [1.5], []])
def test_invalid_mid_fractions_name_the_key(fractions):
    with pytest.raises(ValueError, match=r"anchor\.mid_fractions needs fractions of depth in"):
        AnchorConfig(mid_fractions=fractions)


def test_anchor_layer_out_of_range_for_a_shallow_model():
    params = Params().model_copy(update={"anchor": AnchorConfig(mid_fractions=[0.25])})
    with pytest.raises(AnchorError, match=r"anchor layer 0 is out of range for a model with 1 layers"):
        build_objective("anchor_mid", params, num_layers=1)
    assert anchor_layers("mid", 4, [0.25]) == (1,)


# --- models and checkpoints ----------------------------------------------------------------------


def test_non_existent_model_directory():
    with pytest.raises(ModelLoadError, match="model directory /no/such/model does not exist"):
        load_reward_model("/no/such/model")


def test_corrupted_resume_checkpoint_is_named(tmp_path):
    cfg = TrainConfig(batch_size=4, epochs=1, checkpoint_every=1)
    data = items(8)

    objective = build_objective("naive", Params(), 2)

    def run():
        model = reward_model()
        kwargs = {"seed": 0, "name": "toy", "checkpoint_dir": tmp_path / "ckpt", "progress": False}
        return train_reward_model(model, tokenizer(), data, objective, cfg, **kwargs)

    run()
    weights = tmp_path / "ckpt" / "last" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.raises(TrainingError, match=r"checkpoint .*ckpt/last is unreadable .*delete .*ckpt to train"):
        run()


# --- splits and labels -----------------------------------------------------------------------------


def _pairs_of(dataset: str, n: int, offset: int = 0):
    return [
        make_pair(
            dataset=dataset,
            category="helpful",
            prompt=[{"role": "user", "content": f"q{i}"}],
            chosen=f"good answer {i}",
            rejected=f"bad answer {i}",
        )
        for i in range(offset, offset + n)
    ]


def test_an_ood_split_empty_after_overlap_filtering(tmp_path):
    data = Params().data.model_copy(update={"source": "toy", "targets": ["copy"]})
    train = _pairs_of("toy", 10)
    copy = [
        make_pair(dataset="copy", category="helpful", prompt=p.prompt, chosen=p.chosen, rejected=p.rejected)
        for p in train[:3]
    ]
    with pytest.raises(SplitError, match="split ood/copy is empty: all 3 test pairs of copy repeat content"):
        build_splits(train, _pairs_of("toy", 4, offset=50), {"copy": copy}, data, seed=0)


def test_a_teacher_fraction_that_leaves_a_split_empty(tmp_path):
    data = Params().data.model_copy(update={"source": "toy", "targets": [], "teacher_fraction": 0.9})
    with pytest.raises(SplitError, match=r"split student_train is empty: data.teacher_fraction=0.9 of 2"):
        build_splits(_pairs_of("toy", 2), _pairs_of("toy", 2, offset=9), {}, data, seed=0)


def test_overlapping_splits_supplied_by_hand_are_refused():
    shared = _pairs_of("toy", 3)
    with pytest.raises(
        SplitError, match=f"pair_id {shared[1].pair_id} is in teacher_train and student_train"
    ):
        assert_disjoint({"teacher_train": shared[:2], "student_train": shared[1:]})


def test_overlap_between_source_and_target_is_removed_and_counted(tmp_path):
    train = [_row(prompt=f"p{i}", chosen=f"c{i}") for i in range(10)]
    raw = _local_params(tmp_path, train)
    _jsonl(
        Path(raw["data"]["sources"]["theirs"]["path"]), [train[0], *[_row(prompt=f"t{i}") for i in range(3)]]
    )
    from prefshift.pipeline.stages import split

    params, layout = load_params(_params_file(tmp_path, raw)), Layout(tmp_path, seed=0)
    prepare.run(params, layout)
    split.run(params, layout)
    manifest = json.loads(layout.target_manifest("theirs").read_text())
    assert (
        manifest["removed"]["ood/theirs"]["overlap"] == 1 and manifest["splits"]["ood/theirs"]["count"] == 3
    )


def _labels(path: Path, version: bytes | None) -> Path:
    table = pa.table({"pair_id": ["a"], "q": [0.7]})
    if version is not None:
        table = table.replace_schema_metadata({b"split_version": version})
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)
    return path


def test_weak_labels_from_another_split_version_are_refused(tmp_path):
    layout = Layout(tmp_path, seed=0)
    layout.split_manifest.parent.mkdir(parents=True)
    layout.split_manifest.write_text(json.dumps({"version": "v2"}))
    path = _labels(layout.weak_labels, b"v1")
    with pytest.raises(SplitError, match=rf"{path} was built from split version v1 of .*, now version v2"):
        read_labels(path, layout)
    with pytest.raises(StaleLabelsError, match="carries no split_version metadata"):
        read_labels(_labels(layout.weak_labels, None), layout)


def test_params_file_missing_or_not_yaml(tmp_path):
    with pytest.raises(ConfigError, match="params file not found"):
        load_params(tmp_path / "absent.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("student: [unclosed\n")
    with pytest.raises(ConfigError, match=f"{bad}: not valid YAML"):
        load_params(bad)


def test_a_lm_spec_whose_heads_do_not_divide_the_width():
    with pytest.raises(ValueError, match="hidden_size 30 is not divisible by num_heads 4"):
        LMSpec(hidden_size=30, num_heads=4)


def test_every_error_above_is_a_prefshift_error():
    for error in (
        ConfigError,
        SchemaError,
        SplitError,
        StaleLabelsError,
        ModelLoadError,
        AnchorError,
        TrainingError,
    ):
        assert issubclass(error, PrefshiftError)


# --- safe loading (issue 8, item 7): no pickles, no remote code unless params say so ----------------


def test_every_torch_load_in_the_package_is_weights_only():
    import re

    package = Path(__file__).resolve().parents[1] / "src" / "prefshift"
    calls = [
        (path.name, call)
        for path in package.rglob("*.py")
        for call in re.findall(r"torch\.load\([^)]*\)", path.read_text(encoding="utf-8"))
    ]
    assert calls, "the anchor cache's spill files are read with torch.load"
    assert [c for c in calls if "weights_only=True" not in c[1]] == []


def test_remote_code_is_off_by_default_and_tagged_when_on(tmp_path):
    from prefshift.tracking import runs as tracking

    assert Params().backbone.trust_remote_code is False
    on = Params.model_validate({"backbone": {"trust_remote_code": True}})
    for params, tag in ((on, "true"), (Params(), "false")):
        assert (
            tracking.run_tags(params, Layout(tmp_path, seed=0), "teacher", None, "p1")["trust_remote_code"]
            == tag
        )
