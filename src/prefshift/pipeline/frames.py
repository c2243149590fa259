"""The parquet frames stages hand each other, stamped with the split version they belong to.

A reader compares the stamp (`VERSION_KEY`) with the current split manifest, so labels or
scores from an earlier split are refused instead of joined to the wrong pairs.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from prefshift.core.atomic import atomic_path

VERSION_KEY = b"split_version"


def write_frame(path: Path, frame: pd.DataFrame, metadata: dict[bytes, bytes] | None = None) -> None:
    table = pa.Table.from_pandas(frame, preserve_index=False)
    if metadata:
        table = table.replace_schema_metadata({**(table.schema.metadata or {}), **metadata})
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp)
