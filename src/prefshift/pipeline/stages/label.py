"""`prefshift label`: the teacher's soft labels for student_train.

q_i = σ(Δ_teacher / T), from the margins `prefshift teacher` wrote when it scored its saved
model on student_train, so no model is loaded here. Label reads student_train alone: a target
added or dropped never re-runs it (the teacher's accuracy on each split is
`prefshift evaluate-teacher`'s). The labels carry the source splits' version they were made from
(parquet metadata `split_version`); training refuses labels from another version.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq

from prefshift.config.params import Params
from prefshift.core.console import messages
from prefshift.core.errors import PrefshiftError
from prefshift.core.paths import Layout
from prefshift.data.schema import read_pairs
from prefshift.data.splits import check_version, load_manifest
from prefshift.pipeline.frames import VERSION_KEY, write_frame
from prefshift.pipeline.output_set import manifest_of, output_set, verify
from prefshift.pipeline.stages.evaluate_inputs import read_scores

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


def run(params: Params, layout: Layout) -> pd.DataFrame:
    version = str(load_manifest(layout)["version"])
    scores_dir = layout.scores_dir("teacher")
    if not scores_dir.exists():
        raise StaleLabelsError(f"{scores_dir}: no teacher scores; run `prefshift teacher`")
    verify(layout.root, manifest_of(scores_dir), [scores_dir], "prefshift teacher")
    ids = {p.pair_id for p in read_pairs(layout.split("student_train"))}
    train = read_scores(
        layout.scores("teacher", "student_train"), layout, "student_train", ids, "prefshift teacher"
    )
    temperature = params.label.temperature
    labels = pd.DataFrame(
        {
            "pair_id": train["pair_id"],
            "q": [1.0 / (1.0 + math.exp(-d / temperature)) for d in train["delta"]],
            "teacher_delta": train["delta"],
        }
    )
    with output_set(layout.root, "prefshift label", directories=[layout.weak_labels.parent]) as out:
        write_frame(out.path(layout.weak_labels), labels, {VERSION_KEY: version.encode()})
    console.print(f"label: {layout.weak_labels} — {len(labels)} pairs, mean q {labels['q'].mean():.3f}")
    return labels
