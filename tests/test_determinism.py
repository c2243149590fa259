"""Same params and seed, two project roots: byte-identical metrics on CPU (issue 8, item 6)."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

from mlflow_support import seed_database
from prefshift.core.paths import Layout
from tiny_project import run_pipeline, score_on_targets, tiny_params

METHODS = [
    "naive", "confidence", "anchor_last", "anchor_mid", "ceiling",
    "linear_probe", "lp_ft", "wise_ft", "l2_sp", "grm",
]  # fmt: skip


@pytest.mark.slow
def test_two_runs_give_byte_identical_metrics(tmp_path_factory):
    """Every built-in method but SEAM (its principle prompt needs more positions than the tiny
    model has), each from its own project root. Each reads what naive never does: anchor_last the
    reference states that the `reference` stage stored, WiSE-FT its α grid, LP-FT its probe phase;
    a store whose order hung on a path or a directory listing would pass naive and fail here."""
    first, second = (
        _every_method(tmp_path_factory, name) for name in ("tiny-pipeline", "tiny-pipeline-again")
    )

    assert first.teacher_metrics.read_bytes() == second.teacher_metrics.read_bytes()
    labels_a, labels_b = pq.read_table(first.weak_labels), pq.read_table(second.weak_labels)
    assert labels_a.equals(labels_b) and labels_a.schema.metadata == labels_b.schema.metadata
    assert len(labels_a) == 80
    # Whole directories, provenance files included: everything keyed on a model's content hash
    # (policy sampling seeds, SEAM's generation cache, DVC's hashes) must come out the same.
    for directory in ("base_dir", "teacher_dir", "reference_dir"):
        trees = [_tree(getattr(layout, directory)) for layout in (first, second)]
        differing = sorted(k for k in trees[0].keys() | trees[1].keys() if trees[0].get(k) != trees[1].get(k))
        assert not differing, f"{directory}: {differing} differ between two identical runs"
    assert _tree(first.reference_dir), "the reference stage stored no states for anchor_last to read"
    for method in METHODS:
        a, b = first.metrics(method), second.metrics(method)
        assert a.read_bytes() == b.read_bytes(), f"{a} differs between two identical runs"
        for split in ("id_test", "syn_help_chat"):
            scores = [pq.read_table(layout.scores(method, split)) for layout in (first, second)]
            assert scores[0].equals(scores[1]), f"{method}'s scores on {split} differ"
        assert _tree(first.student_dir(method)) == _tree(second.student_dir(method)), method
        config = (first.student_dir(method) / "config.json").read_bytes()
        assert b'"mean"' in config  # the id_test reward stats, reproducibly
    naive, anchored = (first.student_dir(m) / "model.safetensors" for m in ("naive", "anchor_last"))
    assert naive.read_bytes() != anchored.read_bytes(), (
        "anchor_last trained as naive: the test would prove nothing"
    )


def _every_method(tmp_path_factory, name: str) -> Layout:
    """The tiny pipeline in a root of its own (naive trained), then every other method trained,
    scored and evaluated there."""
    from prefshift.pipeline.stages import evaluate, train

    root = tmp_path_factory.mktemp(name)
    seed_database(tmp_path_factory, root / "mlflow.db")
    params = tiny_params(methods=METHODS, wise_ft={"alphas": [0.0, 0.5, 1.0]}, l2_sp={"lambda": 0.01})
    layout = run_pipeline(root, params)
    for method in METHODS[1:]:
        train.run(params, layout, method)
        score_on_targets(params, layout, method)
        evaluate.run(params, layout, method)
    return layout


def _tree(directory: Path) -> dict[str, bytes]:
    return {p.relative_to(directory).as_posix(): p.read_bytes() for p in directory.rglob("*") if p.is_file()}
