"""Output sets: a stage's several outputs replaced together, and a manifest the next stage checks.

Many stages write more than one output (prepare: every dataset's pairs; backbone: weak and
strong; evaluate: scores and metrics). Replaced one by one, a failure or a kill half-way leaves
new files beside old ones, and the next stage would read them as one run. Here each output is
staged as a hidden sibling of its target (as `atomic_path` does for one), and only once the stage
has written them all is a commit journal written under `<root>/.prefshift/commits/`; the renames
follow. A journal that a kill left behind is rolled forward by the next writer or reader
(`finish_interrupted`), so what is on disk is always the whole old set or the whole new one.

Every directory of a set also receives `output_set.json` (the command that wrote it, a version,
and the sha256 of every file of the set), so a later stage can `verify` that the files it reads
are the ones one run wrote together, and refuse a mix (a file copied in, or left by another run).
A file output has no directory to hold a manifest: its sha256 is recorded under
`<root>/.prefshift/outputs/` instead, and `verify_file` checks it (or dvc.lock's md5) before a
later stage trusts the file (promote reads the metrics this way).

Each output is written under its writer lock (`prefshift.core.locks`): a second process writing the same
output fails at once instead of interleaving its renames with the first one's.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from prefshift.core import locks, scratch
from prefshift.core.atomic import check_output, clear_stale, output_errors, refuse_unowned, write_json
from prefshift.core.errors import PrefshiftError
from prefshift.data.schema import content_hash
from prefshift.data.splits import file_sha256

MANIFEST = "output_set.json"
JOURNALS = Path(".prefshift") / "commits"
RECORDS = Path(".prefshift") / "outputs"


class OutputSetError(PrefshiftError):
    """Inputs that are not one consistent output set of the stage that writes them."""


def manifest_of(directory: Path) -> Path:
    """The manifest an output set leaves in each of its directories."""
    return directory / MANIFEST


def _absolute(path: str | Path) -> Path:
    return Path(os.path.abspath(path))


@dataclass(frozen=True)
class _Output:
    scratch: scratch.Scratch
    bare: bool = False

    @property
    def target(self) -> Path:
        return self.scratch.target

    @property
    def directory(self) -> bool:
        return self.scratch.directory

    @property
    def work(self) -> Path:
        return self.scratch.work


class OutputSet:
    """Where a stage writes: `path(final)` is the staged twin of an output (or of a file inside one)."""

    def __init__(self, root: Path, command: str, outputs: Sequence[_Output], manifest: bool = True):
        self.root, self.command, self.outputs, self.manifest = root, command, list(outputs), manifest

    def path(self, final: str | Path) -> Path:
        final = _absolute(final)
        for out in self.outputs:
            if final == out.target:
                return out.work
            if out.directory and final.is_relative_to(out.target):
                return out.work / final.relative_to(out.target)
        raise ValueError(f"{final} is not an output of `{self.command}`")

    def _files(self) -> dict[str, str]:
        """Final path (relative to the root) → sha256 for every staged file."""
        found: dict[str, str] = {}
        for out in self.outputs:
            if out.directory:
                staged = [(p, out.target / p.relative_to(out.work)) for p in _walk_files(out.work)]
            elif out.work.is_file():
                staged = [(out.work, out.target)]
            else:
                raise RuntimeError(f"`{self.command}` finished without writing {out.target}")
            for path, final in staged:
                found[_relative(final, self.root)] = file_sha256(path)
        return dict(sorted(found.items()))

    def _commit(self, journal: Path) -> None:
        files = self._files()
        manifest = {"command": self.command, "version": content_hash(files), "files": files}
        for out in self.outputs:
            if out.directory and self.manifest and not out.bare:
                write_json(manifest_of(out.work), manifest)
        renames = [
            {
                "staged": _relative(out.scratch.root, self.root),
                "target": _relative(out.target, self.root),
                "directory": out.directory,
            }
            for out in self.outputs
        ]
        records = {
            _relative(out.target, self.root): files[_relative(out.target, self.root)]
            for out in self.outputs
            if not out.directory
        }
        plan = {"command": self.command, "renames": renames, "records": records}
        write_json(journal, plan)  # the commit point
        _apply(
            self.root, journal, {_relative(out.scratch.root, self.root): out.scratch for out in self.outputs}
        )


@contextmanager
def output_set(
    root: str | Path,
    command: str,
    files: Sequence[Path] = (),
    directories: Sequence[Path] = (),
    manifest: bool = True,
    bare: Sequence[Path] = (),
) -> Iterator[OutputSet]:
    """Stage `files`, `directories` and `bare` directories (each replaced whole) and commit them together.

    `command` (e.g. "prefshift evaluate --method naive") names the journal and goes into the
    manifest, so an error about the set can say what to rerun. On an exception or Ctrl-C
    nothing is replaced and the staged copies are removed. `manifest=False` leaves the
    directories as written (the report's figures directory is a `dvc plots` source, where
    a JSON file would be read as data). A `bare` directory never gets one: a model directory must
    hold the model alone, since its bytes are what TRL, OpenRLHF and the registry load and its
    content hash keys caches; the manifests of the set's other directories still list its files.
    """
    root = _absolute(root)
    # Before the lock and the work: no link or device, and a writable disk with room.
    for target, directory in [(f, False) for f in files] + [(d, True) for d in (*directories, *bare)]:
        check_output(_absolute(target), directory)
    with locks.hold(root, [*files, *directories, *bare], command):
        yield from _staged(root, command, files, directories, manifest, bare)


def _staged(
    root: Path,
    command: str,
    files: Sequence[Path],
    directories: Sequence[Path],
    manifest: bool,
    bare: Sequence[Path],
) -> Iterator[OutputSet]:
    finish_interrupted(root)
    journal = root / JOURNALS / f"{re.sub(r'[^A-Za-z0-9_.-]+', '_', command)}.json"
    outputs: list[_Output] = []
    try:
        members = [(f, False, False) for f in files] + [(d, True, False) for d in directories]
        for target, directory, is_bare in members + [(d, True, True) for d in bare]:
            target = _absolute(target)
            target.parent.mkdir(parents=True, exist_ok=True)
            clear_stale(target)
            outputs.append(_Output(scratch.create(target, directory), is_bare))
        writer = OutputSet(root, command, outputs, manifest)
        with output_errors([out.target for out in outputs]):
            yield writer
            for out in outputs:  # again before the commit point: a path may have changed meanwhile
                refuse_unowned(out.target, out.directory)
        locks.private_dir(root)
        writer._commit(journal)
    finally:
        committed = journal.exists()  # once it exists, the staged outputs belong to the roll-forward
        for out in outputs:
            out.scratch.release() if committed else out.scratch.close()


def _apply(root: Path, journal: Path, held: dict[str, scratch.Scratch] | None = None) -> None:
    """Carry out a journal's renames (again: each step is skipped once done), then drop it.

    `held`: this process's own scratch, by the journal's name for it. Any other is used only
    where its record proves prefshift made it for that very target (`scratch.claim`); a journal
    that names anything else (edited, or pointing at a user's directory) touches nothing and is
    refused by name.
    """
    plan = _read_plan(journal)
    for rename in plan["renames"]:
        staged, target = _inside(root, rename["staged"], journal), _inside(root, rename["target"], journal)
        if not os.path.lexists(staged):
            continue  # this rename was done before the kill
        proven = (held or {}).get(rename["staged"]) or scratch.claim(staged, target)
        if proven is None or proven.directory != rename["directory"]:
            raise OutputSetError(
                f"{journal}: names {staged} as the staged copy of {target}, but prefshift's record does not "
                "show it made that directory for it; nothing was renamed or removed. Check both paths, "
                f"then remove {journal}"
            )
        if not proven.finish() and os.path.lexists(proven.work):
            proven.commit()
        proven.discard()
    for target, sha in plan.get("records", {}).items():
        write_json(
            _record_of(root, _inside(root, target, journal)), {"command": plan["command"], "sha256": sha}
        )
    journal.unlink()


def _read_plan(journal: Path) -> dict[str, Any]:
    """A commit journal's plan; one that is not what `_commit` writes is refused by name."""
    try:
        plan = json.loads(journal.read_text(encoding="utf-8"))
        if (
            isinstance(plan["command"], str)
            and all(
                isinstance(r, dict) and {"staged", "target", "directory"} <= r.keys() for r in plan["renames"]
            )
            and isinstance(plan.get("records", {}), dict)
        ):
            return plan
    except (ValueError, KeyError, TypeError, RecursionError):
        pass
    raise OutputSetError(
        f"{journal}: not a commit journal prefshift wrote (unreadable or edited); nothing was renamed or "
        "removed. Remove it, then rerun the stage that wrote the outputs"
    )


def _inside(root: Path, relative: Any, journal: Path) -> Path:
    """A journal's path below the project root; one that leads outside it is refused by name."""
    path = _absolute(root / str(relative))
    if not isinstance(relative, str) or not path.is_relative_to(root) or path == root:
        raise OutputSetError(f"{journal}: names {relative!r}, which is not a path inside {root}; remove it")
    return path


def finish_interrupted(root: str | Path) -> None:
    """Roll forward every commit a kill interrupted: its outputs were complete when it began.

    A journal whose outputs are still locked belongs to a live writer that is committing it now;
    it is left to that writer (two processes renaming one set would race).
    """
    root = _absolute(root)
    for journal in sorted((root / JOURNALS).glob("*.json")):
        try:
            plan = _read_plan(journal)
            with locks.hold(root, [root / r["target"] for r in plan["renames"]], plan["command"]):
                if journal.exists():
                    _apply(root, journal)
        except (locks.LockedError, FileNotFoundError):
            continue


def _walk_files(top: Path) -> list[Path]:
    return sorted(Path(d) / f for d, _, names in os.walk(top) for f in names if f != MANIFEST)


def _relative(path: Path, root: Path) -> str:
    return Path(os.path.relpath(path, root)).as_posix()


def verify(root: str | Path, manifest_path: Path, reads: Sequence[Path], producer: str) -> dict[str, Any]:
    """The manifest, after checking that every file under `reads` is one `producer` wrote with the rest.

    A file missing, added or changed since is refused by name; so is a directory without a
    manifest (assembled by hand, or written before manifests existed).
    """
    root = _absolute(root)
    finish_interrupted(root)
    if not manifest_path.is_file():
        raise OutputSetError(
            f"{manifest_path} not found: {', '.join(map(str, reads))} was not written as one output set "
            f"by `{producer}` (assembled by hand, or by an older prefshift); run `{producer}` again"
        )
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        listed = {_absolute(root / rel): sha for rel, sha in manifest["files"].items()}
    except (json.JSONDecodeError, KeyError, AttributeError, TypeError) as err:
        raise OutputSetError(
            f"{manifest_path}: not a valid output-set manifest ({err}); run `{producer}` again"
        ) from None
    for read in map(_absolute, reads):
        expected = {p: sha for p, sha in listed.items() if p == read or p.is_relative_to(read)}
        present = set(_walk_files(read)) if read.is_dir() else ({read} if read.is_file() else set())
        problem = None
        for path in sorted(present | set(expected)):
            if path not in expected:
                problem = path, "is not part of the set it recorded (copied in, or left by another run)"
            elif path not in present:
                problem = path, "is missing"
            elif file_sha256(path) != expected[path]:
                problem = path, "differs from the file it recorded (changed since, or from another run)"
            if problem:
                raise OutputSetError(
                    f"{problem[0]} {problem[1]}: {manifest_path} lists the files `{manifest['command']}` "
                    f"wrote together, and a stage only reads one such set; run `{producer}` again"
                )
    return manifest


def _record_of(root: Path, target: Path) -> Path:
    """Where the sha256 of a file output is recorded (a file has no directory to hold a manifest)."""
    return root / RECORDS / f"{_relative(_absolute(target), root)}.json"


def _dvc_lock_md5(root: Path, target: Path) -> str | None:
    """The md5 dvc.lock records for `target` as some stage's output (DVC 3 hashing), else None."""
    try:
        lock = yaml.safe_load((root / "dvc.lock").read_text(encoding="utf-8")) or {}
        outs = [out for stage in lock.get("stages", {}).values() for out in stage.get("outs", [])]
    except (OSError, yaml.YAMLError, AttributeError, TypeError):
        return None
    wanted = _relative(_absolute(target), root)
    for out in outs:
        if isinstance(out, dict) and out.get("path") == wanted and out.get("hash") == "md5":
            return out.get("md5")
    return None


def verify_file(root: str | Path, target: Path, producer: str) -> None:
    """Refuse a file output unless its bytes are the ones a run of `producer` wrote.

    Two records can vouch for it: the sha256 this project's output set recorded when it wrote the
    file (`.prefshift/outputs/`, kept out of git like the journals), or the md5 that dvc.lock holds
    for it, which travels with a commit, so a checkout, `dvc exp apply` or a fresh clone verifies
    too. A file edited by hand matches neither and is refused by name.
    """
    root, target = _absolute(root), _absolute(target)
    finish_interrupted(root)
    if not target.is_file():
        raise OutputSetError(f"{target} not found; run `{producer}`")
    try:
        record = json.loads(_record_of(root, target).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        record = {}
    if isinstance(record, dict) and record.get("sha256") == file_sha256(target):
        return
    md5 = _dvc_lock_md5(root, target)
    if md5 is not None and md5 == hashlib.md5(target.read_bytes()).hexdigest():
        return
    raise OutputSetError(
        f"{target} is not the file `{producer}` wrote: neither the sha256 recorded when it was written "
        "nor dvc.lock's md5 matches it (edited by hand, or copied from another run). Run "
        f"`{producer}` (or `dvc repro`) again to get one that can be trusted"
    )
