"""One rule for outputs (issue 30, item 3): prefshift replaces only what it may replace.

A regular file, or a directory for directory outputs, and nothing else: never a symlink
(nor what it points to), a device, a FIFO, a socket, a directory where a file belongs, or
one of the command's own inputs. The rule is checked before the work starts and again at
the rename, for user-facing outputs (`score --out`, `pull --out`) and stage outputs alike.
`pull` removes or replaces only files that a record it can verify says it wrote.

Every case builds the real thing (a link, a FIFO, a device node, a socket, a hard link,
a registry with a promoted model) and checks both the refusal and that the thing is intact.
"""

from __future__ import annotations

import json
import os
import socket
import stat
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from prefshift.cli import app
from prefshift.core.atomic import OutputError, atomic_path, check_output, write_text
from prefshift.core.paths import Layout
from prefshift.pipeline.output_set import output_set
from prefshift.tracking import registry
from prefshift.tracking import runs as tracking

pytest_plugins = ["disk_support", "output_support"]  # small_disk; score_inputs, model_dir, registered

SPECIAL = ("symlink", "fifo", "device", "socket", "directory")


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for name in ("MLFLOW_TRACKING_URI", "DVC_ROOT", "DVC_STAGE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(tracking.PIPELINE_ENV, "pr-output-rule")


def _make_special(kind: str, path: Path) -> Callable[[], object]:
    """Create `kind` at `path`; return a function whose value changes if the thing is replaced."""
    if kind == "symlink":
        victim = path.with_name("victim.txt")
        victim.write_text("the user's own data")
        path.symlink_to(victim)
        return lambda: (os.readlink(path), victim.read_text(), path.is_symlink())
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "device":
        try:  # the same node as /dev/null, made here so nothing outside the test is at risk
            os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        except PermissionError:
            pytest.skip("creating a device node needs root (CAP_MKNOD)")
    elif kind == "socket":
        server = socket.socket(socket.AF_UNIX)
        try:
            server.bind(str(path))
        except OSError as err:
            pytest.skip(f"cannot bind a unix socket at {path}: {err}")
        server.close()
    elif kind == "directory":
        path.mkdir()
        (path / "inside.txt").write_text("kept")
        return lambda: sorted(p.name for p in path.iterdir())
    return lambda: (stat.S_IFMT(path.lstat().st_mode), path.lstat().st_rdev)


def _word(kind: str) -> str:
    return {"symlink": "symbolic link", "fifo": "FIFO", "device": "device", "socket": "socket"}.get(
        kind, "is a directory"
    )


# --- the rule itself, where every write goes through -------------------------------------------


@pytest.mark.parametrize("kind", SPECIAL)
def test_an_atomic_write_refuses_what_is_not_a_regular_file(tmp_path, kind):
    target = tmp_path / "out.json"
    state = _make_special(kind, target)
    before = state()
    with pytest.raises(OutputError, match=_word(kind)) as raised:
        write_text(target, "rewards")
    assert str(target) in str(raised.value)
    assert state() == before
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


@pytest.mark.parametrize("kind", ("symlink", "fifo", "file"))
def test_a_directory_output_refuses_a_link_a_fifo_or_a_file(tmp_path, kind):
    target = tmp_path / "model"
    if kind == "file":
        target.write_text("a file the user keeps")
        state: Callable[[], object] = target.read_text
    elif kind == "symlink":
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        (elsewhere / "weights").write_text("theirs")
        target.symlink_to(elsewhere, target_is_directory=True)
        state = lambda: (os.readlink(target), sorted(p.name for p in elsewhere.iterdir()))  # noqa: E731
    else:
        state = _make_special(kind, target)
    before = state()
    with pytest.raises(OutputError, match=str(target)), atomic_path(target, directory=True) as tmp:
        (tmp / "config.json").write_text("{}")
    assert state() == before


def test_a_stage_output_set_refuses_a_link_before_the_stage_runs(tmp_path):
    metrics = tmp_path / "reports" / "metrics"
    metrics.mkdir(parents=True)
    state = _make_special("symlink", metrics / "naive.json")
    before = state()
    ran = []
    command = "prefshift evaluate --method naive"
    with (
        pytest.raises(OutputError, match="symbolic link"),
        output_set(tmp_path, command, [metrics / "naive.json"]),
    ):
        ran.append(True)
    assert ran == [] and state() == before


def test_a_link_made_while_the_work_ran_is_not_replaced(tmp_path):
    target = tmp_path / "out.txt"
    with pytest.raises(OutputError, match="symbolic link"), atomic_path(target) as tmp:
        tmp.write_text("new")
        state = _make_special("symlink", target)
        before = state()
    assert state() == before


def test_an_output_that_is_an_input_is_refused_however_it_is_spelled(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    rows = data / "rows.jsonl"
    rows.write_text("{}\n")
    os.link(rows, tmp_path / "hardlink.jsonl")
    for spelling in (
        rows,
        data / ".." / "data" / "rows.jsonl",
        tmp_path / "hardlink.jsonl",
        data / "new.jsonl",
    ):
        with pytest.raises(OutputError, match="is also an input"):
            check_output(spelling, inputs=[rows, data] if spelling.name == "new.jsonl" else [rows])
    assert check_output(tmp_path / "elsewhere.jsonl", inputs=[rows, data]) == tmp_path / "elsewhere.jsonl"


def test_an_output_below_a_file_is_refused_before_any_work(tmp_path):
    (tmp_path / "notes").write_text("mine")
    with pytest.raises(OutputError, match="is a file, not a directory"):
        check_output(tmp_path / "notes" / "sub" / "out.jsonl")


# --- score --out ----------------------------------------------------------------------------------


def _score(*args: str) -> object:
    return CliRunner().invoke(app, ["score", *args])


def _refused(result, *expected: str) -> str:
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    assert "Traceback" not in result.output
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]  # not mlflow's bars
    assert len(lines) == 1, result.stderr
    for text in expected:
        assert text in lines[0]
    return lines[0]


def test_score_refuses_to_write_over_its_input_and_keeps_it(tmp_path, score_inputs):
    rows, params = score_inputs
    before = rows.read_bytes()
    missing_model = str(tmp_path / "no-model-here")  # the refusal comes first: no model is even looked at
    for out in (rows, tmp_path / "." / rows.name):
        result = _score("--model", missing_model, "-i", str(rows), "-o", str(out), "-p", str(params))
        _refused(result, str(out), "is also an input")
    os.link(rows, tmp_path / "same-inode.jsonl")
    result = _score(
        "--model", missing_model, "-i", str(rows), "-o", str(tmp_path / "same-inode.jsonl"), "-p", str(params)
    )
    _refused(result, "same-inode.jsonl", "is also an input")
    _refused(
        _score("--model", missing_model, "-i", str(rows), "-o", str(params), "-p", str(params)),
        "is also an input",
    )
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    inside = model_dir / "config.json"
    _refused(
        _score("--model", str(model_dir), "-i", str(rows), "-o", str(inside), "-p", str(params)),
        "is also an input",
    )
    assert rows.read_bytes() == before and not inside.exists()


@pytest.mark.parametrize("kind", SPECIAL)
def test_score_refuses_an_out_that_is_a_link_a_device_a_fifo_a_socket_or_a_directory(
    tmp_path, score_inputs, kind
):
    rows, params = score_inputs
    out = tmp_path / "rewards.jsonl"
    state = _make_special(kind, out)
    before = state()
    result = _score(
        "--model", str(tmp_path / "no-model-here"), "-i", str(rows), "-o", str(out), "-p", str(params)
    )
    line = _refused(result, str(out), _word(kind))
    assert kind == "directory" or "`--out -`" in line  # where standard output was meant
    assert state() == before


def test_score_out_dash_writes_the_rewards_to_standard_output(model_dir, score_inputs, tmp_path, monkeypatch):
    rows, params = score_inputs
    monkeypatch.chdir(tmp_path)
    result = _score("--model", str(model_dir), "-i", str(rows), "-o", "-", "-p", str(params))
    assert result.exit_code == 0, result.output
    scored = [json.loads(line) for line in result.stdout.splitlines()]
    assert [r["row"] for r in scored] == [0, 1, 2]
    assert not (tmp_path / "-").exists()
    to_file = _score("--model", str(model_dir), "-i", str(rows), "-o", "rewards.jsonl", "-p", str(params))
    assert to_file.exit_code == 0 and to_file.stdout == ""
    assert [json.loads(line) for line in (tmp_path / "rewards.jsonl").read_text().splitlines()] == scored


def test_score_replaces_an_earlier_rewards_file(model_dir, score_inputs, tmp_path):
    rows, params = score_inputs
    out = tmp_path / "rewards.jsonl"
    out.write_text("an earlier run\n")
    result = _score("--model", str(model_dir), "-i", str(rows), "-o", str(out), "-p", str(params))
    assert result.exit_code == 0, result.output
    assert len(out.read_text().splitlines()) == 3


# --- pull --out: what it may remove comes from a record it can verify ------------------------------


def _pull(layout: Layout, uri: str, out: Path, *extra: str):
    return CliRunner().invoke(app, ["pull", uri, "--out", str(out), "--root", str(layout.root), *extra])


def _user_files(out: Path) -> dict[str, str]:
    (out / "notes.txt").write_text("my notes")
    (out / "results.csv").write_text("a,b\n1,2\n")
    return {"notes.txt": "my notes", "results.csv": "a,b\n1,2\n"}


def _intact(out: Path, files: dict[str, str]) -> bool:
    return all((out / name).read_text() == text for name, text in files.items())


def _forge(out: Path, marker: dict) -> None:
    (out / registry.PULL_MARKER).write_text(json.dumps(marker))


def test_pull_deletes_nothing_on_the_word_of_a_forged_list(registered, tmp_path):
    layout, uri = registered
    out = tmp_path / "mine"
    out.mkdir()
    files = _user_files(out)
    _forge(out, {"name": "x", "files": sorted(files)})  # round 2's format: names alone
    _refused(_pull(layout, uri, out), "holds no earlier prefshift pull that verifies", "--force")
    assert _intact(out, files)


def test_pull_deletes_nothing_on_a_listing_that_hashes_right_but_was_never_registered(registered, tmp_path):
    layout, uri = registered
    out = tmp_path / "mine"
    out.mkdir()
    files = _user_files(out)
    listing = {name: registry._sha256(out / name) for name in files}
    name = uri.removeprefix("models:/").split("@")[0]
    _forge(out, {"name": name, "files": listing, "content_hash": registry.listing_hash(listing)})
    _refused(_pull(layout, uri, out), "holds no earlier prefshift pull that verifies")
    assert _intact(out, files)

    version = tracking.open_client(layout).get_model_version_by_alias(name, "champion")
    registered_hash = version.tags[registry.HASH_TAG]  # the right hash, claimed for the user's files
    _forge(out, {"name": name, "files": listing, "content_hash": registered_hash})
    _refused(_pull(layout, uri, out), "holds no earlier prefshift pull that verifies")
    assert _intact(out, files)

    assert _pull(layout, uri, out, "--force").exit_code == 0  # --force adds, and removes nothing
    assert _intact(out, files) and (out / "config.json").exists()


def test_pull_again_replaces_its_own_unchanged_files_and_refuses_changed_ones(registered, tmp_path):
    layout, uri = registered
    out = tmp_path / "rm"
    assert _pull(layout, uri, out).exit_code == 0
    assert _pull(layout, uri, out).exit_code == 0  # an earlier pull, unchanged: no --force needed
    config = out / "config.json"
    edited = config.read_text().replace("{", '{"my_note": 1, ', 1)
    config.write_text(edited)
    _refused(_pull(layout, uri, out), "config.json would be replaced", "--force")
    assert config.read_text() == edited
    assert _pull(layout, uri, out, "--force").exit_code == 0
    assert "my_note" not in config.read_text()


def test_pull_never_writes_through_a_link_planted_in_an_earlier_pull(registered, tmp_path):
    layout, uri = registered
    out = tmp_path / "rm"
    assert _pull(layout, uri, out).exit_code == 0
    victim = tmp_path / "victim.txt"
    victim.write_text("not prefshift's")
    (out / "config.json").unlink()
    (out / "config.json").symlink_to(victim)
    _refused(_pull(layout, uri, out), "config.json would be replaced")
    _refused(_pull(layout, uri, out, "--force"), "symbolic link")
    assert victim.read_text() == "not prefshift's" and (out / "config.json").is_symlink()


def test_pull_refuses_an_out_that_is_a_link_a_file_or_standard_output(registered, tmp_path):
    layout, uri = registered
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    link = tmp_path / "link"
    link.symlink_to(elsewhere, target_is_directory=True)
    _refused(_pull(layout, uri, link), "symbolic link")
    (tmp_path / "file").write_text("mine")
    _refused(_pull(layout, uri, tmp_path / "file"), "is a file")
    _refused(_pull(layout, uri, Path("-")), "standard output")
    assert list(elsewhere.iterdir()) == [] and (tmp_path / "file").read_text() == "mine"


def test_pull_force_refuses_a_planted_marker_link_before_copying_anything(registered, tmp_path):
    layout, uri = registered
    out = tmp_path / "mine"
    out.mkdir()
    files = _user_files(out)
    victim = tmp_path / "victim.json"
    victim.write_text("not prefshift's")
    (out / registry.PULL_MARKER).symlink_to(victim)
    _refused(_pull(layout, uri, out, "--force"), registry.PULL_MARKER, "symbolic link")
    assert sorted(p.name for p in out.iterdir()) == sorted([*files, registry.PULL_MARKER])
    assert victim.read_text() == "not prefshift's" and _intact(out, files)


def test_pull_onto_a_disk_too_small_for_the_model_names_the_output_and_leaves_nothing(registered, small_disk):
    layout, uri = registered
    fresh, existing = small_disk / "fresh", small_disk / "existing"
    existing.mkdir()
    for out in (fresh, existing):
        _refused(_pull(layout, uri, out), str(out), "no space left on device")
    assert [p.name for p in small_disk.iterdir()] == ["existing"] and list(existing.iterdir()) == []
