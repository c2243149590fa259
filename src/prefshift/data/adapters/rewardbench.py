"""RewardBench (allenai/reward-bench, split `filtered`, 2,985 rows): one pair per row.

Columns `prompt` (a single-turn string), `chosen`, `chosen_model`, `rejected`,
`rejected_model`, `subset`, `id` (dataset card). Each section of the benchmark is a
target: `rewardbench_chat`, `rewardbench_chat_hard`, `rewardbench_reasoning` (helpful) and
`rewardbench_safety` (harmless); a row belongs to the section that lists its subset
(prefshift.data.benchmark_tables.REWARDBENCH_SECTIONS). The subset stays in the pair's meta, which
is what the official section score (strict wins, per-subset accuracies weighted by the
benchmark's example counts) is computed from.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from prefshift.config.params import Params
from prefshift.data.adapters.base import value
from prefshift.data.adapters.benchmark import BenchmarkAdapter, user_prompt
from prefshift.data.benchmark_tables import REWARDBENCH_SECTIONS
from prefshift.data.schema import Pair, make_pair

HARMLESS_SECTIONS = ("Safety",)


@dataclass(frozen=True)
class RewardBenchAdapter(BenchmarkAdapter):
    def to_pair(self, row: dict[str, Any], where: str, params: Params) -> Pair:
        return make_pair(
            dataset=self.name,
            category=self.category,
            prompt=user_prompt(row, where),
            chosen=value(row, "chosen", where),
            rejected=value(row, "rejected", where),
            meta={
                "subset": row["subset"],
                "id": row.get("id"),
                "chosen_model": row.get("chosen_model"),
                "rejected_model": row.get("rejected_model"),
            },
            where=where,
        )


def _adapter(section: str) -> RewardBenchAdapter:
    name = "rewardbench_" + section.lower().replace(" ", "_")
    return RewardBenchAdapter(
        name=name,
        category="harmless" if section in HARMLESS_SECTIONS else "helpful",
        hf_id="allenai/reward-bench",
        splits={"test": "filtered"},
        columns=("prompt", "chosen", "rejected", "subset"),
        benchmark="rewardbench",
        section=section,
        members=REWARDBENCH_SECTIONS[section],
        needs=(
            "hub allenai/reward-bench (split filtered; test only), or data.sources.NAME.path: its "
            "filtered-*.parquet file (or a directory holding it); one target per section"
        ),
    )


REWARDBENCH_ADAPTERS = tuple(_adapter(section) for section in REWARDBENCH_SECTIONS)
