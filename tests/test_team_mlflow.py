"""A team MLflow server: the pipeline's stages and the model registry used only through MLFLOW_TRACKING_URI.

A real `mlflow server` (sqlite backend, proxied local artifact root) runs on 127.0.0.1.
The finished tiny pipeline is copied, and its train, evaluate and promote stages re-run
in-process with the URI pointing at the server; then the `prefshift pull` CLI, in a
separate process that knows only the URI, fetches the champion for plain transformers.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow import MlflowClient

from mlflow_support import free_port, running_server
from prefshift.tracking import runs as tracking
from tiny_project import copy_project, pipeline_root, tiny_params

STAGES = ("train", "evaluate", "promote")


@pytest.fixture(scope="module")
def team(tmp_path_factory):
    """(uri, server dir, params, layout, promote result) once the three stages ran against the server."""
    from prefshift.pipeline.stages import evaluate, promote, train

    source = pipeline_root(tmp_path_factory)
    server_dir = tmp_path_factory.mktemp("team-server")
    with running_server(server_dir, free_port()) as uri, pytest.MonkeyPatch.context() as mp:
        for name in ("DVC_ROOT", "DVC_STAGE"):
            mp.delenv(name, raising=False)
        mp.setenv("MLFLOW_TRACKING_URI", uri)
        mp.setenv(tracking.PIPELINE_ENV, "team-server-test")
        layout = copy_project(source, tmp_path_factory.mktemp("team-project"))
        # The tiny students are near chance, so the gate is opened to make a champion certain.
        params = tiny_params(
            promote={"id_tolerance": 100.0, "min_mean_aog": -1000.0, "allow_below_chance": True}
        )
        train.run(params, layout, "naive")
        evaluate.run(params, layout, "naive")
        result = promote.run(params, layout)
        yield uri, server_dir, params, layout, result


@pytest.mark.slow
def test_stages_log_their_runs_to_the_server_under_one_parent(team):
    uri, server_dir, params, _, _ = team
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name(params.tracking.experiment)
    runs = client.search_runs([experiment.experiment_id])
    stages = [r for r in runs if tracking.PARENT_TAG not in r.data.tags]
    by_stage = {stage: [r for r in stages if r.data.tags.get("stage") == stage] for stage in STAGES}
    assert {stage: len(found) for stage, found in by_stage.items()} == dict.fromkeys(STAGES, 1)
    parents = {found[0].data.tags.get("mlflow.parentRunId") for found in by_stage.values()}
    assert len(parents) == 1 and None not in parents
    train_run = by_stage["train"][0]
    assert train_run.info.status == "FINISHED"
    assert "train/loss" in train_run.data.metrics
    assert any((server_dir / "server-artifacts").rglob("*")), "artifacts did not reach the server's root"


@pytest.mark.slow
def test_champion_is_registered_on_the_server_and_pulls_for_plain_transformers(team, tmp_path):
    from safetensors.torch import load_file
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    uri, _, params, layout, result = team
    name = params.tracking.registered_model
    assert [p["method"] for p in result["promoted"]] == ["naive"]
    champion = MlflowClient(uri).get_model_version_by_alias(name, "champion")
    assert str(champion.version) == str(result["promoted"][0]["version"])

    out = tmp_path / "pulled"
    cli = Path(sys.executable).parent / "prefshift"
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [str(cli), "pull", f"models:/{name}@champion", "--out", str(out), "--root", str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]

    AutoModelForSequenceClassification.from_pretrained(out)
    AutoTokenizer.from_pretrained(out)
    pulled = load_file(out / "model.safetensors")
    trained = load_file(layout.student_dir("naive") / "model.safetensors")
    assert pulled.keys() == trained.keys()
    assert all(pulled[k].equal(trained[k]) for k in pulled)
