"""Ownership is proven, never inferred from a name (issue 43, item 1).

prefshift removes or renames only scratch that its own record says it made: a directory made
with mkdtemp whose `scratch.json` names the target and the directory's own inode, not held by a
live writer; and a directory swap only as its swap record says. A user's file or directory that
merely looks like one (`.rm.old/`, `.r.jsonl.ABCDEFGH.tmp/`, a record copied in, a commit journal
edited to point at it) is never touched. Another user's file is replaced only with --force, and
then keeps its mode and owner.

Kills are real: a child process is SIGKILLed inside the write, at the step under test.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from prefshift.cli import app
from prefshift.core import scratch
from prefshift.core.atomic import OutputError, atomic_path, recover_interrupted_swap, write_json, write_text
from prefshift.pipeline.output_set import JOURNALS, OutputSetError, finish_interrupted, output_set, verify
from test_output_rule import _pull, _refused, _score

pytest_plugins = ["output_support"]  # score_inputs, model_dir, registered

OTHER_UID = 12345
SRC = str(Path(__file__).resolve().parents[1] / "src")


def _tree(path: Path) -> dict[str, object]:
    """Every path under `path` (itself included) → its bytes, a link's target, or a directory's inode."""
    found: dict[str, object] = {}
    inside = sorted(path.rglob("*")) if path.is_dir() and not path.is_symlink() else []
    for item in [path, *inside]:
        info = item.lstat()
        if stat.S_ISLNK(info.st_mode):
            shown: object = ("link", os.readlink(item))
        else:
            shown = info.st_ino if stat.S_ISDIR(info.st_mode) else item.read_bytes()
        found[str(item.relative_to(path.parent))] = shown
    return found


def _killed_in(code: str) -> None:
    """Run `code` in a child that SIGKILLs itself where the code says `die()`."""
    prelude = "import os, signal\ndef die():\n    os.kill(os.getpid(), signal.SIGKILL)\n"
    done = subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(code)],
        env={**os.environ, "PYTHONPATH": SRC},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == -signal.SIGKILL, done.stderr


def _user_dir(path: Path) -> dict[str, object]:
    path.mkdir()
    (path / "precious.txt").write_text("the user's own backup")
    (path / "sub").mkdir()
    (path / "sub" / "more.bin").write_bytes(b"\x00\x01")
    return _tree(path)


def _leftover(target: Path) -> Path:
    """A real scratch of `target` that a SIGKILLed writer left, half written."""
    before = set(scratch.candidates(target))
    _killed_in(
        f"""
        from prefshift.core.atomic import atomic_path
        with atomic_path({str(target)!r}) as tmp:
            tmp.write_text("half")
            die()
        """
    )
    [left] = set(scratch.candidates(target)) - before
    return left


# --- temporaries: only proven scratch is removed ---------------------------------------------------


@pytest.mark.parametrize("name", [".r.jsonl.ABCDEFGH.tmp", ".r.jsonl.old", ".r.jsonl.k1ll3d0n.tmp"])
def test_a_users_directory_named_like_a_temporary_is_never_touched(tmp_path, name):
    target = tmp_path / "r.jsonl"
    before = _user_dir(tmp_path / name)
    write_text(target, "rewards\n")
    write_text(target, "rewards again\n")
    assert _tree(tmp_path / name) == before
    assert target.read_text() == "rewards again\n"


def test_a_killed_writers_scratch_is_cleared_and_a_look_alike_beside_it_is_not(tmp_path):
    target = tmp_path / "scores" / "metrics.json"
    target.parent.mkdir()
    left = _leftover(target)
    assert (left / scratch.RECORD).is_file() and not target.exists()
    look_alike = tmp_path / "scores" / ".metrics.json.a1b2c3d4.tmp"
    before = _user_dir(look_alike)
    write_json(target, {"a": 1})
    assert not left.exists() and _tree(look_alike) == before
    assert json.loads(target.read_text()) == {"a": 1}


def test_a_copied_renamed_or_foreign_scratch_proves_nothing(tmp_path):
    """The record names the directory's own inode and is trusted only from this user's directory:
    a copy of a real leftover (cp -r, a backup restored), a leftover of another target renamed to
    this one's pattern, a record copied into a user's directory, a link to a leftover, and a
    leftover owned by another user are all left exactly as they are."""
    target = tmp_path / "r.jsonl"
    real = _leftover(target)
    kept: dict[str, Path] = {
        "copy": tmp_path / ".r.jsonl.COPYCOPY.tmp",
        "renamed": tmp_path / ".r.jsonl.RENAMED1.tmp",
        "planted": tmp_path / ".r.jsonl.PLANTED1.tmp",
        "link": tmp_path / ".r.jsonl.LINKLINK.tmp",
    }
    shutil.copytree(real, kept["copy"])
    other = _leftover(tmp_path / "other.jsonl")
    other.rename(kept["renamed"])
    _user_dir(kept["planted"])
    shutil.copyfile(real / scratch.RECORD, kept["planted"] / scratch.RECORD)
    (tmp_path / "elsewhere").mkdir()
    linked_to = _leftover(tmp_path / "elsewhere" / "r.jsonl")  # genuine, but reached through a link
    kept["record-link"] = tmp_path / ".r.jsonl.RECLINK1.tmp"  # a record reached through a link
    _user_dir(kept["record-link"])
    info = kept["record-link"].stat()
    (tmp_path / "record.json").write_text(
        json.dumps(scratch._record(target, False, info), sort_keys=True)  # right in every field
    )
    (kept["record-link"] / scratch.RECORD).symlink_to(tmp_path / "record.json")
    kept["link"].symlink_to(linked_to, target_is_directory=True)
    if os.geteuid() == 0:  # a genuine leftover of this very target, but another user's
        kept["foreign"] = _leftover(target)
        os.chown(kept["foreign"], OTHER_UID, OTHER_UID)
    before = {name: _tree(path) for name, path in kept.items()}
    before_linked = _tree(linked_to)
    write_text(target, "new\n")
    assert not real.exists() and target.read_text() == "new\n"  # the genuine leftover went
    assert {name: _tree(path) for name, path in kept.items()} == before
    assert _tree(linked_to) == before_linked


def test_a_live_writers_scratch_is_left_to_it(tmp_path):
    target = tmp_path / "r.jsonl"
    code = f"""
        import sys, time
        sys.path.insert(0, {SRC!r})
        from prefshift.core.atomic import atomic_path
        with atomic_path({str(target)!r}) as tmp:
            tmp.write_text("slow work")
            print("writing", flush=True)
            time.sleep(60)
        """
    writer = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert writer.stdout.readline() == "writing\n"
        [live] = scratch.candidates(target)
        before = _tree(live)
        write_text(target, "mine\n")
        assert _tree(live) == before and target.read_text() == "mine\n"
    finally:
        writer.kill()
        writer.wait()


# --- directory swaps: journaled, and recovered only as the journal says ---------------------------


def _swap_killed(target: Path, at: str) -> None:
    """Replace directory `target` (holding step 1) by one holding step 2, SIGKILLed at `at`:
    "after-record" (the swap recorded, nothing renamed) or "between" (the old copy moved out)."""
    _killed_in(
        f"""
        from prefshift.core import scratch
        from prefshift.core.atomic import atomic_path
        real_rename = os.rename
        def rename(src, dst):
            if {at!r} == "after-record":
                die()
            real_rename(src, dst)
            die()
        scratch.os.rename = rename
        with atomic_path({str(target)!r}, directory=True) as tmp:
            (tmp / "state.json").write_text('{{"step": 2}}')
        """
    )


@pytest.mark.parametrize("at", ["after-record", "between"])
def test_a_kill_inside_a_directory_swap_is_finished_from_its_record(tmp_path, at):
    target = tmp_path / "checkpoints" / "last"
    with atomic_path(target, directory=True) as tmp:
        (tmp / "state.json").write_text('{"step": 1}')
    _swap_killed(target, at)
    assert target.exists() == (at == "after-record")
    recover_interrupted_swap(target)  # as a resumed run does before it reads
    assert (target / "state.json").read_text() == '{"step": 2}'
    assert sorted(p.name for p in target.parent.iterdir()) == ["last"]


def test_a_users_backup_beside_a_missing_directory_is_not_taken_for_an_interrupted_swap(tmp_path):
    """The issue's `.rm.old/`: once renamed into place, swapped out and deleted; now never touched."""
    target = tmp_path / "rm"
    backup = _user_dir(tmp_path / ".rm.old")
    recover_interrupted_swap(target)
    assert not target.exists()
    with atomic_path(target, directory=True) as tmp:
        (tmp / "config.json").write_text("{}")
    with atomic_path(target, directory=True) as tmp:  # a swap now: the old copy goes into the scratch
        (tmp / "config.json").write_text('{"v": 2}')
    assert _tree(tmp_path / ".rm.old") == backup
    assert sorted(p.name for p in tmp_path.iterdir()) == [".rm.old", "rm"]


@pytest.mark.parametrize("tamper", ["old-replaced", "new-replaced", "target-made", "record-edited"])
def test_an_interrupted_swap_that_no_longer_matches_its_record_touches_nothing(tmp_path, tamper):
    target = tmp_path / "last"
    with atomic_path(target, directory=True) as tmp:
        (tmp / "state.json").write_text('{"step": 1}')
    _swap_killed(target, "between")
    [left] = scratch.candidates(target)
    if tamper in ("old-replaced", "new-replaced"):  # moved away first: a deleted one's inode is reused
        name = scratch.OLD if tamper == "old-replaced" else scratch.NEW
        (left / name).rename(tmp_path / "moved-away")
        _user_dir(left / name)
    elif tamper == "target-made":
        _user_dir(target)
    else:
        (left / scratch.SWAP).write_text(json.dumps({"old": [0, 0], "new": [0, 0]}))
    before = _tree(tmp_path)
    recover_interrupted_swap(target)
    write_text(tmp_path / "last.json", "a writer beside it clears nothing of it either")
    assert {k: v for k, v in _tree(tmp_path).items() if "last.json" not in k} == before


# --- commit journals of output sets -----------------------------------------------------------------


def _interrupted_set(root: Path) -> Path:
    """An output set of two directories, SIGKILLed after its commit point, before any rename."""
    _killed_in(
        f"""
        from pathlib import Path
        from prefshift.core import scratch
        from prefshift.pipeline.output_set import output_set
        root = Path({str(root)!r})
        commit = scratch.Scratch.commit
        def commit_or_die(self):
            if self.target.name in "ab":  # the set's own outputs, not the manifests inside them
                die()
            commit(self)
        scratch.Scratch.commit = commit_or_die
        with output_set(root, "prefshift toy", directories=[root / "a", root / "b"]) as out:
            for name in "ab":
                out.path(root / name / "data.txt").write_text("new")
        """
    )
    [journal] = (root / JOURNALS).glob("*.json")
    return journal


def test_an_interrupted_commit_is_rolled_forward_from_its_journal(tmp_path):
    _interrupted_set(tmp_path)
    manifest = verify(tmp_path, tmp_path / "a" / "output_set.json", [tmp_path / "a"], "prefshift toy")
    assert manifest["command"] == "prefshift toy"
    assert (tmp_path / "a" / "data.txt").read_text() == (tmp_path / "b" / "data.txt").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".prefshift", "a", "b"]


@pytest.mark.parametrize(
    "edit", ["staged-is-a-user-dir", "staged-outside-root", "target-outside-root", "not-json"]
)
def test_a_commit_journal_pointing_at_what_prefshift_did_not_make_is_refused_and_touches_nothing(
    tmp_path, edit
):
    journal = _interrupted_set(tmp_path)
    plan = json.loads(journal.read_text())
    mine = _user_dir(tmp_path / "mine")
    if edit == "staged-is-a-user-dir":
        plan["renames"][0]["staged"] = "mine"
    elif edit == "staged-outside-root":
        plan["renames"][0]["staged"] = "../elsewhere"
    elif edit == "target-outside-root":
        plan["renames"][0]["target"] = "../../victim"
    journal.write_text("{ not json" if edit == "not-json" else json.dumps(plan))
    before = _without_locks(_tree(tmp_path))
    with pytest.raises(OutputSetError, match=re.escape(str(journal))) as raised:
        finish_interrupted(tmp_path)  # what every later writer and reader of the project does first
    assert "\n" not in str(raised.value)
    assert _without_locks(_tree(tmp_path)) == before and _tree(tmp_path / "mine") == mine


def _without_locks(tree: dict[str, object]) -> dict[str, object]:
    """Lock files are made by taking a lock (and kept): not what is compared."""
    return {k: v for k, v in tree.items() if "/.prefshift/locks" not in f"/{k}"}


# --- another user's file: refused without --force; with it, mode and owner kept ----------------------


def _foreign_file(path: Path, mode: int = 0o600) -> Path:
    if os.geteuid() != 0:
        pytest.skip("making another user's file needs root")
    path.write_text("another user's data\n")
    os.chown(path, OTHER_UID, OTHER_UID)
    os.chmod(path, mode)
    return path


def _owner_mode(path: Path) -> tuple[int, int, int]:
    info = path.lstat()
    return info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)


def test_score_refuses_another_users_file_and_with_force_keeps_its_mode_and_owner(
    model_dir,
    score_inputs,
    tmp_path,
):
    rows, params = score_inputs
    out = _foreign_file(tmp_path / "f")
    args = ["--model", str(model_dir), "-i", str(rows), "-o", str(out), "-p", str(params)]
    _refused(_score(*args), str(out), "uid 12345", "--force")
    assert out.read_text() == "another user's data\n" and _owner_mode(out) == (OTHER_UID, OTHER_UID, 0o600)
    result = _score(*args, "--force")
    assert result.exit_code == 0, result.output
    assert len(out.read_text().splitlines()) == 3 and _owner_mode(out) == (OTHER_UID, OTHER_UID, 0o600)


def test_preset_force_over_another_users_file_keeps_its_mode_and_owner(tmp_path):
    out = _foreign_file(tmp_path / "params.yaml", 0o640)
    result = CliRunner().invoke(app, ["preset", "laptop-helpful", "--out", str(out), "--force"])
    assert result.exit_code == 0, result.output
    assert "seeds:" in out.read_text() and _owner_mode(out) == (OTHER_UID, OTHER_UID, 0o640)


def test_a_replaced_file_of_ones_own_keeps_its_mode(tmp_path):
    out = tmp_path / "private.json"
    out.write_text("{}")
    os.chmod(out, 0o600)
    write_json(out, {"a": 1})
    assert stat.S_IMODE(out.stat().st_mode) == 0o600


@pytest.mark.parametrize(
    "command",
    [
        ["bench", "--out", "{dir}"],
        ["bench", "--out", "{dir}/sub", "--readme", "{file}"],
        ["ui", "--check", "--screenshot", "{file}"],
    ],
)
def test_every_command_writing_a_named_output_refuses_another_users_file(tmp_path, command):
    out = _foreign_file(tmp_path / "bench.json")
    args = [part.format(dir=tmp_path, file=out) for part in command]
    _refused(CliRunner().invoke(app, args), str(out), "uid 12345")
    assert _owner_mode(out) == (OTHER_UID, OTHER_UID, 0o600)


def test_pull_refuses_another_users_directory_without_force(registered, tmp_path):
    layout, uri = registered
    out = tmp_path / "theirs"
    out.mkdir()
    (out / "notes.txt").write_text("theirs")
    _foreign_file(out / "notes.txt")
    os.chown(out, OTHER_UID, OTHER_UID)
    _refused(_pull(layout, uri, out), str(out), "uid 12345", "--force")
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]


def test_an_output_set_refuses_another_users_file(tmp_path):
    out = _foreign_file(tmp_path / "metrics.json")
    with pytest.raises(OutputError, match="uid 12345"), output_set(tmp_path, "prefshift toy", files=[out]):
        pass
    assert out.read_text() == "another user's data\n"


# --- the cases through the commands ---------------------------------------------------------


def test_pull_leaves_a_users_hidden_backup_and_scratch_look_alikes_alone(registered, tmp_path):
    layout, uri = registered
    out = tmp_path / "rm"
    kept = {name: _user_dir(tmp_path / name) for name in (".rm.old", ".rm.ABCDEFGH.tmp")}
    result = _pull(layout, uri, out)
    assert result.exit_code == 0, result.output
    inside = _user_dir(out / ".prefshift-pull-copies.ABCDEFGH.tmp")  # a look-alike inside the pull too
    (out / ".config.json.partial").write_text("a user's file, named like an old pull's copy")
    assert _pull(layout, uri, out).exit_code == 0  # again: into the earlier pull
    assert {name: _tree(tmp_path / name) for name in kept} == kept
    assert _tree(out / ".prefshift-pull-copies.ABCDEFGH.tmp") == inside
    assert (out / ".config.json.partial").read_text() == "a user's file, named like an old pull's copy"
    assert (out / "config.json").is_file()


def test_score_leaves_a_users_directory_named_like_its_temporary_alone(model_dir, score_inputs, tmp_path):
    rows, params = score_inputs
    kept = _user_dir(tmp_path / ".r.jsonl.ABCDEFGH.tmp")
    out = tmp_path / "r.jsonl"
    for _ in range(2):
        result = _score("--model", str(model_dir), "-i", str(rows), "-o", str(out), "-p", str(params))
        assert result.exit_code == 0, result.output
    assert _tree(tmp_path / ".r.jsonl.ABCDEFGH.tmp") == kept
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [".r.jsonl.ABCDEFGH.tmp", "r.jsonl", rows.name, params.name]
    )
