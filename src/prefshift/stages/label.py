"""`prefshift label`: the teacher's soft labels for student_train and its scores on every test split.

q_i = σ(Δ_teacher / T). The teacher's margins on id_test, each OOD target and the
best-of-n groups are written here so evaluation never reloads the teacher. The
labels carry the split version they were made from (parquet metadata
`split_version`); training refuses labels from another version. Labels, scores and
metrics are one output set (`prefshift.output_set`), replaced together.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from rich.console import Console

from prefshift.atomic import atomic_path, write_json
from prefshift.config import Params
from prefshift.data.schema import SkipCounter, read_groups, read_pairs
from prefshift.data.splits import check_version, load_manifest
from prefshift.errors import PrefshiftError
from prefshift.metrics import accuracy
from prefshift.output_set import output_set
from prefshift.paths import Layout

console = Console(stderr=True)
VERSION_KEY = b"split_version"


class StaleLabelsError(PrefshiftError):
    """Labels that do not belong to the current splits."""


def write_frame(path: Path, frame: pd.DataFrame, metadata: dict[bytes, bytes] | None = None) -> None:
    table = pa.Table.from_pandas(frame, preserve_index=False)
    if metadata:
        table = table.replace_schema_metadata({**(table.schema.metadata or {}), **metadata})
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp)


def read_labels(path: Path, layout: Layout) -> dict[str, float]:
    """pair_id → q from a labels parquet, after checking it matches the current splits."""
    if not path.exists():
        raise StaleLabelsError(f"{path}: labels not found (run the stage that writes them)")
    table = pq.read_table(path)
    if not {"pair_id", "q"} <= set(table.column_names):
        raise StaleLabelsError(f"{path}: expected columns pair_id and q, got {table.column_names}")
    found = (table.schema.metadata or {}).get(VERSION_KEY)
    if found is None:
        raise StaleLabelsError(f"{path}: carries no split_version metadata; rerun the stage that writes it")
    check_version(layout, found.decode(), str(path))
    return dict(zip(table.column("pair_id").to_pylist(), table.column("q").to_pylist(), strict=True))


def run(params: Params, layout: Layout) -> dict:
    # Imported here: the targets stage reads labels through this module and needs no torch.
    from prefshift.scoring import load_for_scoring, score_groups, score_pairs

    version = str(load_manifest(layout)["version"])
    model, tokenizer = load_for_scoring(layout.teacher_dir, params)
    meta = {VERSION_KEY: version.encode()}
    skips: dict[str, dict] = {}

    staged = output_set(
        layout.root,
        "prefshift label",
        files=[layout.teacher_metrics],
        directories=[layout.weak_labels.parent, layout.scores_dir("teacher")],
    )
    with staged as out:
        counter = SkipCounter()
        scored = score_pairs(model, tokenizer, read_pairs(layout.split("student_train")), params, counter)
        temperature = params.label.temperature
        labels = pd.DataFrame(
            {
                "pair_id": scored["pair_id"],
                "q": [1.0 / (1.0 + math.exp(-d / temperature)) for d in scored["delta"]],
                "teacher_delta": scored["delta"],
            }
        )
        write_frame(out.path(layout.weak_labels), labels, meta)
        skips["student_train"] = counter.as_dict()

        metrics: dict = {
            "split_version": version,
            "accuracy_pp": {},
            "pairs": {},
            "mean_q": float(labels["q"].mean()),
        }
        for split in ["id_test", *params.data.targets]:
            counter = SkipCounter()
            frame = score_pairs(model, tokenizer, read_pairs(layout.split(split)), params, counter)
            write_frame(out.path(layout.scores("teacher", split)), frame, meta)
            metrics["accuracy_pp"][split] = accuracy(frame["delta"])
            metrics["pairs"][split] = len(frame)
            skips[split] = counter.as_dict()
            accuracy_pp = metrics["accuracy_pp"][split]
            console.print(f"teacher {split}: accuracy {accuracy_pp:.1f}% on {len(frame)} pairs")
        for dataset in [params.data.source, *params.data.targets]:
            path = layout.split_groups(dataset)
            if path.exists():
                frame = score_groups(model, tokenizer, read_groups(path), params)
                write_frame(out.path(layout.group_scores("teacher", dataset)), frame, meta)
                skips[f"groups/{dataset}"] = frame.attrs["skips"]
        metrics["skips"] = skips
        write_json(out.path(layout.teacher_metrics), metrics)
    return metrics
