"""`prefshift split`: data/pairs → data/splits (teacher/student train, id_test, ood, groups).

The whole data/splits directory is written in one atomic swap, so a stale ood file of a
former target can never sit next to a fresh manifest. The manifest records each file's
sha256 and a `version` over them; later stages store that version with their outputs
and refuse to mix outputs of different split versions (`splits.check_version`). Split
itself refuses a data/pairs tree that one `prepare` run did not write (`output_set.verify`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from prefshift.config.params import Params
from prefshift.core import locks
from prefshift.core.atomic import atomic_path, write_json
from prefshift.core.paths import Layout
from prefshift.data.schema import Pair, read_groups, read_pairs, write_groups, write_pairs
from prefshift.data.splits import SplitError, build_splits, cap_groups, file_sha256, manifest_version
from prefshift.pipeline.output_set import manifest_of, verify


def _pairs(layout: Layout, dataset: str, split: str) -> list[Pair]:
    path = layout.pairs(dataset, split)
    if not path.exists():
        raise SplitError(f"{path} not found: run `prefshift prepare` with the same data params first")
    return read_pairs(path)


def _split_path(layout: Layout, name: str) -> Path:
    return layout.split(name.removeprefix("ood/"))


def _write(
    layout: Layout, tmp: Path, target: Path, items: list[Any], writer: Callable[..., None]
) -> dict[str, Any]:
    """Write into the temporary twin of data/splits; the entry names the final path."""
    staged = tmp / target.relative_to(layout.splits_dir)
    writer(staged, items)
    path = target.relative_to(layout.root).as_posix()
    return {"path": path, "count": len(items), "sha256": file_sha256(staged)}


def run(params: Params, layout: Layout) -> None:
    data = params.data
    if layout.pairs_dir.exists():
        verify(layout.root, manifest_of(layout.pairs_dir), [layout.pairs_dir], "prefshift prepare")
    built = build_splits(
        _pairs(layout, data.source, "train"),
        _pairs(layout, data.source, "test"),
        {target: _pairs(layout, target, "test") for target in data.targets},
        data,
        params.seed,
    )
    entries: dict[str, dict[str, Any]] = {}
    with (
        locks.hold(layout.root, [layout.splits_dir], "prefshift split"),
        atomic_path(layout.splits_dir, directory=True) as tmp,
    ):
        for name, pairs in built.splits.items():
            entries[name] = _write(layout, tmp, _split_path(layout, name), pairs, write_pairs)
        for dataset in (data.source, *data.targets):
            source = layout.pair_groups(dataset)
            if source.exists():
                groups = cap_groups(read_groups(source), data.caps.groups, params.seed)
                target = layout.split_groups(dataset)
                entries[f"groups/{dataset}"] = _write(layout, tmp, target, groups, write_groups)
        manifest = {
            "version": manifest_version(entries),
            "splits": entries,
            "removed": built.removed,
            "params": {
                "seed": params.seed,
                "source": data.source,
                "targets": list(data.targets),
                "teacher_fraction": data.teacher_fraction,
                "caps": data.caps.model_dump(),
            },
        }
        write_json(tmp / layout.split_manifest.relative_to(layout.splits_dir), manifest)
    _summary(manifest)


def _summary(manifest: dict[str, Any]) -> None:
    table = Table(title=f"splits (version {manifest['version']})")
    for column in ("split", "pairs / groups", "removed as overlap", "removed as duplicate"):
        table.add_column(column)
    for name, entry in manifest["splits"].items():
        removed = manifest["removed"].get(name, {})
        table.add_row(
            name, str(entry["count"]), str(removed.get("overlap", "")), str(removed.get("duplicate", ""))
        )
    table.caption = f"source train duplicates dropped: {manifest['removed']['source_train']['duplicate']}"
    Console().print(table)
