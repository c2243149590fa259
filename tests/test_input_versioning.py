"""Inputs are versioned (issue 30, item 2): every local file params name is something DVC sees.

`prefshift inputs` (an always-run stage) hashes the local data files, local model directories and
hub ids that params name into data/inputs/<consumer>.json; prepare, backbone, policy_samples and
gold_judge depend on their file. The first tests run the stage in-process on each kind of input;
the last one runs real DVC on the real dvc.yaml, in a temporary clone, up to `split`.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from e2e_project import REPO, environment, ran_stages, run
from prefshift.bench.pipeline import copy_project_sources
from prefshift.cli import app
from prefshift.core.paths import Layout
from prefshift.pipeline.stages import inputs
from prefshift.pipeline.stages.inputs import CONSUMERS, STAT_CACHE_NAME, dataset_inputs_file, inputs_file

MINE = {"adapter": "local", "path": "raw/mine_{split}.jsonl", "category": "helpful"}


def _rows(n: int, tag: str) -> str:
    return "".join(
        json.dumps({"prompt": f"Question {tag} {i}?", "chosen": f"Good answer {i}.", "rejected": f"bad {i}"})
        + "\n"
        for i in range(n)
    )


def _write_raw(root: Path) -> None:
    (root / "raw").mkdir(parents=True, exist_ok=True)
    (root / "raw" / "mine_train.jsonl").write_text(_rows(30, "train"), encoding="utf-8")
    (root / "raw" / "mine_test.jsonl").write_text(_rows(10, "test"), encoding="utf-8")


def _files(root: Path, consumer: str) -> list[Path]:
    """The consumer's files: prepare's are one per dataset (each dataset's prepare stage reads its own)."""
    if consumer == "prepare":
        return sorted((root / "data" / "inputs" / "prepare").glob("*.json"))
    return [inputs_file(Layout(root, seed=0), consumer)]


def _snapshot(root: Path) -> dict[str, bytes]:
    return {c: b"".join(path.read_bytes() for path in _files(root, c)) for c in CONSUMERS}


def _record(root: Path, consumer: str) -> dict:
    if consumer == "prepare":
        return {path.stem: json.loads(path.read_text(encoding="utf-8")) for path in _files(root, consumer)}
    return json.loads(inputs_file(Layout(root, seed=0), consumer).read_text(encoding="utf-8"))


@pytest.fixture
def project(tmp_path, monkeypatch, make_params):
    """A project whose params name a local `{split}` pattern, a local weak backbone directory and a
    hub policy; paths relative to the project, as DVC runs stages from its root."""
    root = tmp_path / "project"
    root.mkdir()
    monkeypatch.chdir(root)
    _write_raw(root)
    weak = root / "local-weak"
    weak.mkdir()
    (weak / "config.json").write_text('{"model_type": "llama"}\n', encoding="utf-8")
    (weak / "model.safetensors").write_bytes(b"\0" * 4096)
    (weak / ".cache").mkdir()
    (weak / ".cache" / "download.lock").write_text("hub bookkeeping", encoding="utf-8")
    params = make_params(
        methods=["naive"],
        data={"source": "mine", "targets": ["syn_help_chat"], "sources": {"mine": MINE}},
        backbone={"weak": {"name_or_path": "./local-weak"}},
        downstream={"policy": "org/policy", "policy_revision": "abc123"},
    )
    return root, params


def test_each_consumer_gets_its_inputs_with_content_hashes(project):
    root, params = project
    inputs.run(params, Layout(root, seed=0))
    prepare = _record(root, "prepare")
    assert set(prepare["mine"]["splits"]) == {"train", "test"}
    train = prepare["mine"]["splits"]["train"]
    assert train["path"] == "raw/mine_train.jsonl" and list(train["files"]) == ["mine_train.jsonl"]
    assert prepare["syn_help_chat"] == {"generated": "from params"}
    backbone = _record(root, "backbone")
    assert set(backbone) == {"weak"}  # strong is tiny: built from params
    assert backbone["weak"]["path"] == "./local-weak"
    assert set(backbone["weak"]["files"]) == {"config.json", "model.safetensors"}  # .cache is not the model
    assert _record(root, "policy") == {"policy": {"hub": "org/policy", "revision": "abc123"}}
    assert _record(root, "judge") == {"judge": {"model": None}}  # the trained judge: a pipeline output


def test_nothing_changed_gives_identical_bytes_and_one_row_changes_only_prepare(project):
    root, params = project
    layout = Layout(root, seed=0)
    inputs.run(params, layout)
    first = _snapshot(root)
    inputs.run(params, layout)
    assert _snapshot(root) == first

    with (root / "raw" / "mine_train.jsonl").open("a", encoding="utf-8") as handle:
        handle.write(_rows(1, "added"))
    inputs.run(params, layout)
    after_row = _snapshot(root)
    assert [c for c in CONSUMERS if after_row[c] != first[c]] == ["prepare"]

    (root / "local-weak" / "model.safetensors").write_bytes(b"\1" * 4096)
    inputs.run(params, layout)
    assert [c for c in CONSUMERS if _snapshot(root)[c] != after_row[c]] == ["backbone"]


def test_a_moved_project_records_the_same_bytes(project, monkeypatch):
    root, params = project
    inputs.run(params, Layout(root, seed=0))
    moved = root.parent / "moved"
    shutil.copytree(root, moved)
    shutil.rmtree(moved / "data")
    monkeypatch.chdir(moved)
    inputs.run(params, Layout(moved, seed=0))
    assert _snapshot(moved) == _snapshot(root)


def test_a_directory_source_versions_every_file_under_it(tmp_path, monkeypatch, make_params):
    monkeypatch.chdir(tmp_path)
    source = tmp_path / "prefs"
    (source / "nested").mkdir(parents=True)
    (source / "train.jsonl").write_text(_rows(3, "a"), encoding="utf-8")
    (source / "nested" / "test.jsonl").write_text(_rows(3, "b"), encoding="utf-8")
    (source / ".git").mkdir()
    (source / ".git" / "HEAD").write_text("ref: refs/heads/main\n", encoding="utf-8")
    sources = {"prefs": {**MINE, "path": "prefs"}}
    params = make_params(data={"source": "prefs", "targets": ["syn_help_chat"], "sources": sources})
    inputs.run(params, Layout(tmp_path, seed=0))
    first = _record(tmp_path, "prepare")["prefs"]
    assert set(first["files"]) == {"train.jsonl", "nested/test.jsonl"}
    (source / ".git" / "HEAD").write_text("ref: refs/heads/other\n", encoding="utf-8")
    inputs.run(params, Layout(tmp_path, seed=0))
    assert _record(tmp_path, "prepare")["prefs"] == first  # a clone's history is not data
    (source / "nested" / "extra.jsonl").write_text(_rows(1, "c"), encoding="utf-8")
    inputs.run(params, Layout(tmp_path, seed=0))
    assert set(_record(tmp_path, "prepare")["prefs"]["files"]) == {
        "train.jsonl",
        "nested/test.jsonl",
        "nested/extra.jsonl",
    }


def test_hub_sources_are_recorded_with_the_revision_asked_for(tmp_path, monkeypatch, make_params, capsys):
    monkeypatch.chdir(tmp_path)
    params = make_params(
        data={
            "source": "helpsteer3",
            "targets": ["hh_helpful"],
            "sources": {"helpsteer3": {"revision": "0123abc"}},
        }
    )
    inputs.run(params, Layout(tmp_path, seed=0))
    prepare = _record(tmp_path, "prepare")
    asked = {"hub": "nvidia/HelpSteer3", "config": "preference", "revision": "0123abc"}
    assert {k: v for k, v in prepare["helpsteer3"].items() if k != "params"} == asked
    assert prepare["helpsteer3"]["params"]["revision"] == "0123abc"  # its data.sources row, for its stage
    assert prepare["hh_helpful"]["hub"] == "Anthropic/hh-rlhf" and prepare["hh_helpful"]["revision"] is None
    captured = capsys.readouterr()
    said = " ".join((captured.err + captured.out).split())
    assert "without a pinned revision" in said and "Anthropic/hh-rlhf" in said


def test_a_missing_input_is_recorded_and_its_arrival_changes_the_record(project):
    root, params = project
    (root / "raw" / "mine_test.jsonl").unlink()
    inputs.run(params, Layout(root, seed=0))
    test_split = _record(root, "prepare")["mine"]["splits"]["test"]
    assert test_split == {"path": "raw/mine_test.jsonl", "missing": True}
    before = _snapshot(root)["prepare"]
    _write_raw(root)
    inputs.run(params, Layout(root, seed=0))
    assert _snapshot(root)["prepare"] != before


def test_a_fifo_named_as_data_is_recorded_not_read(project):
    root, params = project
    (root / "raw" / "mine_test.jsonl").unlink()
    os.mkfifo(root / "raw" / "mine_test.jsonl")  # opening it to hash would block forever
    inputs.run(params, Layout(root, seed=0))
    test_split = _record(root, "prepare")["mine"]["splits"]["test"]
    assert test_split == {"path": "raw/mine_test.jsonl", "not_a_file_or_directory": True}


def test_a_pattern_with_an_unknown_field_is_refused_naming_the_key(project):
    """Refused where params are read, before `inputs` (or any stage) opens a file: one line naming
    the key, through the CLI as exit 2."""
    root, params = project
    raw = params.resolved()
    raw["data"]["sources"]["mine"] = {**MINE, "path": "raw/{split}_{x}.jsonl"}
    (root / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")
    result = CliRunner().invoke(app, ["inputs", "-p", str(root / "params.yaml"), "--root", str(root)])
    assert result.exit_code == 2
    assert "data.sources.mine.path" in result.output and "{x}" in result.output
    assert not (root / "data" / "inputs").exists()


def test_the_stat_cache_reads_a_file_again_only_when_its_stat_changes(project):
    """Big inputs (a model's weights) are hashed once: an unchanged (size, mtime, inode) reuses the
    recorded MD5, as DVC's own state does. Shown by a same-size rewrite whose mtime is put back:
    the recorded hash stays; with a new mtime it is read again."""
    root, params = project
    (root / ".dvc").mkdir()
    inputs.run(params, Layout(root, seed=0))
    cache = json.loads((root / ".dvc" / "tmp" / STAT_CACHE_NAME).read_text(encoding="utf-8"))
    weights = root / "local-weak" / "model.safetensors"
    assert str(weights.resolve()) in cache
    before = _record(root, "backbone")
    stat = weights.stat()
    with weights.open("r+b") as handle:  # in place: same inode, same size
        handle.write(b"\7" * 4096)
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    inputs.run(params, Layout(root, seed=0))
    assert _record(root, "backbone") == before
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    inputs.run(params, Layout(root, seed=0))
    assert _record(root, "backbone") != before


def _dvc_status(root: Path, env: dict[str, str], *stages: str) -> dict:
    return json.loads(run(["dvc", "status", "--json", *stages], root, env).strip().splitlines()[-1])


def test_under_dvc_a_changed_row_reruns_prepare_and_what_follows_and_a_noop_only_inputs(tmp_path):
    """Real DVC on the project's dvc.yaml, in a temporary clone: the issue's case
    (data.sources.mine.path: raw/mine_{split}.jsonl, one row added)."""
    root = tmp_path / "project"
    root.mkdir()
    copy_project_sources(REPO, root)
    params = yaml.safe_load((root / "params.yaml").read_text(encoding="utf-8"))
    params["data"].update(source="mine", targets=["syn_help_chat"], sources={"mine": MINE})
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False), encoding="utf-8")
    _write_raw(root)
    env = environment(root)
    for args in (["git", "init", "-q"], ["git", "add", "-A"], ["git", "commit", "-qm", "project"]):
        run(args, root, env)

    assert ran_stages(run(["dvc", "repro", "split"], root, env)) == {"inputs", "prepare", "split"}
    assert ran_stages(run(["dvc", "repro", "split"], root, env)) == {"inputs"}
    assert _dvc_status(root, env, "prepare", "split") == {}
    chat_inputs = dataset_inputs_file(Layout(root, seed=0), "syn_help_chat").read_bytes()

    backbone_inputs = inputs_file(Layout(root, seed=0), "backbone").read_bytes()
    with (root / "raw" / "mine_train.jsonl").open("a", encoding="utf-8") as handle:
        handle.write(_rows(1, "added"))
    # `dvc status` runs no command, so it cannot hash; it no longer says "up to date", though:
    assert _dvc_status(root, env, "inputs") == {"inputs": ["always changed"]}
    run(["prefshift", "inputs"], root, env)  # after which it names what the change re-runs
    status = _dvc_status(root, env, "prepare", "split")
    assert status == {"prepare": [{"changed deps": {"data/inputs/prepare/mine.json": "modified"}}]}
    assert (
        inputs_file(Layout(root, seed=0), "backbone").read_bytes() == backbone_inputs
    )  # backbone stays cached
    # and so does every other dataset's prepare: the target's record kept its bytes
    assert dataset_inputs_file(Layout(root, seed=0), "syn_help_chat").read_bytes() == chat_inputs

    assert ran_stages(run(["dvc", "repro", "split"], root, env)) == {"inputs", "prepare", "split"}
    assert ran_stages(run(["dvc", "repro", "split"], root, env)) == {"inputs"}
