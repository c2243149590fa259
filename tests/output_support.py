"""Fixtures of the output-rule tests (test_output_rule, test_ownership): score inputs, a tiny
reward model, and a registry holding one promoted student."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from mlflow_support import seed_database
from prefshift.config.params import Params
from prefshift.core.paths import Layout
from prefshift.pipeline.stages import promote
from prefshift.tracking import runs as tracking
from test_registry import PAIRS, tiny_reward_model, write_metrics


@pytest.fixture
def score_inputs(tmp_path) -> tuple[Path, Path]:
    rows = tmp_path / "pairs.jsonl"
    rows.write_text("".join(json.dumps(p) + "\n" for p in PAIRS))
    params = tmp_path / "params.yaml"
    params.write_text("{}\n")
    return rows, params


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return tiny_reward_model(tmp_path_factory.mktemp("rm") / "model", seed=3)


@pytest.fixture(scope="module")
def registered(tmp_path_factory) -> Iterator[tuple[Layout, str]]:
    """A project whose registry holds one promoted student (naive, alias champion)."""
    with pytest.MonkeyPatch.context() as mp:
        for name in ("MLFLOW_TRACKING_URI", "DVC_ROOT", "DVC_STAGE"):
            mp.delenv(name, raising=False)
        mp.setenv(tracking.PIPELINE_ENV, "pr-output-rule")
        root = tmp_path_factory.mktemp("registered")
        seed_database(tmp_path_factory, root / "mlflow.db")
        params = Params(methods=["naive"], promote={"min_mean_aog": 0.0})
        layout = Layout(root, seed=0)
        write_metrics(layout, "naive", 70.0, 70.5, 1.0, 2.0)
        tiny_reward_model(layout.student_dir("naive"), seed=1)
        promote.run(params, layout)
        yield layout, f"models:/{params.tracking.registered_model}@champion"
