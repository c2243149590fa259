"""RewardBench 2 (allenai/reward-bench-2, split `test`, 1,865 rows): best-of-4 groups.

Columns `id`, `prompt` (string), `chosen` and `rejected` (lists of responses),
`num_correct`, `num_incorrect`, `total_completions`, `models`, `subset`,
`additional_metadata` (dataset card). Each of the six subsets is a target:
`rewardbench2_factuality`, `_precise_if`, `_math`, `_focus`, `_ties` (helpful) and
`rewardbench2_safety` (harmless).

A row becomes one group, chosen responses first (what the official rules read: the first
response is the chosen one for best-of-4; the first `num_correct` are the correct ones
for Ties), so the official score is computed per example, never from independent pairs.
The same row also yields every chosen × rejected pair, which is only for prefshift's usual
pairwise accuracy. A Ties row's `id` must read `ref:<n>` or `tied:<n>` (the official Ties
rule pairs the two examples of prompt n); any other is skipped as `bad_ties_id`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from prefshift.config.params import Params
from prefshift.data.adapters.base import value
from prefshift.data.adapters.benchmark import (
    BenchmarkAdapter,
    all_pairs,
    ranked_group,
    responses,
    user_prompt,
)
from prefshift.data.benchmark_tables import REWARDBENCH2_SUBSETS, TIES
from prefshift.data.schema import Group, Pair, RowError

HARMLESS_SUBSETS = ("Safety",)


def ties_id(row_id: Any, where: str) -> tuple[str, int]:
    """(`ref` | `tied`, prompt number) of a Ties row's id."""
    kind, _, number = str(row_id).partition(":")
    if kind not in ("ref", "tied") or not number.isdigit():
        raise RowError("bad_ties_id", f"{where}: Ties id must be ref:<n> or tied:<n>, got {row_id!r}")
    return kind, int(number)


@dataclass(frozen=True)
class RewardBench2Adapter(BenchmarkAdapter):
    def _parts(self, row: dict[str, Any], where: str) -> tuple[list, list[str], list[str], dict[str, Any]]:
        prompt = user_prompt(row, where)
        chosen, rejected = responses(row, "chosen", where), responses(row, "rejected", where)
        row_id = value(row, "id", where)
        meta: dict[str, Any] = {"subset": row["subset"], "id": str(row_id)}
        if row["subset"] == TIES:
            kind, number = ties_id(row_id, where)
            meta.update(ties_kind=kind, ties_prompt=number)
        return prompt, chosen, rejected, meta

    def to_pairs(self, row: dict[str, Any], where: str, params: Params) -> list[Pair]:
        prompt, chosen, rejected, meta = self._parts(row, where)
        return all_pairs(self, prompt, chosen, rejected, meta, where)

    def load_groups(self, params: Params) -> list[Group]:
        return list(self._groups(params))

    def _groups(self, params: Params) -> Iterator[Group]:
        for where, row in self.rows("test", params):
            try:
                prompt, chosen, rejected, meta = self._parts(row, where)
            except RowError:
                continue
            yield ranked_group(self, prompt, chosen, rejected, meta)


def _adapter(subset: str) -> RewardBench2Adapter:
    return RewardBench2Adapter(
        name="rewardbench2_" + subset.lower().replace(" ", "_"),
        category="harmless" if subset in HARMLESS_SUBSETS else "helpful",
        hf_id="allenai/reward-bench-2",
        splits={"test": "test"},
        columns=("id", "prompt", "chosen", "rejected", "subset"),
        benchmark="rewardbench2",
        section=subset,
        members=(subset,),
        needs=(
            "hub allenai/reward-bench-2 (split test; test only), or data.sources.NAME.path: its "
            "test-*.parquet file (or a directory holding it); one target per subset; yields groups"
        ),
    )


REWARDBENCH2_ADAPTERS = tuple(_adapter(subset) for subset in REWARDBENCH2_SUBSETS)
