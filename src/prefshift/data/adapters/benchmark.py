"""What the three reward-model benchmarks' adapters share: one target per benchmark section.

A benchmark is read whole (hub or local copy, like any source) and each of its sections is
its own dataset name, e.g. `rewardbench_chat_hard`: that adapter yields only the rows whose
subset (or domain) belongs to the section, so a section is a target like any other and takes
the section's category (Safety → harmless, the rest → helpful). Aliases work as for every
built-in (`data.sources.NAME.adapter: rewardbench_chat`), and so does
`data.sources.rewardbench_chat.path` for a local copy in the benchmark's own format.

The adapter knows its benchmark and section, so evaluation can score the target by the
benchmark's own rule (prefshift.science.benchmarks) next to the usual pairwise accuracy. As for
every source, a pair repeating the content of an earlier one is skipped and counted
(`duplicate`), and the split stage drops pairs whose content a training split holds, so a
section can score a few pairs fewer than the hub file has; skips.json says how many.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from prefshift.config.params import Params
from prefshift.data.adapters.base import Adapter, Record, source_rows, value
from prefshift.data.schema import Group, Pair, RowError, content_hash, make_pair


@dataclass(frozen=True)
class BenchmarkAdapter(Adapter):
    """One section of a benchmark: `members` are the values of `member_column` it keeps."""

    benchmark: str = ""
    section: str = ""
    members: tuple[str, ...] = ()
    member_column: str = "subset"

    def rows(self, split: str, params: Params) -> Iterator[Record]:
        for where, row in source_rows(self, split, params):
            if row.get(self.member_column) in self.members:
                yield where, row


def user_prompt(row: dict[str, Any], where: str) -> list[dict[str, str]]:
    """The benchmarks' prompts are single-turn strings: one user message."""
    prompt = value(row, "prompt", where)
    if not isinstance(prompt, str):
        raise RowError("bad_prompt", f"{where}: field 'prompt' must be a string, got {type(prompt).__name__}")
    return [{"role": "user", "content": prompt}]


def responses(row: dict[str, Any], key: str, where: str, size: int | None = None) -> list[str]:
    """A list-of-strings field (the chosen or rejected responses), of `size` items when given."""
    found = value(row, key, where)
    if not isinstance(found, (list, tuple)) or not all(isinstance(r, str) for r in found):
        raise RowError("bad_format", f"{where}: field {key!r} must be a list of strings")
    if not found or (size is not None and len(found) != size):
        want = f"{size}" if size is not None else "at least one"
        raise RowError("bad_format", f"{where}: field {key!r} has {len(found)} responses, expected {want}")
    if any(not r.strip() for r in found):
        raise RowError("empty_response", f"{where}: field {key!r} holds an empty response")
    return list(found)


def all_pairs(
    adapter: BenchmarkAdapter,
    prompt: list[dict[str, str]],
    chosen: list[str],
    rejected: list[str],
    meta: dict[str, Any],
    where: str,
) -> list[Pair]:
    """Every chosen response against every rejected one, for prefshift's usual pairwise accuracy."""
    return [
        make_pair(
            dataset=adapter.name,
            category=adapter.category,
            prompt=prompt,
            chosen=good,
            rejected=bad,
            meta={**meta, "chosen_index": i, "rejected_index": j},
            where=where,
        )
        for i, good in enumerate(chosen)
        for j, bad in enumerate(rejected)
    ]


def ranked_group(
    adapter: BenchmarkAdapter,
    prompt: list[dict[str, str]],
    chosen: list[str],
    rejected: list[str],
    meta: dict[str, Any],
) -> Group:
    """The chosen responses first (gold score 1), then the rejected (0): the order the rules rely on."""
    texts = [*chosen, *rejected]
    scores = [1.0] * len(chosen) + [0.0] * len(rejected)
    group_id = content_hash(adapter.name, prompt, texts, meta.get("id"))
    return Group(
        group_id, adapter.name, adapter.category, prompt, texts, scores, {**meta, "num_correct": len(chosen)}
    )
