"""`prefshift inputs`: what the pipeline reads from outside the project, as files DVC can see.

params.yaml names local data (`data.sources.NAME.path`: a file, a directory, or a pattern with
`{split}`), local model directories (`backbone.*.name_or_path`, `downstream.policy`,
`downstream.judge`) and hub ids. DVC sees params, not the files they name, so a row added to a
local file would leave every result silently stale. This stage, which DVC runs on every `dvc
repro` (`always_changed: true`), resolves those names and writes, per consuming stage, one JSON
file under data/inputs/: every local file with its MD5, and every hub id with the revision asked
for. The consuming stage depends on its file:

    data/inputs/prepare/<dataset>.json  one dataset prepare reads (source: train and test; a
                                        target: test), so a new target leaves the others' files alone
    data/inputs/backbone.json  backbone.weak and backbone.strong
    data/inputs/policy.json    downstream.policy
    data/inputs/judge.json     downstream.judge

The files hold no time, absolute path or machine detail, so when nothing changed they are
byte-identical and DVC keeps everything downstream cached: a no-op `dvc repro` runs this stage
only. One changed row changes its dataset's file alone, so that dataset's prepare and what
follows re-run and no model is rebuilt. To see what a change would re-run without running it:
`prefshift inputs`, then `dvc status`.

Hashing is streamed (constant memory), and a file whose size, mtime and inode are those recorded
at its last hashing is not read again (DVC keeps the same kind of cache of its own): the stat
cache lives in .dvc/tmp, next to DVC's, and a project without .dvc hashes every time. A path that
does not exist is recorded as missing, not refused: the stage that reads it says what is wrong,
and the record changes when the file appears.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from prefshift.config.params import JUDGE_TRAINED, Params, is_split_pattern
from prefshift.core.atomic import write_json
from prefshift.core.console import messages
from prefshift.core.errors import PrefshiftError
from prefshift.core.paths import Layout

console = messages()
CONSUMERS = ("prepare", "backbone", "policy", "judge")
SKIPPED_DIRS = {".git", ".cache"}
"""Never part of an input: a clone's history and the hub's download cache (backbone copies skip them too)."""
STAT_CACHE_NAME = "prefshift-input-hashes.json"
CHUNK = 1 << 20


def inputs_file(layout: Layout, consumer: str) -> Path:
    return layout.root / "data" / "inputs" / f"{consumer}.json"


def dataset_inputs_file(layout: Layout, dataset: str) -> Path:
    """What `prepare --dataset <dataset>` reads: one file per dataset, the dep of its own stage."""
    return layout.root / "data" / "inputs" / "prepare" / f"{dataset}.json"


class FileHashes:
    """MD5 of files, streamed, remembered by (size, mtime, inode) across runs."""

    def __init__(self, root: Path):
        dvc_dir = root / ".dvc"
        cache_path = dvc_dir / "tmp" / STAT_CACHE_NAME if dvc_dir.is_dir() else None
        self.cache_path = cache_path
        self.known: dict[str, dict[str, Any]] = {}
        if cache_path is not None and cache_path.is_file():
            try:
                self.known = json.loads(cache_path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                self.known = {}  # a damaged cache only costs a re-hash
        self.used: dict[str, dict[str, Any]] = {}

    def md5(self, path: Path) -> str:
        key = str(path.resolve())
        stat = path.stat()
        signature = [stat.st_size, stat.st_mtime_ns, stat.st_ino]
        entry = self.known.get(key)
        if entry is None or entry.get("stat") != signature:
            digest = hashlib.md5()
            try:
                with path.open("rb") as handle:
                    while chunk := handle.read(CHUNK):
                        digest.update(chunk)
            except OSError as err:
                raise PrefshiftError(f"{path}: cannot read it to version it ({err.strerror})") from None
            entry = {"stat": signature, "md5": digest.hexdigest()}
        self.used[key] = entry
        return entry["md5"]

    def save(self) -> None:
        """Keep the entries of this run's files only, so the cache never outgrows the inputs."""
        if self.cache_path is not None:
            self.cache_path.parent.mkdir(exist_ok=True)
            write_json(self.cache_path, self.used)


Hashes = FileHashes | None
"""How `records` hashes local files; None lists them and reads none (`local_paths`)."""


def local_files(path: Path) -> list[Path]:
    """The files a local input consists of: itself, or every file under it (sorted)."""
    if path.is_file():
        return [path]
    return sorted(
        p
        for p in path.rglob("*")
        if p.is_file() and not SKIPPED_DIRS.intersection(p.relative_to(path).parts[:-1])
    )


def local_record(path: Path, hashes: Hashes, shown: str | None = None) -> dict[str, Any]:
    """{path, files: {relative name: md5}}, or {path, missing: true}; `path` as params spell it
    (`shown`), so the record does not depend on who runs it or where the project lies."""
    shown = str(path) if shown is None else shown
    if not path.exists():
        return {"path": shown, "missing": True}
    if not (path.is_file() or path.is_dir()):  # a FIFO or a device: never opened (reading could block)
        return {"path": shown, "not_a_file_or_directory": True}
    files = local_files(path)
    names = [p.name if p == path else p.relative_to(path).as_posix() for p in files]
    md5 = hashes.md5 if hashes else lambda path: ""
    return {"path": shown, "files": {name: md5(p) for name, p in zip(names, files, strict=True)}}


def dataset_record(name: str, splits: Iterable[str], params: Params, hashes: Hashes) -> dict[str, Any]:
    """One dataset prepare reads: its local files per split, or its hub id and revision, and its
    `data.sources` row (its stage depends on this file, not on data.sources as a whole)."""
    source = params.data.sources.get(name)
    files = _dataset_files(name, splits, params, hashes)
    return files if source is None else {"params": source.model_dump(mode="json"), **files}


def _dataset_files(name: str, splits: Iterable[str], params: Params, hashes: Hashes) -> dict[str, Any]:
    from prefshift.data.adapters import get_adapter

    adapter = get_adapter(name, params)
    source = params.data.sources.get(name)
    if source is not None and source.path:
        # Read as prefshift.data.adapters.base.split_files reads it; params were checked to hold no
        # field but {split} when they were loaded.
        if is_split_pattern(source.path):
            return {
                "splits": {
                    split: local_record(Path(source.path.format(split=adapter.splits[split])), hashes)
                    for split in splits
                    if split in adapter.splits
                }
            }
        return local_record(Path(source.path), hashes)
    hf_id = (source and source.hf_id) or adapter.hf_id
    if hf_id is None:
        return {"generated": "from params"}  # the synthetic suite: params are its only input
    return {
        "hub": hf_id,
        "config": (source and source.hf_config) or adapter.hf_config,
        "revision": source.revision if source else None,
    }


def model_record(name_or_path: str | None, revision: str | None, hashes: Hashes) -> dict[str, Any]:
    """A model a stage loads: a local directory's files, or a hub id and the revision asked for."""
    from prefshift.models.validate import looks_local

    if name_or_path is None:
        return {"model": None}
    if looks_local(name_or_path):
        return local_record(Path(name_or_path).expanduser(), hashes, shown=name_or_path)
    return {"hub": name_or_path, "revision": revision}


def records(params: Params, hashes: Hashes) -> dict[str, dict[str, Any]]:
    data, downstream = params.data, params.downstream
    datasets = {data.source: ("train", "test"), **{target: ("test",) for target in data.targets}}
    judge = None if downstream.judge == JUDGE_TRAINED else downstream.judge
    return {
        "prepare": {name: dataset_record(name, splits, params, hashes) for name, splits in datasets.items()},
        "backbone": {
            which: model_record(spec.name_or_path, spec.revision, hashes)
            for which, spec in (("weak", params.backbone.weak), ("strong", params.backbone.strong))
            if spec.name_or_path != "tiny"
        },
        "policy": {"policy": model_record(downstream.policy, downstream.policy_revision, hashes)},
        "judge": {"judge": model_record(judge, downstream.judge_revision, hashes)},
    }


def local_paths(params: Params) -> list[str]:
    """Every local file or folder params name for the pipeline to read, as params spell it: what
    `records` hashes, listed without reading a byte (a sweep checks its clones will have them)."""
    return sorted({record["path"] for record in _locals(records(params, None)) if "path" in record})


def run(params: Params, layout: Layout) -> dict[str, dict[str, Any]]:
    hashes = FileHashes(layout.root)
    found = records(params, hashes)
    for consumer in CONSUMERS:
        if consumer == "prepare":
            for dataset, record in found[consumer].items():
                write_json(dataset_inputs_file(layout, dataset), record)
        else:
            write_json(inputs_file(layout, consumer), found[consumer])
    hashes.save()
    _report(found)
    return found


def _report(found: dict[str, dict[str, Any]]) -> None:
    files = sum(len(r.get("files", {})) for r in _locals(found))
    missing = [r["path"] for r in _locals(found) if r.get("missing")]
    unpinned = sorted(
        r["hub"] for block in found.values() for r in block.values() if "hub" in r and not r.get("revision")
    )
    console.print(f"inputs: {files} local file(s) versioned under data/inputs/")
    if missing:
        console.print(f"inputs: not found (the stage that reads them will say so): {', '.join(missing)}")
    if unpinned:
        console.print(
            f"inputs: hub ids without a pinned revision (a new upload changes results unseen): "
            f"{', '.join(unpinned)}; pin them with .revision / *_revision in params.yaml"
        )


def _locals(found: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for block in found.values():
        for record in block.values():
            out.extend(record.get("splits", {}).values() if "splits" in record else [record])
    return out
