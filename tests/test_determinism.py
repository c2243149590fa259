"""Same params and seed, two project roots: byte-identical metrics on CPU (issue 8, item 6)."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

from mlflow_support import seed_database
from prefshift.core.paths import Layout
from tiny_project import pipeline_root, run_pipeline, tiny_params


@pytest.mark.slow
def test_two_runs_give_byte_identical_metrics(tmp_path_factory):
    first = Layout(pipeline_root(tmp_path_factory), seed=0)
    root = tmp_path_factory.mktemp("tiny-pipeline-again")
    seed_database(tmp_path_factory, root / "mlflow.db")
    second = run_pipeline(root, tiny_params())

    for path in ("metrics", "teacher_metrics"):
        a = getattr(first, path)("naive") if path == "metrics" else getattr(first, path)
        b = getattr(second, path)("naive") if path == "metrics" else getattr(second, path)
        assert a.read_bytes() == b.read_bytes(), f"{a.name} differs between two identical runs"
    labels_a, labels_b = pq.read_table(first.weak_labels), pq.read_table(second.weak_labels)
    assert labels_a.equals(labels_b) and labels_a.schema.metadata == labels_b.schema.metadata
    assert len(labels_a) == 80
    for split in ("id_test", "syn_help_chat"):
        scores = [pq.read_table(layout.scores("naive", split)) for layout in (first, second)]
        assert scores[0].equals(scores[1])
    assert (first.student_dir("naive") / "model.safetensors").read_bytes() == (
        second.student_dir("naive") / "model.safetensors"
    ).read_bytes()
    config = [(layout.student_dir("naive") / "config.json").read_bytes() for layout in (first, second)]
    assert config[0] == config[1] and b'"mean"' in config[0]  # the id_test reward stats, reproducibly
    # Whole model directories, provenance files included: everything keyed on a model's content
    # hash (policy sampling seeds, SEAM's generation cache, DVC's hashes) must come out the same.
    for directory in ("base_dir", "teacher_dir"):
        trees = [_tree(getattr(layout, directory)) for layout in (first, second)]
        differing = sorted(k for k in trees[0].keys() | trees[1].keys() if trees[0].get(k) != trees[1].get(k))
        assert not differing, f"{directory}: {differing} differ between two identical runs"
    assert _tree(first.student_dir("naive")) == _tree(second.student_dir("naive"))


def _tree(directory: Path) -> dict[str, bytes]:
    return {p.relative_to(directory).as_posix(): p.read_bytes() for p in directory.rglob("*") if p.is_file()}
