"""Half-updated outputs, broken files and broken model directories (issue 14, classes 2, 3 and 5).

Class 2: a stage that fails, is interrupted or is handed a mixed input set never lets the
next stage read old and new files as one run (output sets with manifests). Class 3: files
and model directories that cannot be read give a message naming them, never a traceback
or a bare "Aborted.". Class 5: messages say which file, row or kind of path is at fault.
Everything runs the real commands (typer's runner) or the real stages.
"""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path
from unittest.mock import ANY

import pandas as pd
import pytest

from prefshift.config.params import Params
from prefshift.core.paths import Layout
from prefshift.core.scratch import Scratch
from prefshift.data.adapters import get_adapter
from prefshift.data.schema import SchemaError, SkipCounter
from prefshift.models.reward import ModelLoadError, load_reward_model, save_reward_model
from prefshift.pipeline.output_set import OutputSetError, manifest_of, output_set, verify
from test_bad_inputs import GOOD, _cli_error, _jsonl, _local_params, _params_file, _prepare_error, _row
from tiny_models import base_dir, install_backbones, reward_model, tokenizer


def _prepare(root: Path, raw: dict) -> None:
    from typer.testing import CliRunner

    from prefshift.cli import app

    result = CliRunner().invoke(app, ["prepare", "-p", str(_params_file(root, raw)), "--root", str(root)])
    assert result.exit_code == 0, result.output


def _tree(directory: Path) -> dict[str, bytes]:
    return {p.relative_to(directory).as_posix(): p.read_bytes() for p in directory.rglob("*") if p.is_file()}


def _rows(prefix: str, n: int = 4) -> list[dict]:
    return [_row(prompt=f"{prefix} question {i}", chosen=f"{prefix} answer {i}") for i in range(n)]


# --- class 2: output sets ------------------------------------------------------------------------


def test_a_prepare_failing_on_one_dataset_replaces_no_dataset(tmp_path):
    raw = _local_params(tmp_path, _rows("first"))
    _prepare(tmp_path, raw)
    pairs = Layout(tmp_path, seed=0).pairs_dir
    before = _tree(pairs)
    _jsonl(tmp_path / "raw" / "mine" / "train.jsonl", _rows("second"))  # the source changes and is fine
    _jsonl(tmp_path / "raw" / "theirs.jsonl", [GOOD, '{"prompt": '])  # the target breaks on line 2
    message = _prepare_error(tmp_path, raw)
    assert "theirs.jsonl line 2: not valid JSON" in message
    assert _tree(pairs) == before  # the source's new pairs were staged, never swapped in
    for dataset in ("mine", "theirs"):  # each dataset's directory is still the set one run wrote
        directory = pairs / dataset
        verify(tmp_path, manifest_of(directory), [directory], "prefshift prepare")
    assert not [p for p in tmp_path.rglob("*.tmp")]


def test_split_refuses_pairs_that_one_prepare_run_did_not_write(tmp_path):
    layout = Layout(tmp_path, seed=0)
    other = tmp_path / "other"
    other.mkdir()
    raw = _local_params(tmp_path, _rows("first"))
    _prepare(other, raw)  # a second run of the same prepare, on other data
    _jsonl(tmp_path / "raw" / "mine" / "train.jsonl", _rows("second"))
    _prepare(tmp_path, raw)
    shutil.copy(
        Layout(other, seed=0).pairs("mine", "train"), layout.pairs("mine", "train")
    )  # old file, new set
    params = str(_params_file(tmp_path, raw))
    message = _cli_error("split", "-p", params, "--root", str(tmp_path))
    assert f"{layout.pairs('mine', 'train')} differs from the file it recorded" in message
    assert "run `prefshift prepare --dataset mine` again" in message
    _prepare(tmp_path, raw)  # what the message says to do: a consistent set again
    layout.pairs("theirs", "test").unlink()
    message = _cli_error("split", "-p", params, "--root", str(tmp_path))
    assert f"{layout.pairs('theirs', 'test')} is missing" in message


def test_teacher_and_train_refuse_a_weak_and_strong_from_different_backbone_runs(tmp_path):
    layout = Layout(tmp_path, seed=0)
    install_backbones(layout, base_dir(tmp_path, seed=1), base_dir(tmp_path, seed=2))
    params = str(_params_file(tmp_path, {"seed": 0}))
    shutil.rmtree(layout.base_model("weak"))
    shutil.copytree(base_dir(tmp_path, seed=3), layout.base_model("weak"))  # a new weak beside the old strong
    message = _cli_error("teacher", "-p", params, "--root", str(tmp_path))
    assert "models/base/weak/" in message and "run `prefshift backbone` again" in message
    (layout.base_model("strong") / "config.json").write_text("{}")
    message = _cli_error("train", "-m", "naive", "-p", params, "--root", str(tmp_path))
    assert f"{layout.base_model('strong') / 'config.json'} differs from the file it recorded" in message


def test_evaluate_refuses_teacher_scores_that_one_teacher_run_did_not_write(tmp_path):
    from prefshift.pipeline.heldout_scores import write_scores
    from prefshift.pipeline.stages import evaluate
    from test_report import TARGETS, _params, _splits

    layout = Layout(tmp_path, seed=0)
    _splits(layout, {"id_test": 2, **{t: 2 for t in TARGETS}})
    frame = pd.DataFrame(
        {"pair_id": ["p1"], "delta": [1.0], "gold": [1.0], "len_chosen": [3], "len_rejected": [4]}
    )
    with output_set(tmp_path, "prefshift teacher", directories=[layout.scores_dir("teacher")]) as out:
        write_scores(out.path(layout.scores("teacher", "id_test")), frame, "v1")
    for target in TARGETS:  # each target's scores: one `score-target` run's set
        command = f"prefshift score-target --model teacher --target {target}"
        with output_set(tmp_path, command, directories=[layout.target_scores_dir("teacher", target)]) as out:
            write_scores(out.path(layout.scores("teacher", target)), frame, "v1")
    write_scores(layout.scores("teacher", TARGETS[1]), frame.assign(delta=[2.0]), "v1")  # another run's
    with pytest.raises(OutputSetError, match=f"{layout.scores('teacher', TARGETS[1])} differs from the file"):
        evaluate.run(_params(), layout, "naive")


def test_a_models_base_assembled_by_hand_is_refused(tmp_path):
    layout = Layout(tmp_path, seed=0)
    for which in ("weak", "strong"):
        shutil.copytree(base_dir(tmp_path), layout.base_model(which))
    message = _cli_error("teacher", "-p", str(_params_file(tmp_path, {"seed": 0})), "--root", str(tmp_path))
    assert f"{manifest_of(layout.base_dir)} not found" in message and "prefshift backbone" in message


def _write_set(root: Path, targets: list[Path], text: str) -> None:
    with output_set(root, "prefshift toy", directories=targets) as out:
        for target in targets:
            out.path(target / "data.txt").write_text(text)


def test_an_interrupted_commit_is_finished_by_the_next_reader(tmp_path, monkeypatch):
    """Ctrl-C between the renames of a commit: its journal makes the next reader complete it."""
    first, second = tmp_path / "a", tmp_path / "b"
    _write_set(tmp_path, [first, second], "old")
    done = []
    commit = Scratch.commit

    def interrupted_after_one(self: Scratch) -> None:
        if self.target in (first, second):  # not the manifests written inside them
            if done:
                raise KeyboardInterrupt
            done.append(self.target)
        commit(self)

    monkeypatch.setattr(Scratch, "commit", interrupted_after_one)
    with pytest.raises(KeyboardInterrupt):
        _write_set(tmp_path, [first, second], "new")
    monkeypatch.undo()
    assert (first / "data.txt").read_text() == "new" and (second / "data.txt").read_text() == "old"
    manifest = verify(tmp_path, manifest_of(second), [first, second], "prefshift toy")  # rolls forward
    assert (second / "data.txt").read_text() == "new" and manifest["command"] == "prefshift toy"
    assert manifest["files"] == {"a/data.txt": manifest["files"]["b/data.txt"], "b/data.txt": ANY}
    assert not list((tmp_path / ".prefshift" / "commits").iterdir())
    assert sorted(p.name for p in tmp_path.iterdir()) == [".prefshift", "a", "b"]


def test_a_failed_stage_leaves_the_previous_set_and_no_staged_copies(tmp_path):
    target = tmp_path / "out"
    with output_set(tmp_path, "prefshift toy", directories=[target]) as out:
        out.path(target / "x.txt").write_text("complete")
    with pytest.raises(OutputSetError), output_set(tmp_path, "prefshift toy", directories=[target]) as out:
        out.path(target / "x.txt").write_text("half")
        raise OutputSetError("the stage fails half-way")
    assert (target / "x.txt").read_text() == "complete"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".prefshift", "out"]
    with pytest.raises(OutputSetError, match="is not part of the set it recorded"):
        (target / "extra.txt").write_text("copied in")
        verify(tmp_path, manifest_of(target), [target], "prefshift toy")


# --- class 3: unreadable files and model directories ----------------------------------------------


def test_a_truncated_jsonl_gz_is_named_not_aborted(tmp_path):
    raw = _local_params(tmp_path, [GOOD])
    train = tmp_path / "raw" / "mine" / "train.jsonl.gz"
    (tmp_path / "raw" / "mine" / "train.jsonl").unlink()
    lines = "".join(json.dumps(_row(chosen=f"answer number {i}")) + "\n" for i in range(200))
    train.write_bytes(gzip.compress(lines.encode())[:-40])  # the end of the stream cut off
    message = _prepare_error(tmp_path, raw)
    assert f"{train}: the gzip stream is truncated or corrupt after line" in message
    assert "Aborted" not in message


def test_a_plain_file_named_gz_is_named(tmp_path):
    raw = _local_params(tmp_path, [GOOD])
    (tmp_path / "raw" / "mine" / "train.jsonl").rename(tmp_path / "raw" / "mine" / "train.jsonl.gz")
    message = _prepare_error(tmp_path, raw)
    assert "mine/train.jsonl.gz: named .gz but not gzip-compressed" in message
    plain = tmp_path / "rows.json.gz"
    plain.write_text(json.dumps([GOOD]))
    params = _params(raw, path=str(plain))
    with pytest.raises(SchemaError, match=f"{plain}: named .gz but not gzip-compressed"):
        list(get_adapter("mine", params).rows("test", params))


def _params(raw: dict, **mine) -> Params:
    data = json.loads(json.dumps(raw))
    data["data"]["sources"]["mine"].update(mine)
    return Params.model_validate(data)


@pytest.mark.parametrize(
    ("breakage", "message"),
    [
        (lambda d: [p.unlink() for p in d.iterdir()], "is empty"),
        (lambda d: (d / "config.json").write_text("{not json"), "has an unreadable config.json"),
        (lambda d: (d / "model.safetensors").unlink(), "has no weights"),
        (lambda d: [(d / n).unlink() for n in ("tokenizer.json", "tokenizer_config.json")], "has no tok"),
    ],
    ids=["empty", "corrupt_config", "no_weights", "no_tokenizer"],
)
def test_backbone_refuses_a_broken_local_model_directory(tmp_path, breakage, message):
    broken = tmp_path / "broken"
    shutil.copytree(base_dir(tmp_path), broken)
    breakage(broken)
    spec = {"name_or_path": str(broken)}
    path = _params_file(tmp_path, {"backbone": {"weak": spec, "strong": spec}})
    error = _cli_error("backbone", "-p", str(path), "--root", str(tmp_path))
    assert f"model directory {broken} {message}" in error
    assert not Layout(tmp_path, seed=0).base_dir.exists()


def test_a_broken_local_directory_is_not_reported_as_a_missing_hub_copy(tmp_path):
    broken = tmp_path / "models" / "base" / "weak"
    shutil.copytree(base_dir(tmp_path), broken)
    (broken / "tokenizer.json").unlink()
    (broken / "tokenizer_config.json").unlink()
    with pytest.raises(ModelLoadError, match=f"model directory {broken} has no tokenizer") as caught:
        load_reward_model(broken)
    assert "HF_HUB_OFFLINE" not in str(caught.value)


# --- class 5: which file, row or kind of path --------------------------------------------------


def _score_error(root: Path, model: str) -> str:
    rows = _jsonl(root / "rows.jsonl", [GOOD])
    params = str(_params_file(root, {"seed": 0}))
    return _cli_error("score", "--model", model, "-i", str(rows), "-p", params, "--root", str(root))


def test_a_relative_model_path_that_does_not_exist_is_called_a_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models").mkdir()
    for model in ("models/nope", "nope/"):
        message = _score_error(tmp_path, model)
        assert f"model directory {model} does not exist (a local path, not a hub id" in message
    message = _score_error(tmp_path, "someorg/no-such-model")  # no ./someorg: a hub id
    assert "cannot load hub model someorg/no-such-model" in message
    assert "no local directory of that name either" in message


def test_scoring_refuses_a_backbone_whose_head_was_never_trained(tmp_path):
    layout = Layout(tmp_path, seed=0)
    install_backbones(layout, base_dir(tmp_path), base_dir(tmp_path))
    message = _score_error(tmp_path, str(layout.base_model("strong")))
    assert f"{layout.base_model('strong')} has no trained reward head (LlamaForCausalLM" in message
    trained = tmp_path / "trained"
    save_reward_model(reward_model(), tokenizer(), trained)
    assert json.loads((trained / "config.json").read_text())["prefshift_trained_reward_head"] is True
    load_reward_model(trained, trained_head=True)


def test_an_empty_local_data_file_is_named(tmp_path):
    raw = _local_params(tmp_path, [GOOD])
    (tmp_path / "raw" / "mine" / "train.jsonl").write_text("")
    message = _prepare_error(tmp_path, raw)
    assert "mine train:" in message and "mine/train.jsonl holds no rows" in message


def test_a_row_in_the_other_local_format_is_named_with_the_row_that_set_it(tmp_path):
    hh = {"chosen": "\n\nHuman: hi\n\nAssistant: hello", "rejected": "\n\nHuman: hi\n\nAssistant: go"}
    raw = _local_params(tmp_path, [hh, hh, GOOD])
    message = _prepare_error(tmp_path, raw)
    assert "mine/train.jsonl line 3: a pair-schema row in a file of HH-transcript rows" in message
    assert "mine/train.jsonl line 1 is" in message
    params = _params(raw, path=str(_jsonl(tmp_path / "mixed.jsonl", [GOOD, hh])))
    with pytest.raises(SchemaError, match=r"mixed\.jsonl line 2: a HH-transcript row in a file of pair"):
        get_adapter("mine", params).load_pairs("test", params, SkipCounter())
