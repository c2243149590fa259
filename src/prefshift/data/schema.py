"""The pair record every source is normalised to, and the group record for best-of-n.

Adapters emit plain dicts; `make_pair` validates them into `Pair` and raises
`RowError(reason, message)` for rows that must not be trained on. Callers
decide (by documented policy) whether a reason is skipped and counted or fatal.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from prefshift.core.atomic import atomic_path, write_json
from prefshift.core.errors import PrefshiftError

ROLES = ("system", "user", "assistant")


class RowError(PrefshiftError, ValueError):
    """A source row that cannot become a valid pair. `reason` is a short counter key."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


class SchemaError(PrefshiftError, ValueError):
    """A file that violates the schema as a whole (wrong columns, unreadable)."""


@dataclass(frozen=True)
class Pair:
    pair_id: str
    dataset: str
    category: str
    prompt: list[dict[str, str]]
    chosen: str
    rejected: str
    gold: float = 1.0
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Group:
    """Several rated responses to one prompt, for best-of-n selection accuracy.

    `meta` holds what a benchmark's own scoring rule needs besides the responses (its
    subset, an example id); empty for plain best-of-n sources.
    """

    group_id: str
    dataset: str
    category: str
    prompt: list[dict[str, str]]
    responses: list[str]
    scores: list[float]
    meta: dict[str, Any] = field(default_factory=dict)


def content_hash(*parts: Any) -> str:
    """Stable 16-hex-digit hash of JSON-serialisable parts."""
    blob = json.dumps(parts, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:16]


def pair_content_hash(pair: Pair) -> str:
    """Hash of what a model sees (prompt + the unordered responses): finds leaks across datasets."""
    return content_hash(pair.prompt, sorted([pair.chosen, pair.rejected]))


def check_prompt(prompt: Any, where: str) -> list[dict[str, str]]:
    """The one prompt rule of every entry point (`prepare`, `prefshift score`, the served model).

    A prompt is a list of {role, content} messages (roles in ROLES, string contents, at least one
    non-empty user message), that list as JSON text (a Parquet column), or a plain string, taken
    as one user turn. One function, so what one entry point accepts no other refuses.
    """
    if isinstance(prompt, str):
        prompt = _decoded_messages(prompt) or [{"role": "user", "content": prompt}]
    if not isinstance(prompt, list) or not prompt:
        raise RowError(
            "bad_prompt", f"{where}: field 'prompt' must be a string or a non-empty list of messages"
        )
    messages = []
    for i, msg in enumerate(prompt):
        if not isinstance(msg, dict) or set(msg) != {"role", "content"}:
            raise RowError("bad_prompt", f"{where}: prompt[{i}] must be {{role, content}}, got {msg!r:.80}")
        role, content = msg["role"], msg["content"]
        if role not in ROLES:
            raise RowError("bad_prompt", f"{where}: prompt[{i}].role {role!r:.40} not in {ROLES}")
        if not isinstance(content, str):
            raise RowError("bad_prompt", f"{where}: prompt[{i}].content must be a string")
        _check_encodable(content, f"prompt[{i}].content", where)
        messages.append({"role": role, "content": content})
    if not any(m["role"] == "user" and m["content"].strip() for m in messages):
        raise RowError("empty_prompt", f"{where}: prompt has no non-empty user message")
    return messages


def _decoded_messages(text: str) -> list | None:
    """The message list a JSON-text prompt holds, or None for plain text (decoded only when it
    looks like a list, so a long plain prompt is not parsed)."""
    if not text.lstrip().startswith("["):
        return None
    try:
        decoded = json.loads(text)
    except (ValueError, RecursionError):  # bad JSON, or a number past Python's digit limit: plain text
        return None
    return decoded if isinstance(decoded, list) else None


def check_response(value: Any, name: str, where: str) -> str:
    """A response is a non-empty string: the one response rule of every entry point."""
    if not isinstance(value, str):
        raise RowError("bad_type", f"{where}: field {name!r} must be a string, got {type(value).__name__}")
    if not value.strip():
        raise RowError("empty_response", f"{where}: field {name!r} is empty")
    _check_encodable(value, f"field {name!r}", where)
    return value


def _check_encodable(text: str, what: str, where: str) -> None:
    """Refuse text that is no Unicode: a lone surrogate (JSON's `\\ud800` escape without its pair)
    decodes into a Python string but stands for no character, and every tokenizer fails on it."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise RowError(
            "bad_text",
            f"{where}: {what} holds {text[err.start : err.end]!r} at character {err.start}, a lone "
            "surrogate escape that stands for no character; remove it or write the character it should be",
        ) from None


def make_pair(
    *,
    dataset: str,
    category: str,
    prompt: Any,
    chosen: Any,
    rejected: Any,
    gold: Any = 1.0,
    meta: dict[str, Any] | None = None,
    where: str = "",
) -> Pair:
    """Validate one candidate pair; `where` (e.g. 'file.jsonl line 7') goes into every message."""
    where = f"{dataset} {where}".strip()
    if category not in ("helpful", "harmless"):
        raise RowError(
            "bad_category", f"{where}: field 'category' must be helpful|harmless, got {category!r}"
        )
    messages = check_prompt(prompt, where)
    chosen, rejected = check_response(chosen, "chosen", where), check_response(rejected, "rejected", where)
    if chosen.strip() == rejected.strip():
        raise RowError("identical_responses", f"{where}: 'chosen' and 'rejected' are identical")
    if isinstance(gold, bool) or not isinstance(gold, (int, float)) or not 0.5 < float(gold) <= 1.0:
        raise RowError("bad_gold", f"{where}: field 'gold' must be a number in (0.5, 1], got {gold!r}")
    meta = dict(meta or {})
    pair_id = content_hash(dataset, messages, chosen, rejected)
    return Pair(pair_id, dataset, category, messages, chosen, rejected, float(gold), meta)


class SkipCounter:
    """Counts skipped rows per reason and keeps a few distinct examples for the log.

    Distinct: one row can be skipped several times over (a benchmark record's nine pairs), and
    three copies of one message would show a single row where the user needs to see a pattern.
    """

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.examples: dict[str, list[str]] = {}
        self.kept = 0

    def skip(self, err: RowError) -> None:
        self.counts[err.reason] += 1
        examples = self.examples.setdefault(err.reason, [])
        if len(examples) < 3 and str(err) not in examples:
            examples.append(str(err))

    def as_dict(self) -> dict[str, Any]:
        return {
            "kept": self.kept,
            "skipped": dict(sorted(self.counts.items())),
            "skipped_total": sum(self.counts.values()),
            "examples": self.examples,
        }

    def write(self, path: str | Path) -> None:
        write_json(path, self.as_dict())


PAIR_SCHEMA = pa.schema(
    [
        ("pair_id", pa.string()),
        ("dataset", pa.string()),
        ("category", pa.string()),
        ("prompt", pa.string()),
        ("chosen", pa.string()),
        ("rejected", pa.string()),
        ("gold", pa.float64()),
        ("meta", pa.string()),
    ]
)

GROUP_SCHEMA = pa.schema(
    [
        ("group_id", pa.string()),
        ("dataset", pa.string()),
        ("category", pa.string()),
        ("prompt", pa.string()),
        ("responses", pa.list_(pa.string())),
        ("scores", pa.list_(pa.float64())),
        ("meta", pa.string()),
    ]
)


def _dump(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


def write_pairs(path: str | Path, pairs: Sequence[Pair]) -> None:
    """Parquet with prompt/meta as JSON text (heterogeneous meta stays lossless)."""
    columns: dict[str, list[Any]] = {name: [] for name in PAIR_SCHEMA.names}
    for pair in pairs:
        row = asdict(pair)
        for name in PAIR_SCHEMA.names:
            value = row[name]
            columns[name].append(_dump(value) if name in ("prompt", "meta") else value)
    table = pa.table(columns, schema=PAIR_SCHEMA)
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp)


def read_pairs(path: str | Path) -> list[Pair]:
    path = Path(path)
    if not path.exists():
        raise SchemaError(f"{path}: pairs file not found")
    table = pq.read_table(path)
    missing = set(PAIR_SCHEMA.names) - set(table.column_names)
    if missing:
        raise SchemaError(f"{path}: not a pairs file, missing columns {sorted(missing)}")
    rows = table.select(PAIR_SCHEMA.names).to_pylist()
    return [
        Pair(**{**row, "prompt": json.loads(row["prompt"]), "meta": json.loads(row["meta"])}) for row in rows
    ]


def write_groups(path: str | Path, groups: Iterable[Group]) -> None:
    columns: dict[str, list[Any]] = {name: [] for name in GROUP_SCHEMA.names}
    for group in groups:
        row = asdict(group)
        for name in GROUP_SCHEMA.names:
            columns[name].append(_dump(row[name]) if name in ("prompt", "meta") else row[name])
    table = pa.table(columns, schema=GROUP_SCHEMA)
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp)


def read_groups(path: str | Path) -> list[Group]:
    path = Path(path)
    if not path.exists():
        raise SchemaError(f"{path}: groups file not found")
    rows = pq.read_table(path).to_pylist()
    return [
        Group(**{**row, "prompt": json.loads(row["prompt"]), "meta": json.loads(row.get("meta") or "{}")})
        for row in rows
    ]
