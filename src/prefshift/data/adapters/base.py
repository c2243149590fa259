"""What every source adapter shares: where raw rows come from, and the row → pair loop.

A real source is read from the Hugging Face hub by default, or from a local copy in
the same format when params set `data.sources.<name>.path`. Rows from the hub that
fail validation are skipped and counted; a local file that cannot be parsed is the
user's own data, so it stops the run with the file and line.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import math
import zlib
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prefshift.config.params import Params, is_split_pattern
from prefshift.core.errors import PrefshiftError, json_problem
from prefshift.core.reading import InputFileError, open_regular
from prefshift.data.schema import Group, Pair, RowError, SchemaError, SkipCounter, pair_content_hash

SUFFIXES = (".jsonl", ".jsonl.gz", ".json", ".json.gz", ".parquet", ".csv")


class SourceUnavailable(PrefshiftError):
    """A source that can be read neither from a local path nor from the hub."""


Record = tuple[str, dict[str, Any]]


@dataclass(frozen=True)
class Adapter:
    """One named dataset: its defaults, and how one of its rows becomes a pair.

    `splits` maps the pipeline's split names (train, test) to the source's own.
    `columns` are the source columns every row must carry.
    """

    name: str
    category: str
    hf_id: str | None = None
    hf_config: str | None = None
    data_dir: str | None = None
    splits: Mapping[str, str] = field(default_factory=lambda: {"train": "train", "test": "test"})
    columns: tuple[str, ...] = ()
    needs: str = ""

    def renamed(self, name: str, category: str | None = None) -> Adapter:
        """The same reader under another dataset name (a params alias)."""
        return dataclasses.replace(self, name=name, category=category or self.category)

    def rows(self, split: str, params: Params) -> Iterator[Record]:
        return source_rows(self, split, params)

    def to_pair(self, row: dict[str, Any], where: str, params: Params) -> Pair:
        raise NotImplementedError

    def to_pairs(self, row: dict[str, Any], where: str, params: Params) -> list[Pair]:
        """The pairs of one row: one for most sources, several where a row ranks more responses."""
        return [self.to_pair(row, where, params)]

    def describe_source(self, split: str, params: Params) -> str:
        """Where `split` is read from, for messages: the local files, or the hub id and split."""
        source = params.data.sources.get(self.name)
        if source is not None and source.path:
            files = split_files(Path(source.path), split, self.splits[split], self.name)
            return ", ".join(map(str, files))
        hf_id = (source and source.hf_id) or self.hf_id
        return f"{hf_id} split {self.splits[split]!r}"

    def load_pairs(self, split: str, params: Params, counter: SkipCounter) -> list[Pair]:
        """Every valid pair of `split`; the rest skipped into `counter`, duplicates included."""
        if split not in self.splits:
            raise PrefshiftError(f"{self.name}: no split {split!r}; it has {sorted(self.splits)}")
        pairs: list[Pair] = []
        seen: dict[str, str] = {}  # content → where it was first read, named in a duplicate's message
        for where, row in self.rows(split, params):
            try:
                row_pairs = self.to_pairs(row, where, params)
            except RowError as err:
                counter.skip(err)
                continue
            for k, pair in enumerate(row_pairs):
                content = pair_content_hash(pair)
                here = f"{where} pair {k + 1} of {len(row_pairs)}" if len(row_pairs) > 1 else where
                if content in seen:
                    message = f"{here}: same prompt and responses as {seen[content]}"
                    counter.skip(RowError("duplicate", message))
                    continue
                seen[content] = here
                counter.kept += 1
                pairs.append(pair)
        return pairs

    def load_groups(self, params: Params) -> list[Group]:
        """Rated response groups for best-of-n evaluation; most sources have none."""
        return []


def value(row: dict[str, Any], key: str, where: str) -> Any:
    """A row's field, or a counted skip when the source left it empty."""
    found = row.get(key)
    if found is None or (isinstance(found, float) and math.isnan(found)):
        raise RowError("missing_field", f"{where}: field {key!r} is missing")
    return found


def source_rows(adapter: Adapter, split: str, params: Params) -> Iterator[Record]:
    source = params.data.sources.get(adapter.name)
    if source is not None and source.path:
        for path in split_files(Path(source.path), split, adapter.splits[split], adapter.name):
            yield from read_records(path, adapter.columns)
    else:
        yield from hub_rows(adapter, adapter.splits[split], params)


def split_files(path: Path, split: str, source_split: str, name: str) -> list[Path]:
    """Local files holding one split.

    A path containing `{split}` (the only field allowed) is formatted with the source's split
    name; a directory is searched (recursively, as a hub snapshot is laid out) for `<split>.*` or
    `<split>-*` files; a single plain file can only be a test split.
    """
    try:
        pattern = is_split_pattern(str(path))
    except ValueError as err:
        raise PrefshiftError(f"data.sources.{name}.path: {err}") from None
    if "{" in str(path) or "}" in str(path):  # `{{` and `}}` are literal braces, as in the message above
        path = Path(str(path).format(split=source_split))
    if pattern:
        if not path.is_file():
            raise PrefshiftError(f"data.sources.{name}.path: {path} not found (split {split})")
        return [path]
    if path.is_dir():
        found = sorted(
            p
            for p in path.rglob(f"{source_split}*")
            if p.is_file() and p.name.endswith(SUFFIXES) and p.name[len(source_split)] in ".-"
        )
        if not found:
            raise PrefshiftError(
                f"data.sources.{name}.path: no {source_split}.jsonl/.json/.parquet/.csv file under {path} "
                f"(needed for the {split} split)"
            )
        return found
    if path.is_file():
        if split != "test":
            raise PrefshiftError(
                f"data.sources.{name}.path: {path} is one file, usable as a test split only; "
                f"for the {split} split give a directory with {source_split}.* files or a path with {{split}}"
            )
        return [path]
    raise PrefshiftError(f"data.sources.{name}.path: {path} does not exist")


def read_records(path: Path, columns: tuple[str, ...] = ()) -> Iterator[Record]:
    """Rows of a local file with their location; unreadable input is fatal and located.

    The file is opened once, through the one regular-file check (`core.reading`): a device, a
    FIFO or a directory named as a data file is refused before a byte is read, and the handle
    that passed the check is the one every reader below reads.
    """
    try:
        handle = open_regular(path, "data file")
    except InputFileError as err:
        raise SchemaError(str(err)) from None
    with handle:
        yield from _records(path, handle, columns)


def _records(path: Path, handle: Any, columns: tuple[str, ...]) -> Iterator[Record]:
    name = path.name
    if name.endswith((".jsonl", ".jsonl.gz")):
        records = _jsonl(path, handle)
    elif name.endswith((".json", ".json.gz")):
        records = _json_array(path, handle)
    elif name.endswith(".parquet"):
        records = _table(path, _read_parquet(path, handle))
    elif name.endswith(".csv"):
        records = _table(path, _read_csv(path, handle))
    else:
        raise SchemaError(f"{path}: unsupported file type (use {', '.join(SUFFIXES)})")
    try:
        for where, row in records:
            missing = [c for c in columns if c not in row]
            if missing:
                raise SchemaError(f"{where}: missing column(s) {missing}; found {sorted(row)}")
            yield where, row
    except UnicodeDecodeError as err:
        raise SchemaError(f"{path}: not valid UTF-8 ({err.reason}); re-save it as UTF-8") from None


def _binary(path: Path, handle: Any) -> Any:
    """The file's bytes as stored, or as decompressed for a `.gz` name."""
    return gzip.open(handle, "rb") if path.name.endswith(".gz") else handle


@contextmanager
def _gzip_errors(path: Path, progress: Callable[[], str] = lambda: "") -> Iterator[None]:
    """A `.gz` that is not gzip, or is cut short, is reported with the file (and how far reading got).

    Left alone, the first is a BadGzipFile traceback and the second an EOFError, which the
    CLI framework takes for Ctrl-D and reports as a bare "Aborted.".
    """
    try:
        yield
    except gzip.BadGzipFile:
        raise SchemaError(
            f"{path}: named .gz but not gzip-compressed; compress it (gzip {path.name.removesuffix('.gz')}) "
            "or drop the .gz suffix"
        ) from None
    except (EOFError, zlib.error) as err:
        raise SchemaError(
            f"{path}: the gzip stream is truncated or corrupt{progress()} "
            f"({err or 'unexpected end of file'}); copy or download the file again"
        ) from None


def _jsonl(path: Path, handle: Any) -> Iterator[Record]:
    """Lines are decoded one by one so a bad byte is reported with its line."""
    number = 0
    with _gzip_errors(path, lambda: f" after line {number}"):
        for number, raw in enumerate(_binary(path, handle), start=1):
            where = f"{path} line {number}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise SchemaError(f"{where}: not valid UTF-8 ({err.reason} at byte {err.start})") from None
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise SchemaError(f"{where}: not valid JSON ({err.msg})") from None
            except (ValueError, RecursionError) as err:  # a number past Python's digit limit, or too deep
                raise SchemaError(f"{where}: {json_problem(err)}") from None
            if not isinstance(row, dict):
                raise SchemaError(f"{where}: expected a JSON object, got {type(row).__name__}")
            yield where, row


def _json_array(path: Path, handle: Any) -> Iterator[Record]:
    with _gzip_errors(path):
        text = _binary(path, handle).read().decode("utf-8")  # bad bytes: read_records names the file
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as err:
            raise SchemaError(f"{path} line {err.lineno}: not valid JSON ({err.msg})") from None
        except (ValueError, RecursionError) as err:  # a number past Python's digit limit, or too deep
            raise SchemaError(f"{path}: {json_problem(err)}") from None
    if not isinstance(rows, list):
        raise SchemaError(f"{path}: expected a JSON array of objects")
    for index, row in enumerate(rows):
        if not isinstance(row, dict):
            raise SchemaError(f"{path} item {index}: expected a JSON object, got {type(row).__name__}")
        yield f"{path} item {index}", row


def _read_parquet(path: Path, handle: Any) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    try:
        return pq.read_table(handle).to_pylist()
    except Exception as err:  # pyarrow raises several unrelated types for a corrupt file
        raise SchemaError(f"{path}: unreadable parquet ({err})") from None


def _read_csv(path: Path, handle: Any) -> list[dict[str, Any]]:
    import pandas as pd

    try:
        frame = pd.read_csv(handle)
    except Exception as err:  # pandas parser errors have no common base class
        raise SchemaError(f"{path}: unreadable CSV ({err})") from None
    return frame.astype(object).where(frame.notna(), None).to_dict("records")


def _table(path: Path, rows: list[dict[str, Any]]) -> Iterator[Record]:
    for index, row in enumerate(rows):
        yield f"{path} row {index}", row


def hub_rows(adapter: Adapter, split: str, params: Params) -> Iterator[Record]:
    """Rows from `datasets.load_dataset`; any failure to fetch becomes a how-to-fix message."""
    source = params.data.sources.get(adapter.name)
    hf_id = (source and source.hf_id) or adapter.hf_id
    config = (source and source.hf_config) or adapter.hf_config
    revision = source.revision if source else None
    if hf_id is None:
        raise SourceUnavailable(f"{adapter.name}: no hub id; set data.sources.{adapter.name}.path")
    try:
        import datasets

        table = datasets.load_dataset(
            hf_id, config, data_dir=adapter.data_dir, split=split, revision=revision
        )
    except Exception as err:  # offline, missing, gated or renamed: all answered the same way
        detail = str(err).strip().splitlines()[0][:300] if str(err).strip() else ""
        where = " ".join(part for part in (hf_id, config, adapter.data_dir) if part)
        raise SourceUnavailable(
            f"{adapter.name}: cannot load {where} split {split!r} from the Hugging Face hub "
            f"({type(err).__name__}: {detail}). Either set data.sources.{adapter.name}.path to a local copy "
            f"in the same format (a directory holding {split}.jsonl / {split}.parquet files, or a path "
            f"with {{split}}), or go online (unset HF_HUB_OFFLINE and HF_DATASETS_OFFLINE) and rerun."
        ) from None
    missing = [c for c in adapter.columns if c not in table.column_names]
    if missing:
        raise SchemaError(
            f"{adapter.name}: {hf_id} split {split!r} lacks column(s) {missing}; found {table.column_names}"
        )
    for index, row in enumerate(table):
        yield f"{hf_id} {split} row {index}", row
