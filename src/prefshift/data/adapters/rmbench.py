"""RM-Bench (THU-KEG/RM-Bench, one JSON file `total_dataset.json`; the hub serves it as split `train`).

Each record has `id`, `prompt` (string), `chosen` and `rejected` (three responses each, in
the styles concise, detailed plain, detailed markdown) and `domain` (chat, code, math,
safety-refuse, safety-response), per the repository's README. Targets: `rmbench_chat`,
`rmbench_code`, `rmbench_math` (helpful) and `rmbench_safety` (harmless: both safety
domains). A record becomes one group of six responses (the three chosen, then the three
rejected, in style order) for the official 3x3 hard/normal/easy rule, and its nine
chosen × rejected pairs for prefshift's usual pairwise accuracy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from prefshift.benchmarks import RMBENCH_DOMAINS, RMBENCH_STYLES
from prefshift.config import Params
from prefshift.data.adapters.benchmark import (
    BenchmarkAdapter,
    all_pairs,
    ranked_group,
    responses,
    user_prompt,
)
from prefshift.data.schema import Group, Pair, RowError

HARMLESS_DOMAINS = ("safety",)


@dataclass(frozen=True)
class RMBenchAdapter(BenchmarkAdapter):
    def _parts(self, row: dict[str, Any], where: str) -> tuple[list, list[str], list[str], dict[str, Any]]:
        prompt = user_prompt(row, where)
        chosen = responses(row, "chosen", where, RMBENCH_STYLES)
        rejected = responses(row, "rejected", where, RMBENCH_STYLES)
        return prompt, chosen, rejected, {"domain": row["domain"], "id": str(row.get("id"))}

    def to_pairs(self, row: dict[str, Any], where: str, params: Params) -> list[Pair]:
        prompt, chosen, rejected, meta = self._parts(row, where)
        return all_pairs(self, prompt, chosen, rejected, meta, where)

    def load_groups(self, params: Params) -> list[Group]:
        groups = []
        for where, row in self.rows("test", params):
            try:
                groups.append(ranked_group(self, *self._parts(row, where)))
            except RowError:
                continue
        return groups


def _adapter(domain: str) -> RMBenchAdapter:
    return RMBenchAdapter(
        name=f"rmbench_{domain}",
        category="harmless" if domain in HARMLESS_DOMAINS else "helpful",
        hf_id="THU-KEG/RM-Bench",
        splits={"test": "train"},
        columns=("prompt", "chosen", "rejected", "domain"),
        benchmark="rmbench",
        section=domain,
        members=RMBENCH_DOMAINS[domain],
        member_column="domain",
        needs=(
            "hub THU-KEG/RM-Bench (its one file, test only), or data.sources.NAME.path: the "
            "total_dataset.json file; one target per domain; yields groups"
        ),
    )


RMBENCH_ADAPTERS = tuple(_adapter(domain) for domain in RMBENCH_DOMAINS)
