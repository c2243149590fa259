"""The split protocol (DESIGN §4): deterministic, capped, and disjoint by construction.

Every ordering is by sha256(seed, id), so a split depends only on the seed and the
pairs, never on file order or the platform. The source's train pairs are ordered and
cut into teacher_train (the first `teacher_fraction`) and student_train (the rest),
each then capped. Test splits (id_test, then each target's ood split, in params order)
are ordered, stripped of any pair whose content (prompt + unordered responses) a
training split or an earlier test split already holds, then capped. The result is
checked for overlap by pair_id and by content hash before anything is written.
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
from prefshift.core.paths import Layout
from prefshift.data.schema import Group, Pair, content_hash, pair_content_hash

TRAIN_SPLITS = ("teacher_train", "student_train")
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


def build_splits(
    source_train: list[Pair],
    source_test: list[Pair],
    targets: dict[str, list[Pair]],
    data: DataConfig,
    seed: int,
) -> SplitSet:
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
    blocked = {pair_content_hash(p) for name in TRAIN_SPLITS for p in result.splits[name]}
    tests = [("id_test", data.source, source_test, data.caps.id_test)]
    tests += [(f"ood/{name}", name, pairs, data.caps.ood) for name, pairs in targets.items()]
    for split, dataset, pairs, cap in tests:
        _require(split, pairs, f"no pairs in the test split of {dataset}")
        kept, counts = _unique(seeded_order(pairs, seed), blocked)
        _require(
            split,
            kept,
            f"all {len(pairs)} test pairs of {dataset} repeat content of training or earlier test splits",
        )
        result.splits[split] = capped(kept, cap)
        result.removed[split] = counts
        blocked |= {pair_content_hash(p) for p in result.splits[split]}
    assert_disjoint(result.splits)
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
    """One hash over every split file's hash: the id downstream stages pin to."""
    return content_hash({name: entry["sha256"] for name, entry in sorted(entries.items())})


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def load_manifest(layout: Layout) -> dict[str, Any]:
    path = layout.split_manifest
    if not path.exists():
        raise SplitError(f"{path} not found: run `prefshift split` first")
    return json.loads(path.read_text(encoding="utf-8"))


def check_version(layout: Layout, version: str, what: str) -> None:
    """Refuse `what` (a file made from the splits) when the splits have changed since."""
    current = load_manifest(layout)["version"]
    if version != current:
        raise SplitError(
            f"{what} was built from split version {version}, but {layout.split_manifest} is version "
            f"{current}: rerun the stages after `split` (dvc repro does this)"
        )
