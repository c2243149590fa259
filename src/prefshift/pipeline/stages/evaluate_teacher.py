"""`prefshift evaluate-teacher`: one seed's teacher accuracy on id_test and every target.

reports/metrics/teacher/seed-<k>.json (a DVC metric), from the score files the teacher stage
(id_test) and `score-target` (each target) wrote, and the mean of its labels. Apart from `label`,
which reads student_train alone, so a new target re-runs this and never the labels.
"""

from __future__ import annotations

import pyarrow.parquet as pq

from prefshift.config.params import Params
from prefshift.core.atomic import write_json
from prefshift.core.console import messages
from prefshift.core.paths import Layout
from prefshift.data.schema import read_pairs
from prefshift.data.splits import load_manifest
from prefshift.pipeline.heldout_scores import read_skips
from prefshift.pipeline.output_set import output_set
from prefshift.pipeline.stages.evaluate_inputs import check_trained_on, read_heldout, read_train_log
from prefshift.science.metrics import ID_SPLIT, accuracy


def run(params: Params, layout: Layout) -> dict:
    splits = [ID_SPLIT, *params.data.targets]
    ids = {split: {p.pair_id for p in read_pairs(layout.split(split))} for split in splits}
    check_trained_on(layout, "teacher", read_train_log(layout.train_log("teacher")))
    frames = read_heldout(layout, "teacher", ids, params.data.targets)
    labels = pq.read_table(layout.weak_labels, columns=["q"]).to_pandas()
    metrics: dict = {
        "split_version": str(load_manifest(layout)["version"]),
        "accuracy_pp": {split: accuracy(frames[split]["delta"]) for split in splits},
        "pairs": {split: len(frames[split]) for split in splits},
        "mean_q": float(labels["q"].mean()),
        "skips": read_skips(layout, "teacher", params.data.targets),
    }
    with output_set(layout.root, "prefshift evaluate-teacher", files=[layout.teacher_metrics]) as out:
        write_json(out.path(layout.teacher_metrics), metrics)
    for split in splits:
        accuracy_pp, pairs = metrics["accuracy_pp"][split], metrics["pairs"][split]
        messages().print(f"teacher {split}: accuracy {accuracy_pp:.1f}% on {pairs} pairs")
    return metrics
