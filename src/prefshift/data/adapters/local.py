"""A user's own preference file, declared in params rather than built in:

    data:
      sources:
        my_prefs: {adapter: local, path: data/raw/my_prefs, category: helpful}

Each file (JSONL, JSON array, Parquet or CSV) holds one of two formats, told apart on every
row (a row with `prompt` is the pair schema; a row of the other format is fatal and located):
the pair schema (`prompt`, `chosen`, `rejected`, optional `gold` and `meta`;
`prompt` a message list, that list as JSON text, or a plain string taken as one user
message), or HH-style `chosen` / `rejected` transcripts. A row that breaks its file's
format is fatal and located; rows that are valid but unusable (ties, empty or identical
responses) are skipped and counted like any source's.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prefshift.config.params import Params
from prefshift.data.adapters.base import Adapter, Record, read_records, split_files
from prefshift.data.adapters.hh_rlhf import transcripts_to_pair
from prefshift.data.schema import Pair, RowError, SchemaError, make_pair

SCHEMA_COLUMNS = ("prompt", "chosen", "rejected")
HH_COLUMNS = ("chosen", "rejected")


FORMAT_NAMES = {SCHEMA_COLUMNS: "pair-schema", HH_COLUMNS: "HH-transcript"}


def row_format(row: dict[str, Any], where: str) -> tuple[str, ...]:
    """The columns this row's format needs: the pair schema when it has `prompt`, else HH transcripts."""
    if "prompt" in row:
        return SCHEMA_COLUMNS
    if all(column in row for column in HH_COLUMNS):
        return HH_COLUMNS
    raise SchemaError(
        f"{where}: neither the pair schema (prompt, chosen, rejected) nor HH transcripts "
        f"(chosen, rejected); found columns {sorted(row)}"
    )


def _json_field(raw: Any, name: str, where: str) -> Any:
    if not isinstance(raw, str):
        return raw
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, RecursionError):
        raise SchemaError(
            f"{where}: field {name!r} is a string but not valid JSON (or nested too deeply)"
        ) from None


@dataclass(frozen=True)
class LocalAdapter(Adapter):
    path: str = ""

    def rows(self, split: str, params: Params) -> Iterator[Record]:
        for file in split_files(Path(self.path), split, split, self.name):
            first: tuple[str, tuple[str, ...]] | None = None
            for where, row in read_records(file):
                columns = row_format(row, where)
                first = first or (where, columns)
                if columns != first[1]:
                    raise SchemaError(
                        f"{where}: a {FORMAT_NAMES[columns]} row in a file of {FORMAT_NAMES[first[1]]} rows "
                        f"(as {first[0]} is); one file holds one format, so convert the row or split the file"
                    )
                missing = [c for c in columns if c not in row]
                if missing:
                    raise SchemaError(
                        f"{where}: missing column(s) {missing} of the {FORMAT_NAMES[columns]} format"
                    )
                yield where, row

    def describe_source(self, split: str, params: Params) -> str:
        return ", ".join(map(str, split_files(Path(self.path), split, split, self.name)))

    def to_pair(self, row: dict[str, Any], where: str, params: Params) -> Pair:
        if "prompt" not in row:
            return transcripts_to_pair(self.name, self.category, row["chosen"], row["rejected"], where)
        meta = _json_field(row.get("meta"), "meta", where) or {}
        if not isinstance(meta, dict):
            raise RowError("bad_meta", f"{where}: field 'meta' must be an object")
        gold = row.get("gold")
        return make_pair(
            dataset=self.name,
            category=self.category,
            prompt=row["prompt"],  # make_pair reads JSON text and plain strings
            chosen=row["chosen"],
            rejected=row["rejected"],
            gold=1.0 if gold is None else gold,
            meta=meta,
            where=where,
        )


LOCAL = LocalAdapter(
    name="local",
    category="helpful",
    splits={"train": "train", "test": "test"},
    needs=(
        "declared in params: data.sources.<name>: {adapter: local, path: <dir with train.* and test.*, "
        "or one file = test>, category: helpful|harmless}; pair-schema rows or HH transcripts"
    ),
)
