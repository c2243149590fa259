"""`prefshift sweep`: grid parsing, and a real two-point lambda sweep as DVC experiments."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from mlflow_support import seed_database
from prefshift.errors import PrefshiftError
from prefshift.sweep import experiment_name, grid_points, parse_grid, sweep_filename
from test_pipeline_e2e import REPO, SMALL, _merge, _ran_stages, _run


def test_grid_keeps_list_values_whole_and_crosses_axes():
    grid = parse_grid(["anchor.lambda=1e-4, 1", "anchor.mid_fractions=[0.25,0.5],[0.75]"])
    assert grid == {"anchor.lambda": ["1e-4", "1"], "anchor.mid_fractions": ["[0.25,0.5]", "[0.75]"]}
    assert grid_points(grid) == [
        {"anchor.lambda": "1e-4", "anchor.mid_fractions": "[0.25,0.5]"},
        {"anchor.lambda": "1e-4", "anchor.mid_fractions": "[0.75]"},
        {"anchor.lambda": "1", "anchor.mid_fractions": "[0.25,0.5]"},
        {"anchor.lambda": "1", "anchor.mid_fractions": "[0.75]"},
    ]


def test_names_are_readable_and_ref_safe():
    assert experiment_name({"anchor.lambda": "1e-4"}) == "sweep-anchor.lambda-1e-4"
    assert experiment_name({"anchor.mid_fractions": "[0.25, 0.5]"}) == "sweep-anchor.mid_fractions-0.25_0.5"
    assert sweep_filename("anchor_mid", {"anchor.mid_fractions": [0.25, 0.5]}) == (
        "anchor_mid__anchor.mid_fractions=[0.25,0.5].json"
    )


@pytest.mark.parametrize(
    ("specs", "message"),
    [
        ([], "nothing to sweep"),
        (["anchor.lambda"], "expected section.key=value"),
        (["anchor..lambda=1,2"], "has an empty part"),
        (["anchor.lambda=1,,2"], "empty value"),
        (["anchor.lambda=1", "anchor.lambda=2"], "given twice"),
    ],
)
def test_bad_grids_are_refused(specs, message):
    with pytest.raises(PrefshiftError, match=message):  # key errors come from config's -S parser
        parse_grid(specs)


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """A shrunken embedded default in a git repo, reproduced up to evaluate@anchor_last."""
    root = tmp_path_factory.mktemp("sweep") / "project"
    root.mkdir()
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, text=True, check=True)
    for rel in filter(None, tracked.stdout.split("\0")):
        if (REPO / rel).is_file():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / rel, root / rel)
    params = _merge(yaml.safe_load((root / "params.yaml").read_text()), SMALL)
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    seed_database(tmp_path_factory, root / "mlflow.db")
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "HF_HUB_OFFLINE": "1",
        "MLFLOW_TRACKING_URI": f"sqlite:///{root / 'mlflow.db'}",
        # MLflow's telemetry thread edits os.environ while tracking.py iterates it (KeyError).
        "MLFLOW_DISABLE_TELEMETRY": "true",
        **{f"GIT_{who}_{what}": "t" for who in ("AUTHOR", "COMMITTER") for what in ("NAME", "EMAIL")},
    }
    env.pop("PREFSHIFT_PIPELINE_RUN_ID", None)
    _run(["git", "init", "-q"], root, env)
    _run(["git", "add", "-A"], root, env)
    _run(["git", "commit", "-qm", "fixture"], root, env)
    _run(["dvc", "repro", "evaluate@anchor_last"], root, env)
    return root, env


@pytest.mark.slow
def test_lambda_sweep_runs_experiments_and_feeds_the_report(project):
    root, env = project
    before = (root / "params.yaml").read_bytes()
    output = _run(["prefshift", "sweep", "-S", "anchor.lambda=0.01,1", "--methods", "anchor_last"], root, env)

    assert (root / "params.yaml").read_bytes() == before
    ran = [line for line in output.splitlines() if line.startswith("Running stage '")]
    assert _ran_stages(output) == {"train@anchor_last", "evaluate@anchor_last"} and len(ran) == 4

    files = sorted(p.name for p in (root / "reports" / "sweeps").glob("*.json"))
    assert files == ["anchor_last__anchor.lambda=0.01.json", "anchor_last__anchor.lambda=1.json"]
    results = {f: json.loads((root / "reports" / "sweeps" / f).read_text()) for f in files}
    assert [r["sweep"] for r in results.values()] == [{"anchor.lambda": 0.01}, {"anchor.lambda": 1}]
    for result in results.values():
        assert result["method"] == "anchor_last" and {"wrg", "mean_aog", "mean_nts"} <= set(result)
    workspace = json.loads((root / "reports" / "metrics" / "anchor_last.json").read_text())
    assert results[files[0]]["split_version"] == workspace["split_version"]

    summary = (root / "reports" / "summary.md").read_text()
    table = summary.split("### anchor.lambda", 1)[1].split("\n\n")[1]
    assert [row.split(" | ")[1] for row in table.splitlines()[2:]] == ["0.01", "1"]
    assert (root / "reports" / "figures" / "lambda_ablation.png").exists()

    from mlflow import MlflowClient

    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    experiment = client.get_experiment_by_name("prefshift")
    runs = client.search_runs([experiment.experiment_id], "tags.method = 'anchor_last'", max_results=100)
    lambdas = {stage: set() for stage in ("train", "evaluate")}
    for r in runs:
        lambdas[r.data.tags["stage"]].add(float(r.data.params["anchor.lambda"]))
    baseline = float(yaml.safe_load(before)["anchor"]["lambda"])
    assert lambdas == {"train": {baseline, 0.01, 1.0}, "evaluate": {baseline, 0.01, 1.0}}


def test_copy_paths_carries_untracked_uncached_outputs_but_no_cached_ones(tmp_path):
    from prefshift.sweep import copy_paths

    env = {**os.environ, **{f"GIT_{w}_{x}": "t" for w in ("AUTHOR", "COMMITTER") for x in ("NAME", "EMAIL")}}
    stages = {
        "a": {
            "cmd": "true",
            "outs": [{"reports/metrics/a.json": {"cache": False}}, {"reports/notes.txt": {"cache": False}}],
        },
        "b": {"cmd": "true", "outs": ["data/big", {"data/counts.json": {"cache": False}}]},
    }
    (tmp_path / "dvc.yaml").write_text(yaml.safe_dump({"stages": stages}))
    for rel in ("reports/metrics/a.json", "reports/notes.txt", "data/big/x", "data/counts.json"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("{}")
    (tmp_path / "dvc.lock").write_text("schema: '2.0'\nstages: {}\n")
    (tmp_path / "reports" / "keep.md").write_text("tracked\n")
    _run(["git", "init", "-q"], tmp_path, env)
    _run([str(Path(sys.executable).parent / "dvc"), "init", "-q"], tmp_path, env)
    _run(["git", "add", "dvc.yaml", "reports/keep.md", "reports/notes.txt"], tmp_path, env)
    # reports/ exists in the copy (keep.md), reports/metrics/ does not; data/ holds a cached out.
    assert copy_paths(tmp_path) == (["dvc.lock", "reports/metrics"], ["data/counts.json"])
