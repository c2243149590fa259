"""NVIDIA HelpSteer3, `preference` config: two responses to a chat context, rated -3…3.

`overall_preference` < 0 means response1 is better, > 0 response2, 0 is a tie (skipped,
counted as `tie`). Its magnitude is the annotators' strength of preference, kept as the
gold strength: gold = 0.5 + |preference| / 6, so 1 → 0.667, 2 → 0.833, 3 → 1.0. The hub
has no test split; `validation` serves as test.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from prefshift.config.params import Params
from prefshift.data.adapters.base import Adapter, value
from prefshift.data.schema import Pair, RowError, make_pair


def preference_gold(preference: Any, where: str) -> float:
    if isinstance(preference, bool) or not isinstance(preference, (int, float)) or abs(preference) > 3:
        raise RowError("bad_label", f"{where}: overall_preference must be in -3…3, got {preference!r}")
    if preference == 0:
        raise RowError("tie", f"{where}: overall_preference is 0 (tie)")
    return 0.5 + abs(float(preference)) / 6


@dataclass(frozen=True)
class HelpSteer3Adapter(Adapter):
    def to_pair(self, row: dict[str, Any], where: str, params: Params) -> Pair:
        preference = value(row, "overall_preference", where)
        gold = preference_gold(preference, where)
        first, second = value(row, "response1", where), value(row, "response2", where)
        chosen, rejected = (first, second) if preference < 0 else (second, first)
        return make_pair(
            dataset=self.name,
            category=self.category,
            prompt=value(row, "context", where),
            chosen=chosen,
            rejected=rejected,
            gold=gold,
            meta={
                "overall_preference": preference,
                "domain": row.get("domain"),
                "language": row.get("language"),
            },
            where=where,
        )


HELPSTEER3 = HelpSteer3Adapter(
    name="helpsteer3",
    category="helpful",
    hf_id="nvidia/HelpSteer3",
    hf_config="preference",
    splits={"train": "train", "test": "validation"},
    columns=("context", "response1", "response2", "overall_preference"),
    needs=(
        "hub nvidia/HelpSteer3 config preference, or data.sources.helpsteer3.path: a directory with "
        "train.jsonl(.gz) and validation.jsonl(.gz) (the hub's preference/ folder)"
    ),
)
