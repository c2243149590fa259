"""One rule for file errors (issue 30, item 4): exit 2 and one line naming the path and the cause.

Not found, a directory, no permission, a read-only file system, a full disk: every OSError
at a file boundary, whichever command meets it. The same for JSON nested deeper than the
parser goes, source path patterns with fields other than `{split}`, and model directories
whose weights only an unpickler that runs code could load (prefshift never suggests that).

Read-only and full file systems are real: a small tmpfs mounted for the test (skipped, with
the reason, where mounting is not permitted). Permission denied is real too: the command
runs as an unprivileged user (root ignores file modes).
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import typer
from typer.testing import CliRunner

from disk_support import fill, read_only
from prefshift import cli
from prefshift.cli import app
from prefshift.core.atomic import OutputError, write_json
from prefshift.core.errors import PrefshiftError
from prefshift.data.adapters.base import split_files
from prefshift.models.validate import check_model_dir
from prefshift.pipeline.output_set import output_set
from test_bad_inputs import GOOD, _jsonl, _local_params, _params_file
from test_registry import PAIRS, tiny_reward_model

pytest_plugins = ["disk_support"]  # the small_disk fixture

DEEP = 100_000  # levels: far past Python's recursion limit (1000)
FULL = "the disk is full: free some space, then run again"
PROGRESS = re.compile(r"^[^:]+: \d+/\d+ ")  # prefshift.core.progress's periodic lines


def _one_line_error(result, *expected: str) -> str:
    """The command failed with exit 2 and exactly one `error:` line holding every `expected` text.

    Progress lines of work done before the failure (`score responses: 600/600 ...`) may precede it."""
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    assert "Traceback" not in result.output
    lines = [line for line in result.stderr.splitlines() if line.strip() and not PROGRESS.match(line)]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for text in expected:
        assert text in lines[0], (text, lines[0])
    return lines[0]


def _invoke(*args: str):
    return CliRunner().invoke(app, list(args))


@pytest.fixture
def inputs(tmp_path) -> tuple[Path, Path]:
    rows = _jsonl(tmp_path / "pairs.jsonl", PAIRS)
    return rows, _params_file(tmp_path, {})


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return tiny_reward_model(tmp_path_factory.mktemp("rm") / "model", seed=5)


# --- the central rule: any OSError that names a file ----------------------------------------------


def _as_command(action: Callable[[], object], capsys) -> str:
    with pytest.raises(typer.Exit) as stopped:
        cli._call(action)
    assert stopped.value.exit_code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1
    return lines[0]


def test_every_errno_class_from_a_real_operation_is_one_line_naming_the_path(tmp_path, small_disk, capsys):
    missing, directory = tmp_path / "missing.jsonl", tmp_path
    read_only_file = small_disk / "kept.txt"
    read_only_file.write_text("x")
    line = _as_command(lambda: missing.open(), capsys)
    assert line == f"error: {missing}: no such file or directory; check the path"
    line = _as_command(lambda: directory.open(), capsys)
    assert line.startswith(f"error: {directory}: is a directory")
    source = tmp_path / "big.bin"
    source.write_bytes(b"x" * 65536)
    fill(small_disk)
    copy = small_disk / "copy.bin"
    line = _as_command(lambda: shutil.copyfile(source, copy), capsys)
    assert line == f"error: {source} -> {copy}: no space left on device; {FULL}"
    (small_disk / "filler").unlink()
    read_only(small_disk)
    line = _as_command(lambda: read_only_file.open("a"), capsys)
    assert line.startswith(f"error: {read_only_file}: read-only file system")


def test_an_oserror_without_a_file_keeps_its_traceback():
    def broken() -> None:
        raise ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused")

    with pytest.raises(ConnectionRefusedError):
        cli._call(broken)


def _without_root_file_access() -> list[str]:
    """A command prefix under which file modes apply: root loses the capabilities that bypass them."""
    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        pytest.skip("running as root and no setpriv to drop CAP_DAC_OVERRIDE: file modes would not apply")
    caps = "-dac_override,-dac_read_search"
    return ["setpriv", f"--inh-caps={caps}", f"--bounding-set={caps}"]


def _run_without_root_file_access(args: list[str]) -> subprocess.CompletedProcess:
    src = Path(cli.__file__).resolve().parents[1]
    return subprocess.run(
        [*_without_root_file_access(), sys.executable, "-m", "prefshift", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(src), "HF_HUB_OFFLINE": "1"},
        timeout=300,
    )


def _error_lines(done: subprocess.CompletedProcess) -> list[str]:
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    return [line for line in done.stderr.splitlines() if line.startswith("error:")]


def test_permission_denied_reading_a_data_file_is_one_line_naming_it(tmp_path):
    raw = _local_params(tmp_path, [GOOD])
    train = tmp_path / "raw" / "mine" / "train.jsonl"
    params = _params_file(tmp_path, raw)
    os.chmod(train, 0o000)
    try:
        done = _run_without_root_file_access(["prepare", "--params", str(params), "--root", str(tmp_path)])
    finally:
        os.chmod(train, 0o644)
    assert _error_lines(done) == [
        f"error: {train}: cannot read the data file "
        "(permission denied; check its permissions, or use another path)"
    ]


def test_permission_denied_for_an_output_is_refused_before_the_work(tmp_path):
    rows = _jsonl(tmp_path / "rows.jsonl", [GOOD])
    params = _params_file(tmp_path, {})
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    out = locked / "rewards.jsonl"
    done = _run_without_root_file_access(
        ["score", "--model", str(tmp_path / "m"), "-i", str(rows), "-o", str(out), "-p", str(params)]
    )
    assert _error_lines(done) == [
        f"error: {out}: cannot write the output (no permission to write in {locked}; check its permissions, "
        "or use another path)"
    ]


# --- outputs: checked before the work, and a failed write names the output -------------------------


def test_score_input_that_is_a_directory(tmp_path, model_dir, inputs):
    _, params = inputs
    result = _invoke("score", "--model", str(model_dir), "-i", str(tmp_path), "-p", str(params))
    _one_line_error(result, str(tmp_path), "is a directory")


def test_score_out_that_is_an_existing_directory_is_refused_before_scoring(tmp_path, inputs):
    rows, params = inputs
    out = tmp_path / "results"
    out.mkdir()
    result = _invoke(
        "score", "--model", str(tmp_path / "nope"), "-i", str(rows), "-o", str(out), "-p", str(params)
    )
    _one_line_error(result, str(out), "is a directory")


def test_score_out_on_a_read_only_disk_is_refused_before_scoring(small_disk, inputs, tmp_path):
    rows, params = inputs
    read_only(small_disk)
    out = small_disk / "sub" / "rewards.jsonl"
    result = _invoke(
        "score", "--model", str(tmp_path / "nope"), "-i", str(rows), "-o", str(out), "-p", str(params)
    )
    _one_line_error(result, str(out), "read-only file system")


def test_score_out_on_a_full_disk_is_refused_before_scoring(small_disk, inputs, tmp_path):
    rows, params = inputs
    fill(small_disk)
    out = small_disk / "rewards.jsonl"
    result = _invoke(
        "score", "--model", str(tmp_path / "nope"), "-i", str(rows), "-o", str(out), "-p", str(params)
    )
    _one_line_error(result, str(out), "no space left")


def test_a_disk_that_fills_while_score_writes_names_the_output_and_leaves_nothing(
    small_disk, model_dir, tmp_path
):
    rows = _jsonl(tmp_path / "many.jsonl", [PAIRS[i % 3] for i in range(300)])  # ~40 KB of rewards
    params = _params_file(tmp_path, {})
    out = small_disk / "rewards.jsonl"
    fill(small_disk, leave=8192)
    result = _invoke("score", "--model", str(model_dir), "-i", str(rows), "-o", str(out), "-p", str(params))
    _one_line_error(result, str(out), "cannot write the output", "no space left on device")
    assert sorted(p.name for p in small_disk.iterdir()) == ["filler"]


def test_evaluate_on_a_full_disk_keeps_the_previous_metrics(small_disk):
    """evaluate's write: an output set whose metrics JSON does not fit."""
    metrics = small_disk / "reports" / "metrics" / "naive.json"
    write_json(metrics, {"acc": 70.0})
    previous = metrics.read_bytes()
    fill(small_disk, leave=4096)
    command = "prefshift evaluate --method naive"
    with pytest.raises(OutputError) as raised, output_set(small_disk, command, files=[metrics]) as out:
        write_json(out.path(metrics), {"per_pair": list(range(20_000))})
    message = str(raised.value)
    assert message.startswith(f"{metrics}: cannot write the output (no space left on device")
    assert metrics.read_bytes() == previous
    assert [p.name for p in metrics.parent.iterdir()] == ["naive.json"]


def test_a_stage_on_a_read_only_disk_stops_before_its_work(small_disk):
    metrics = small_disk / "reports" / "metrics" / "naive.json"
    write_json(metrics, {"acc": 70.0})
    read_only(small_disk)
    ran = []
    command = "prefshift evaluate --method naive"
    with (
        pytest.raises(OutputError, match="read-only file system"),
        output_set(small_disk, command, [metrics]),
    ):
        ran.append(True)
    assert ran == [] and json.loads(metrics.read_text()) == {"acc": 70.0}


# --- JSON of any depth ---------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["[" * DEEP + "]" * DEEP, '{"a": ' * DEEP + "1" + "}" * DEEP, "[" * DEEP])
def test_score_input_nested_too_deeply_names_the_file_and_line(tmp_path, model_dir, text):
    rows = _jsonl(tmp_path / "deep.jsonl", [GOOD, text])
    params = _params_file(tmp_path, {})
    result = _invoke("score", "--model", str(model_dir), "-i", str(rows), "-p", str(params))
    _one_line_error(result, f"{rows} line 2", "nested too deeply")


@pytest.mark.parametrize("suffix", [".jsonl", ".json"])
def test_a_local_data_file_nested_too_deeply_names_the_file(tmp_path, suffix):
    raw = _local_params(tmp_path, [GOOD])
    source = tmp_path / "raw" / "mine"
    shutil.rmtree(source)
    source.mkdir()
    (source / f"train{suffix}").write_text("[" * DEEP + "]" * DEEP + "\n")
    _jsonl(source / "test.jsonl", [GOOD])
    params = _params_file(tmp_path, raw)
    result = _invoke("prepare", "--params", str(params), "--root", str(tmp_path))
    where = f"{source / ('train' + suffix)}" + (" line 1" if suffix == ".jsonl" else "")
    _one_line_error(result, where, "nested too deeply")


def test_a_model_config_nested_too_deeply_names_the_file(tmp_path, model_dir):
    copy = tmp_path / "model"
    shutil.copytree(model_dir, copy)
    (copy / "config.json").write_text('{"a": ' * DEEP + "1" + "}" * DEEP)
    with pytest.raises(PrefshiftError, match=r"config\.json") as raised:
        check_model_dir(copy)
    assert "nested too deeply" in str(raised.value)


def test_params_nested_too_deeply_names_the_file(tmp_path):
    params = tmp_path / "params.yaml"
    params.write_text("seed: " + "[" * DEEP + "]" * DEEP + "\n")
    _one_line_error(
        _invoke("prepare", "--params", str(params), "--root", str(tmp_path)), str(params), "nested"
    )


# --- source path patterns --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pattern", "shown"),
    [
        ("mine_{x}.jsonl", "{x}"),
        ("mine_{}.jsonl", "{}"),
        ("mine_{split}_{}.jsonl", "{}"),
        ("mine_{split}_{0}.jsonl", "{0}"),
        ("mine_{split!r}.jsonl", "{split!r}"),
        ("mine_{split:>9}.jsonl", "{split:>9}"),
        ("mine_{split.upper}.jsonl", "{split.upper}"),
        ("mine_{split.jsonl", "unmatched brace"),
        ("mine_}.jsonl", "unmatched brace"),
    ],
)
def test_a_path_pattern_with_another_field_names_the_key_and_the_one_field(tmp_path, pattern, shown):
    raw = _local_params(tmp_path, [GOOD])
    raw["data"]["sources"]["mine"]["path"] = str(tmp_path / "raw" / pattern)
    params = _params_file(tmp_path, raw)
    result = _invoke("prepare", "--params", str(params), "--root", str(tmp_path))
    assert result.exit_code == 2 and "Traceback" not in result.output
    headline, key = result.stderr.strip().splitlines()  # params errors: the file, then one line per key
    assert headline == f"error: {params}: invalid params"
    assert key.strip().startswith("data.sources.mine.path: ") and shown in key and "{split}" in key


def test_split_files_names_the_key_for_a_bad_field_and_reads_literal_braces(tmp_path):
    with pytest.raises(PrefshiftError, match=r"data\.sources\.mine\.path: .* has the field \{x\}"):
        split_files(tmp_path / "{split}_{x}.jsonl", "train", "train", "mine")
    braced = _jsonl(tmp_path / "{v1}_train.jsonl", [GOOD])
    assert split_files(tmp_path / "{{v1}}_{split}.jsonl", "train", "train", "mine") == [braced]


# --- model directories that only a code-running unpickler could load -------------------------------


class NotATensor:
    """Any class of the user's makes a checkpoint that weights-only loading refuses."""


def _bin_model(source: Path, target: Path, extra: dict) -> Path:
    from safetensors.torch import load_file

    shutil.copytree(source, target)
    weights = load_file(target / "model.safetensors")
    (target / "model.safetensors").unlink()
    torch.save({**weights, **extra}, target / "pytorch_model.bin")
    return target


def test_a_pickle_only_model_says_what_prefshift_loads_and_never_the_unsafe_reload(
    tmp_path, model_dir, inputs
):
    rows, params = inputs
    pickled = _bin_model(model_dir, tmp_path / "pickled", {"extra": NotATensor()})
    result = _invoke("score", "--model", str(pickled), "-i", str(rows), "-p", str(params))
    line = _one_line_error(
        result, str(pickled), "pytorch_model.bin", "safetensors or weights-only checkpoints"
    )
    assert "NotATensor" in line
    assert "weights_only=False" not in result.output and "weights_only` set to `False`" not in result.output


def test_a_weights_only_bin_model_still_scores(tmp_path, model_dir, inputs):
    rows, params = inputs
    plain = _bin_model(model_dir, tmp_path / "plain", {})
    result = _invoke("score", "--model", str(plain), "-i", str(rows), "-p", str(params))
    assert result.exit_code == 0, result.output
    assert len(result.stdout.splitlines()) == len(PAIRS)


def test_a_pickle_reached_past_the_directory_check_gets_the_same_refusal(tmp_path, model_dir, monkeypatch):
    """A hub model is not checked as a local directory; transformers' own refusal is reworded the same way."""
    from prefshift.models import reward

    pickled = _bin_model(model_dir, tmp_path / "pickled", {"extra": NotATensor()})
    monkeypatch.setattr(reward, "check_source", lambda name: None)  # as for a hub id
    with pytest.raises(PrefshiftError, match="safetensors or weights-only checkpoints") as raised:
        reward.load_reward_model(pickled)
    assert "NotATensor" in str(raised.value) and "weights_only" not in str(raised.value)


@pytest.mark.parametrize("kind", ["fifo", "directory", "device"])
def test_a_data_file_that_is_not_a_regular_file_is_one_line(tmp_path, kind):
    """A FIFO would block, a device never end, a directory has no rows: `prepare` says so in one line."""
    raw = _local_params(tmp_path, [GOOD])
    train = tmp_path / "raw" / "mine" / "train.jsonl"
    train.unlink()
    _make_special(train, kind)
    params = _params_file(tmp_path, raw)
    done = subprocess.run(
        [sys.executable, "-m", "prefshift", "prepare", "--params", str(params), "--root", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    lines = _error_lines(done)
    assert len(lines) == 1 and str(train.parent) in lines[0], done.stderr


@pytest.mark.parametrize("kind", ["fifo", "directory", "device"])
def test_read_records_checks_the_handle_it_reads(tmp_path, kind):
    """The reader itself refuses what is not a regular file, on the descriptor it then reads, so a
    file swapped for a FIFO or a device after the directory scan is refused too, not read."""
    from prefshift.data.adapters.base import read_records
    from prefshift.data.schema import SchemaError

    path = tmp_path / "train.jsonl"
    _make_special(path, kind)
    with pytest.raises(SchemaError, match="not a regular file"):
        list(read_records(path))


def _make_special(path: Path, kind: str) -> None:
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    else:
        path.symlink_to("/dev/zero")
