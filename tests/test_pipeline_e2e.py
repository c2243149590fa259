"""The whole pipeline as a user runs it: a git clone, `dvc repro`, MLflow, the registry, `pull`.

One shrunken embedded default (same stages, fewer pairs and steps) is run once per
session in a temporary git repository; the tests below read what it produced.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from mlflow_support import free_port, seed_database
from prefshift.bench.pipeline import copy_tracked

REPO = Path(__file__).resolve().parents[1]
STUDENTS = ("naive", "confidence", "seam", "anchor_last", "anchor_mid", "ceiling")

SMALL = {
    "synthetic": {"train_pairs": 400, "test_pairs": 160, "groups": 12, "corpus_docs": 600},
    "data": {"caps": {"teacher_train": 200, "student_train": 200, "id_test": 120, "ood": 120, "groups": 12}},
    "backbone": {
        "vocab_size": 300,
        "weak": {"pretrain_steps": 20, "pretrain_batch_size": 8, "pretrain_seq_len": 64},
        "strong": {
            "hidden_size": 64,
            "num_layers": 2,
            "num_heads": 2,
            "intermediate_size": 128,
            "pretrain_steps": 20,
            "pretrain_batch_size": 8,
            "pretrain_seq_len": 64,
        },
    },
    "teacher": {"epochs": 1, "batch_size": 16},
    "student": {"epochs": 1, "batch_size": 16, "drift_every": 5},
    "evaluate": {"bootstrap": 50, "batch_size": 64},
    "downstream": {"prompts": 6, "n_max": 4, "max_new_tokens": 12},
    # The gate is opened wide so the registry path runs; gate logic has its own tests.
    "promote": {"id_tolerance": 100.0, "min_mean_aog": -100.0},
}


def _merge(base: dict, overlay: dict) -> dict:
    for key, value in overlay.items():
        base[key] = _merge(base.get(key, {}), value) if isinstance(value, dict) else value
    return base


def _run(args: list[str], cwd: Path, env: dict[str, str]) -> str:
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=1800)
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"{' '.join(args)} failed:\n{output[-4000:]}"
    return output


def _ran_stages(output: str) -> set[str]:
    return {line.split("'")[1] for line in output.splitlines() if line.startswith("Running stage '")}


def _project(tmp_path_factory, name: str, overlay: dict) -> tuple[Path, dict[str, str]]:
    """A git repository holding the tracked files, params.yaml overlaid; (root, env to run DVC in)."""
    root = tmp_path_factory.mktemp(name) / "project"
    root.mkdir()
    copy_tracked(REPO, root)
    params = _merge(yaml.safe_load((root / "params.yaml").read_text()), overlay)
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    seed_database(tmp_path_factory, root / "mlflow.db")
    bin_dir = str(Path(sys.executable).parent)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "HF_HUB_OFFLINE": "1",
        "MLFLOW_TRACKING_URI": f"sqlite:///{root / 'mlflow.db'}",
        **{
            f"GIT_{who}_{what}": value
            for who in ("AUTHOR", "COMMITTER")
            for what, value in (("NAME", "t"), ("EMAIL", "t@t"))
        },
    }
    env.pop("PREFSHIFT_PIPELINE_RUN_ID", None)
    _run(["git", "init", "-q"], root, env)
    _run(["git", "add", "-A"], root, env)
    _run(["git", "commit", "-qm", "fixture"], root, env)
    return root, env


@pytest.fixture(scope="session")
def pipeline(tmp_path_factory):
    root, env = _project(tmp_path_factory, "pipeline", SMALL)
    first = _run(["dvc", "repro"], root, env)
    return {"root": root, "env": env, "first": first}


@pytest.mark.slow
def test_repro_runs_every_stage_and_writes_the_report(pipeline):
    root = pipeline["root"]
    ran = _ran_stages(pipeline["first"])
    expected = {"prepare", "split", "backbone", "teacher", "label", "plan", "reference", "probe", "report"}
    expected |= {"promote"}
    expected |= {f"{stage}@{m}" for m in STUDENTS for stage in ("targets", "train", "evaluate")}
    expected |= {"policy_samples", "gold_judge", "downstream_teacher"} | {f"downstream@{m}" for m in STUDENTS}
    assert expected <= ran
    summary = (root / "reports" / "summary.md").read_text()
    for name in ("teacher", *STUDENTS, "syn_help_instruct", "syn_help_chat", "synthetic"):
        assert name in summary
    assert "## Best-of-n against a gold judge" in summary
    assert "## Shortcut cues and what the frozen strong base exposes" in summary
    assert "anchor_last vs naive on syn_help_chat" in summary
    headline = json.loads((root / "reports" / "metrics.json").read_text())
    assert set(STUDENTS) <= set(json.dumps(headline).replace('"', " ").split())
    assert sorted(p.name for p in (root / "reports" / "figures").glob("*.png"))


@pytest.mark.slow
def test_second_repro_runs_nothing(pipeline):
    output = _run(["dvc", "repro"], pipeline["root"], pipeline["env"])
    assert _ran_stages(output) == set()


@pytest.mark.slow
def test_every_student_has_an_mlflow_run_with_metrics_and_lineage(pipeline):
    from mlflow import MlflowClient

    client = MlflowClient(pipeline["env"]["MLFLOW_TRACKING_URI"])
    experiment = client.get_experiment_by_name("prefshift")
    runs = client.search_runs([experiment.experiment_id], max_results=500)
    evaluations = {r.data.tags.get("method"): r for r in runs if r.data.tags.get("stage") == "evaluate"}
    assert set(STUDENTS) <= set(evaluations)
    for run in evaluations.values():
        assert {"wrg", "mean_aog", "mean_nts"} <= set(run.data.metrics)
        assert run.data.tags["git.commit"] and run.data.tags["prefshift.pipeline_run_id"]
        assert any(key.startswith("dvc.dep.") for key in run.data.tags)
    trainings = {r.data.tags.get("method"): r for r in runs if r.data.tags.get("stage") == "train"}
    assert set(STUDENTS) <= set(trainings)
    assert any(r.data.tags.get("stage") == "teacher" for r in runs)
    history = client.get_metric_history(trainings["anchor_last"].info.run_id, "train/loss")
    assert len({m.step for m in history}) > 1, "training curves are logged per step"
    pipelines = {r.data.tags.get("prefshift.pipeline_run_id") for r in runs}
    assert len(pipelines - {None}) == 1, "one dvc repro must share one pipeline run id"


@pytest.mark.slow
def test_champion_pulls_into_plain_transformers_with_identical_rewards(pipeline, tmp_path):
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from prefshift.config import load_params
    from prefshift.data.schema import read_pairs
    from prefshift.scoring import load_for_scoring, score_pairs

    root, env = pipeline["root"], pipeline["env"]
    promotion = json.loads((root / "reports" / "promotion.json").read_text())
    assert list(promotion["aliases"]).count("champion") == 1
    out = tmp_path / "champion"
    _run(["prefshift", "pull", "models:/prefshift-reward@champion", "--out", str(out)], root, env)
    model = AutoModelForSequenceClassification.from_pretrained(out).eval()
    tokenizer = AutoTokenizer.from_pretrained(out)

    params = load_params(root / "params.yaml")
    params = params.model_copy(update={"encode": params.encode.model_copy(update={"max_length": 4096})})
    pairs = read_pairs(root / "data" / "splits" / "id_test.parquet")[:8]
    ours = score_pairs(*load_for_scoring(out, params), pairs, params).set_index("pair_id")
    for pair in pairs:
        rewards = []
        for response in (pair.chosen, pair.rejected):  # rendered and tokenised the way TRL's reward path does
            text = tokenizer.apply_chat_template(
                [*pair.prompt, {"role": "assistant", "content": response}], tokenize=False
            )
            ids = tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
            with torch.inference_mode():
                rewards.append(model(input_ids=ids).logits[0, 0].item())
        assert rewards[0] - rewards[1] == pytest.approx(ours.loc[pair.pair_id, "delta"], abs=1e-4)
    config = json.loads((out / "config.json").read_text())
    assert config["std"] > 0 and math.isfinite(config["mean"])


@pytest.mark.slow
def test_mlflow_ui_in_a_real_browser_shows_each_evaluate_run_and_its_metrics(pipeline, tmp_path):
    if not (shutil.which("chromium") or shutil.which("chromium-browser")):
        pytest.skip("no Chromium on PATH: scripts/install_chromium.sh installs it (.ci/run does)")
    root, env = pipeline["root"], pipeline["env"]
    shot = tmp_path / "ui.png"
    port = str(free_port())
    output = _run(["prefshift", "ui", "--check", "--port", port, "--screenshot", str(shot)], root, env)
    for method in STUDENTS:
        assert f"evaluate@{method}" in output
    assert shot.stat().st_size > 10_000


@pytest.mark.slow
def test_lambda_change_reruns_only_anchor_stages(pipeline):
    root, env = pipeline["root"], pipeline["env"]
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["anchor"]["lambda"] = 0.5
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    output = _run(["dvc", "repro"], root, env)
    assert _ran_stages(output) == {  # gold_judge re-runs on any student and rewrites identical scores
        "plan",
        "gold_judge",
        "train@anchor_last",
        "train@anchor_mid",
        "evaluate@anchor_last",
        "evaluate@anchor_mid",
        "downstream@anchor_last",
        "downstream@anchor_mid",
        "report",
        "promote",
    }


def _stages(root: Path, env: dict[str, str]) -> set[str]:
    return {
        line.split()[0] for line in _run(["dvc", "stage", "list"], root, env).splitlines() if line.strip()
    }


@pytest.mark.slow
def test_methods_is_the_pipeline_and_lambda_never_reruns_the_reference(tmp_path_factory):
    """methods [naive, anchor_last] on the tiny project: no other method has a stage, nothing else runs,
    and a λ change re-runs plan and the anchor student only, never the shared reference."""
    from tiny_project import TINY

    root, env = _project(tmp_path_factory, "two-methods", {**TINY, "promote": SMALL["promote"]})
    per_method = {
        f"{stage}@{m}" for m in ("naive", "anchor_last") for stage in ("targets", "train", "evaluate")
    }
    per_method |= {"downstream@naive", "downstream@anchor_last"}
    expected = {"prepare", "split", "backbone", "teacher", "label", "plan", "reference", "probe", "report"}
    expected |= {"promote"}
    expected |= {"policy_samples", "gold_judge", "downstream_teacher"}  # judged by the rule only: no ceiling
    assert _stages(root, env) == expected | per_method
    assert _ran_stages(_run(["dvc", "repro"], root, env)) == expected | per_method
    manifest = json.loads((root / "data" / "reference" / "manifest.json").read_text())
    assert manifest["stored"] and manifest["layers"] == [2]
    log = json.loads((root / "reports" / "train" / "anchor_last.json").read_text())
    assert log["reference"]["route"] == "shared" and log["reference"]["forward_rows"] == 0

    params = yaml.safe_load((root / "params.yaml").read_text())
    params["anchor"]["lambda"] = 0.25
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    ran = _ran_stages(_run(["dvc", "repro"], root, env))
    anchor_stages = {f"{stage}@anchor_last" for stage in ("train", "evaluate", "downstream")}
    assert ran == {"plan", "gold_judge", "report", "promote"} | anchor_stages
