"""The split protocol (DESIGN §4): deterministic, capped, and disjoint by construction.

Every ordering is by sha256(seed, id), so a split depends only on the seed and the
pairs, never on file order or the platform. The source's train pairs are ordered and
cut into teacher_train (the first `teacher_fraction`) and student_train (the rest),
each then capped. id_test is ordered, stripped of any pair whose content (prompt +
unordered responses) a training split holds, then capped. Each target's ood split is
built the same way against the source's three splits alone, never against another
target: targets are benchmarks no model trains on, so a target may be added or dropped
without changing a byte of any other split (`build_target_split`). The result is
checked for overlap by pair_id and by content hash before anything is written.

Versions. Every split file carries its own content version (`split_version`, from its
sha256). The source's three splits (and its groups) are written together and their
manifest's `version` covers them: what every model is trained and ID-tested on. A target's
split has its own manifest and version, so a model can be scored on a target that did not
exist when it was trained.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from prefshift.config.params import DataConfig
from prefshift.core.errors import PrefshiftError
from prefshift.core.paths import SOURCE_SPLITS, Layout
from prefshift.data.schema import Group, Pair, content_hash, pair_content_hash

T = TypeVar("T", Pair, Group)


class SplitError(PrefshiftError):
    """A split that would be empty or would overlap another."""


def order_key(seed: int, item_id: str) -> str:
    return hashlib.sha256(f"{seed}:{item_id}".encode()).hexdigest()


def seeded_order(items: Sequence[T], seed: int) -> list[T]:
    """Items in the seed's fixed pseudo-random order (ties impossible: ids are unique)."""

    def item_id(item: T) -> str:
        return item.pair_id if isinstance(item, Pair) else item.group_id

    return sorted(items, key=lambda item: order_key(seed, item_id(item)))


def capped(items: list[T], cap: int | None) -> list[T]:
    return items if cap is None else items[:cap]


@dataclass
class SplitSet:
    """The built splits, by name (`ood/<target>` for targets), and what was removed where."""

    splits: dict[str, list[Pair]] = field(default_factory=dict)
    removed: dict[str, dict[str, int]] = field(default_factory=dict)


def _unique(pairs: list[Pair], blocked: set[str]) -> tuple[list[Pair], dict[str, int]]:
    """Pairs whose content is neither blocked nor repeated; counts of what was dropped."""
    kept, counts, seen = [], {"overlap": 0, "duplicate": 0}, set()
    for pair in pairs:
        content = pair_content_hash(pair)
        if content in blocked:
            counts["overlap"] += 1
        elif content in seen:
            counts["duplicate"] += 1
        else:
            seen.add(content)
            kept.append(pair)
    return kept, counts


def _require(name: str, pairs: list[Pair], why: str) -> None:
    if not pairs:
        raise SplitError(f"split {name} is empty: {why}")


def build_source_splits(
    source_train: list[Pair], source_test: list[Pair], data: DataConfig, seed: int
) -> SplitSet:
    """teacher_train, student_train and id_test from the source's pairs."""
    result = SplitSet()
    _require("teacher_train", source_train, f"no pairs in the train split of {data.source}")
    train, counts = _unique(seeded_order(source_train, seed), set())
    n_teacher = round(len(train) * data.teacher_fraction)
    parts = {"teacher_train": train[:n_teacher], "student_train": train[n_teacher:]}
    for name, pairs in parts.items():
        _require(
            name,
            pairs,
            f"data.teacher_fraction={data.teacher_fraction} of {len(train)} train pairs leaves it nothing",
        )
        result.splits[name] = capped(pairs, getattr(data.caps, name))
    result.removed["source_train"] = counts
    _add_test(
        result, "id_test", data.source, source_test, data.caps.id_test, blocked_content(result.splits), seed
    )
    assert_disjoint(result.splits)
    return result


def blocked_content(source: dict[str, list[Pair]]) -> set[str]:
    """Content hashes no test split may repeat: those of the source's splits given."""
    return {pair_content_hash(p) for pairs in source.values() for p in pairs}


def build_target_split(
    target: str, pairs: list[Pair], source: dict[str, list[Pair]], cap: int | None, seed: int
) -> SplitSet:
    """One target's ood split, from its test pairs and the source's splits alone (see module doc)."""
    result = SplitSet()
    _add_test(result, f"ood/{target}", target, pairs, cap, blocked_content(source), seed)
    assert_disjoint({**source, **result.splits})
    return result


def _add_test(
    result: SplitSet,
    split: str,
    dataset: str,
    pairs: list[Pair],
    cap: int | None,
    blocked: set[str],
    seed: int,
) -> None:
    _require(split, pairs, f"no pairs in the test split of {dataset}")
    kept, counts = _unique(seeded_order(pairs, seed), blocked)
    _require(split, kept, f"all {len(pairs)} test pairs of {dataset} repeat content of the source's splits")
    result.splits[split] = capped(kept, cap)
    result.removed[split] = counts


def build_splits(
    source_train: list[Pair],
    source_test: list[Pair],
    targets: dict[str, list[Pair]],
    data: DataConfig,
    seed: int,
) -> SplitSet:
    """The whole protocol in one call: the source's splits, then each target's against them."""
    result = build_source_splits(source_train, source_test, data, seed)
    source = dict(result.splits)
    for name, pairs in targets.items():
        one = build_target_split(name, pairs, source, data.caps.ood, seed)
        result.splits.update(one.splits)
        result.removed.update(one.removed)
    return result


def assert_disjoint(splits: dict[str, list[Pair]]) -> None:
    """Raise if any two splits share a pair_id or a content hash (or one repeats inside itself)."""
    for what, key in (("pair_id", lambda p: p.pair_id), ("content", pair_content_hash)):
        owner: dict[str, str] = {}
        for name, pairs in splits.items():
            for pair in pairs:
                value = key(pair)
                if value in owner:
                    where = f"split {name} twice" if owner[value] == name else f"{owner[value]} and {name}"
                    raise SplitError(f"{what} {value} is in {where}")
                owner[value] = name


def noisy_pairs(pair_ids: Sequence[str], share: float, seed: int) -> set[str]:
    """Exactly round(share · n) of `pair_ids`, drawn by the seed (`data.teacher_noise`).

    The order is one of its own (sha256 of the seed and "teacher-noise:" + the id, not the split's
    order), so the same seed picks the same pairs wherever they are scored, and which pairs are
    picked follows nothing in their text.
    """
    ranked = sorted(pair_ids, key=lambda pair_id: order_key(seed, f"teacher-noise:{pair_id}"))
    return set(ranked[: round(share * len(ranked))])


def cap_groups(groups: list[Group], cap: int | None, seed: int) -> list[Group]:
    return capped(seeded_order(groups, seed), cap)


def manifest_version(entries: dict[str, dict[str, Any]]) -> str:
    """One hash over the hashes of the split files a manifest lists: the id stages pin to."""
    return content_hash({name: entry["sha256"] for name, entry in sorted(entries.items())})


def split_version(sha256: str) -> str:
    """One split file's own version (recorded in its manifest entry)."""
    return sha256[:16]


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _read_manifest(path: Path, what_to_run: str) -> dict[str, Any]:
    if not path.exists():
        raise SplitError(f"{path} not found: run `{what_to_run}` first")
    return json.loads(path.read_text(encoding="utf-8"))


def load_manifest(layout: Layout) -> dict[str, Any]:
    """The source splits' manifest: `version` is what every model is trained and ID-tested on."""
    return _read_manifest(layout.split_manifest, "prefshift split")


def load_target_manifest(layout: Layout, target: str) -> dict[str, Any]:
    return _read_manifest(layout.target_manifest(target), f"prefshift split --dataset {target}")


def split_entries(layout: Layout, targets: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Every split's manifest entry (path, count, sha256, version): the source's and each target's.
    Only the targets asked for: a dropped target's files may linger, and are no part of the data."""
    entries = dict(load_manifest(layout)["splits"])
    for target in targets:
        entries.update(load_target_manifest(layout, target)["splits"])
    return entries


def entry_key(split: str) -> str:
    """A split's name in its manifest: `id_test`, `ood/<target>`; `groups/<dataset>` as given."""
    return split if split in SOURCE_SPLITS or split.startswith(("ood/", "groups/")) else f"ood/{split}"


def current_version(layout: Layout, split: str) -> str:
    """The content version of one split (`id_test`, a target, `groups/<dataset>`) as its manifest
    records it now: the source's manifest, or the target's own."""
    key = entry_key(split)
    entries = load_manifest(layout)["splits"]
    if key not in entries and key not in SOURCE_SPLITS:
        entries = load_target_manifest(layout, key.split("/", 1)[1])["splits"]
    if key not in entries:
        raise SplitError(f"split {key!r} is not in its manifest; run `dvc repro` (or `prefshift split`)")
    return str(entries[key]["version"])


def check_split_version(layout: Layout, split: str, version: str, what: str) -> None:
    """Refuse `what` (made from one split) when that split has changed since; no other split counts."""
    _refuse_if_stale(what, version, current_version(layout, split), f"split {split!r}")


def set_version(layout: Layout, split: str) -> str:
    """The version of the split set that holds `split`: the source's manifest for id_test (and the
    other source splits), a target's own manifest for its ood split. What a file built from one
    split alone (best-of-n's samples, say) is stamped with, so another target's change never
    makes it stale."""
    if split in SOURCE_SPLITS:
        return str(load_manifest(layout)["version"])
    return str(load_target_manifest(layout, split.removeprefix("ood/"))["version"])


def check_set_version(layout: Layout, split: str, version: str, what: str) -> None:
    """Refuse `what` (stamped with `set_version` of `split`) when that split's set has changed since."""
    _refuse_if_stale(what, version, set_version(layout, split), f"{split!r}'s splits")


def check_version(layout: Layout, version: str, what: str) -> None:
    """Refuse `what` (a file made from the source's splits) when they have changed since."""
    _refuse_if_stale(what, version, str(load_manifest(layout)["version"]), str(layout.split_manifest))


def _refuse_if_stale(what: str, version: str, current: str, made_of: str) -> None:
    """The one refusal of a file built from splits that have changed since: what, from what, the fix."""
    if version != current:
        raise SplitError(
            f"{what} was built from split version {version} of {made_of}, now version {current}: "
            "rerun the stages after `split` (dvc repro does this)"
        )
