"""The offline synthetic suite seen through the adapter interface.

Rows come from `prefshift.data.synthetic` (generated from params `synthetic`), not from
files, and pass through the same `make_pair` validation as any source's rows.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from prefshift.config.params import Params
from prefshift.data import synthetic
from prefshift.data.adapters.base import Adapter, Record
from prefshift.data.schema import Group, Pair, content_hash, make_pair


@dataclass(frozen=True)
class SyntheticAdapter(Adapter):
    generator: str = ""  # the suite's dataset name; stays put when params alias the adapter

    def rows(self, split: str, params: Params) -> Iterator[Record]:
        """A dataset used as an OOD target carries its cues reversed (synthetic.target_cues: which
        ones; the others are left out); the source keeps them. The judge split carries every cue
        on the chosen response in half its pairs: the best-of-n judge sees the cues and cannot use
        them, so it learns the gold rule alone (`prefshift judge`)."""
        is_target = self.name in params.data.targets
        role = "target" if is_target else "source"
        generated = synthetic.generate_pairs(
            self.generator,
            split,
            params.synthetic,
            role="neutral" if split == synthetic.JUDGE_SPLIT else role,
            reversed_cues=params.synthetic.target_cues.get(self.name) if is_target else None,
        )
        for index, row in enumerate(generated):
            yield f"synthetic {split} row {index}", row

    def to_pair(self, row: dict[str, Any], where: str, params: Params) -> Pair:
        return make_pair(
            dataset=self.name,
            category=self.category,
            prompt=row.get("prompt"),
            chosen=row.get("chosen"),
            rejected=row.get("rejected"),
            gold=row.get("gold", 1.0),
            meta=row.get("meta"),
            where=where,
        )

    def load_groups(self, params: Params) -> list[Group]:
        return [
            Group(
                content_hash(self.name, row["prompt"], row["responses"]),
                self.name,
                self.category,
                row["prompt"],
                list(row["responses"]),
                [float(score) for score in row["scores"]],
            )
            for row in synthetic.generate_groups(self.generator, params.synthetic)
        ]


def synthetic_adapters() -> list[SyntheticAdapter]:
    return [
        SyntheticAdapter(
            name=name,
            category=category,
            generator=name,
            splits={split: split for split in (*synthetic.SPLITS, synthetic.JUDGE_SPLIT)},
            needs="nothing: generated offline from params `synthetic` (seed, sizes, cue strengths)",
        )
        for name, category in synthetic.SYNTHETIC_DATASETS.items()
    ]
