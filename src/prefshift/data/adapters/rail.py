"""RAIL-HH-10K (responsible-ai-labs): HH harmless dialogues with a rewritten, safer answer.

What could be confirmed of the format (dataset card and public loaders): splits train,
validation and test; a `prompt` column (the last human turn), a `context` column with the
earlier dialogue as "Human: …" / "Assistant: …" lines, and per-answer scores such as
`chosen_score` / `rejected_score`. The names of the two answer columns could not be
confirmed, so the mapping below is an explicit assumption: the first present of
ANSWER_COLUMNS is used, and a source with none of them fails with the columns it has.
`context` is optional (empty for single-turn rows); when it already ends with the prompt,
the prompt is not repeated. The label is the dataset's own:
the chosen answer is preferred; its scores go to `meta`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from prefshift.config.params import Params
from prefshift.data.adapters.base import Adapter, Record, source_rows, value
from prefshift.data.adapters.hh_rlhf import parse_turns
from prefshift.data.schema import Pair, RowError, SchemaError, make_pair

ANSWER_COLUMNS = {
    "chosen": ("chosen", "chosen_response", "chosen_text"),
    "rejected": ("rejected", "rejected_response", "rejected_text"),
}
_META = ("chosen_score", "rejected_score", "chosen_safety", "rejected_safety")


def answer_column(row: dict[str, Any], side: str, where: str) -> str:
    for column in ANSWER_COLUMNS[side]:
        if column in row:
            return column
    raise SchemaError(
        f"{where}: none of the assumed RAIL answer columns {list(ANSWER_COLUMNS[side])} is present; "
        f"found {sorted(row)} (update ANSWER_COLUMNS in prefshift/data/adapters/rail.py)"
    )


@dataclass(frozen=True)
class RailAdapter(Adapter):
    def rows(self, split: str, params: Params) -> Iterator[Record]:
        for where, row in source_rows(self, split, params):
            answer_column(row, "chosen", where)
            answer_column(row, "rejected", where)
            yield where, row

    def to_pair(self, row: dict[str, Any], where: str, params: Params) -> Pair:
        question = value(row, "prompt", where)
        if not isinstance(question, str):
            raise RowError("bad_type", f"{where}: field 'prompt' must be a string")
        context = row.get("context")
        history = parse_turns(context, where) if isinstance(context, str) and context.strip() else []
        turn = {"role": "user", "content": question.strip()}
        return make_pair(
            dataset=self.name,
            category=self.category,
            prompt=history if history[-1:] == [turn] else [*history, turn],
            chosen=value(row, answer_column(row, "chosen", where), where),
            rejected=value(row, answer_column(row, "rejected", where), where),
            meta={key: row[key] for key in _META if row.get(key) is not None},
            where=where,
        )


RAIL = RailAdapter(
    name="rail",
    category="harmless",
    hf_id="responsible-ai-labs/RAIL-HH-10K",
    columns=("prompt",),
    needs=(
        "hub responsible-ai-labs/RAIL-HH-10K, or data.sources.rail.path: a directory with train.* and "
        "test.* (parquet, csv or jsonl); answer columns assumed, see prefshift/data/adapters/rail.py"
    ),
)
