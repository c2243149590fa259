"""`prefshift label`: the teacher's soft labels for student_train, and its accuracy on every test split.

q_i = σ(Δ_teacher / T), from the margins `prefshift teacher` wrote when it scored its saved
model (data/scores/teacher/, with id_test, each OOD target and the best-of-n groups, which
evaluation reads), so no model is loaded here. The labels carry the split version they were
made from (parquet metadata `split_version`); training refuses labels from another version.
Labels and metrics are one output set (`prefshift.pipeline.output_set`), replaced together.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq

from prefshift.config.params import Params
from prefshift.core.atomic import write_json
from prefshift.core.console import messages
from prefshift.core.errors import PrefshiftError
from prefshift.core.paths import Layout
from prefshift.data.schema import read_pairs
from prefshift.data.splits import check_version, load_manifest
from prefshift.pipeline.frames import VERSION_KEY, write_frame
from prefshift.pipeline.heldout_scores import read_skips
from prefshift.pipeline.output_set import manifest_of, output_set, verify
from prefshift.pipeline.stages.evaluate import read_scores
from prefshift.science.metrics import accuracy

console = messages()


class StaleLabelsError(PrefshiftError):
    """Labels that do not belong to the current splits."""


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
    version = str(load_manifest(layout)["version"])
    meta = {VERSION_KEY: version.encode()}
    scores_dir = layout.scores_dir("teacher")
    if not scores_dir.exists():
        raise StaleLabelsError(f"{scores_dir}: no teacher scores; run `prefshift teacher`")
    verify(layout.root, manifest_of(scores_dir), [scores_dir], "prefshift teacher")

    def scored(split: str) -> pd.DataFrame:
        ids = {p.pair_id for p in read_pairs(layout.split(split))}
        return read_scores(layout.scores("teacher", split), layout, ids, "prefshift teacher")

    with output_set(
        layout.root,
        "prefshift label",
        files=[layout.teacher_metrics],
        directories=[layout.weak_labels.parent],
    ) as out:
        train = scored("student_train")
        temperature = params.label.temperature
        labels = pd.DataFrame(
            {
                "pair_id": train["pair_id"],
                "q": [1.0 / (1.0 + math.exp(-d / temperature)) for d in train["delta"]],
                "teacher_delta": train["delta"],
            }
        )
        write_frame(out.path(layout.weak_labels), labels, meta)
        metrics: dict = {
            "split_version": version,
            "accuracy_pp": {},
            "pairs": {},
            "mean_q": float(labels["q"].mean()),
        }
        for split in ["id_test", *params.data.targets]:
            frame = scored(split)
            metrics["accuracy_pp"][split] = accuracy(frame["delta"])
            metrics["pairs"][split] = len(frame)
            console.print(
                f"teacher {split}: accuracy {metrics['accuracy_pp'][split]:.1f}% on {len(frame)} pairs"
            )
        metrics["skips"] = read_skips(layout, "teacher")
        write_json(out.path(layout.teacher_metrics), metrics)
    return metrics
