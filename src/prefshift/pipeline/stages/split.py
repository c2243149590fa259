"""`prefshift split`: data/pairs → data/splits, one dataset at a time.

`prefshift split --dataset <source>` cuts the source's pairs into teacher_train, student_train and
id_test (data/splits/source/); `prefshift split --dataset <target>` builds that target's ood split
against them (data/splits/ood/<target>/). DVC runs each as its own stage, so adding or dropping a
target splits that target alone and every other split keeps its bytes. Without `--dataset`, the
source and then every target (a convenience outside DVC).

Each directory is written in one atomic swap with its manifest: every file's sha256 and its own
version (`splits.split_version`), and a `version` over them. Later stages record the versions of
the splits they read and refuse a split that changed since (`splits.check_split_version`). Split
refuses a dataset's pairs that one `prepare` run did not write (`output_set.verify`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from prefshift.config.params import ConfigError, Params
from prefshift.core import locks
from prefshift.core.atomic import atomic_path, write_json
from prefshift.core.paths import SOURCE_SPLITS, Layout
from prefshift.data.schema import Pair, read_groups, read_pairs, write_groups, write_pairs
from prefshift.data.splits import (
    SplitError,
    SplitSet,
    build_source_splits,
    build_target_split,
    cap_groups,
    file_sha256,
    load_manifest,
    manifest_version,
    split_version,
)
from prefshift.pipeline.output_set import manifest_of, verify


def _pairs(layout: Layout, dataset: str, split: str) -> list[Pair]:
    path = layout.pairs(dataset, split)
    if not path.exists():
        raise SplitError(
            f"{path} not found: run `prefshift prepare --dataset {dataset}` with the same data params first"
        )
    return read_pairs(path)


def _write(
    directory: Path, tmp: Path, target: Path, items: list[Any], writer: Callable[..., None], root: Path
):
    """Write into the temporary twin of `directory`; the entry names the final path."""
    staged = tmp / target.relative_to(directory)
    writer(staged, items)
    sha = file_sha256(staged)
    return {
        "path": target.relative_to(root).as_posix(),
        "count": len(items),
        "sha256": sha,
        "version": split_version(sha),
    }


def _write_set(
    params: Params, layout: Layout, dataset: str, directory: Path, built: SplitSet, extra: dict[str, Any]
) -> dict[str, Any]:
    """One dataset's split files, its capped groups and its manifest, swapped in together."""
    entries: dict[str, dict[str, Any]] = {}
    with (
        locks.hold(layout.root, [directory], f"prefshift split --dataset {dataset}"),
        atomic_path(directory, directory=True) as tmp,
    ):
        for name, pairs in built.splits.items():
            path = layout.split(name.removeprefix("ood/"))
            entries[name] = _write(directory, tmp, path, pairs, write_pairs, layout.root)
        groups_path = layout.pair_groups(dataset)
        if groups_path.exists():
            groups = cap_groups(read_groups(groups_path), params.data.caps.groups, params.seed)
            target = layout.split_groups(dataset, params.data.source)
            entries[f"groups/{dataset}"] = _write(directory, tmp, target, groups, write_groups, layout.root)
        manifest = {
            "version": manifest_version(entries),
            "splits": entries,
            "removed": built.removed,
            "params": {"seed": params.seed, "caps_groups": params.data.caps.groups, **extra},
        }
        write_json(tmp / "manifest.json", manifest)
    _summary(dataset, manifest)
    return manifest


def verify_pairs(layout: Layout, dataset: str) -> None:
    directory = layout.dataset_pairs_dir(dataset)
    if directory.exists():
        verify(layout.root, manifest_of(directory), [directory], f"prefshift prepare --dataset {dataset}")


def split_source(params: Params, layout: Layout) -> dict[str, Any]:
    data = params.data
    verify_pairs(layout, data.source)  # before reading: a file missing from its set is named as such
    built = build_source_splits(
        _pairs(layout, data.source, "train"), _pairs(layout, data.source, "test"), data, params.seed
    )
    caps = {name: getattr(data.caps, name) for name in SOURCE_SPLITS}
    extra = {"source": data.source, "teacher_fraction": data.teacher_fraction, "caps": caps}
    return _write_set(params, layout, data.source, layout.source_splits_dir, built, extra)


def split_target(params: Params, layout: Layout, target: str) -> dict[str, Any]:
    verify_pairs(layout, target)
    source_version = str(load_manifest(layout)["version"])
    source = {name: read_pairs(layout.split(name)) for name in SOURCE_SPLITS}
    built = build_target_split(
        target, _pairs(layout, target, "test"), source, params.data.caps.ood, params.seed
    )
    extra = {"target": target, "cap": params.data.caps.ood, "source_version": source_version}
    return _write_set(params, layout, target, layout.target_split_dir(target), built, extra)


def run(params: Params, layout: Layout, dataset: str | None = None) -> dict[str, Any]:
    """Split `dataset` (the source or a listed target), or the source and then every target."""
    data = params.data
    if dataset is None:
        manifests = {data.source: split_source(params, layout)}
        return manifests | {t: split_target(params, layout, t) for t in data.targets}
    if dataset == data.source:
        return {dataset: split_source(params, layout)}
    if dataset in data.targets:
        return {dataset: split_target(params, layout, dataset)}
    raise ConfigError(
        f"--dataset {dataset}: neither data.source ({data.source}) nor one of data.targets "
        f"({', '.join(data.targets)})"
    )


def _summary(dataset: str, manifest: dict[str, Any]) -> None:
    table = Table(title=f"{dataset} splits (version {manifest['version']})")
    for column in ("split", "pairs / groups", "version", "removed as overlap", "removed as duplicate"):
        table.add_column(column)
    for name, entry in manifest["splits"].items():
        removed = manifest["removed"].get(name, {})
        table.add_row(
            name,
            str(entry["count"]),
            entry["version"],
            str(removed.get("overlap", "")),
            str(removed.get("duplicate", "")),
        )
    if "source_train" in manifest["removed"]:
        table.caption = f"source train duplicates dropped: {manifest['removed']['source_train']['duplicate']}"
    Console().print(table)
