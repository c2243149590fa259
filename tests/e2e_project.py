"""The whole pipeline as a user runs it, shared by the end-to-end and sweep tests.

One shrunken embedded default (same stages, fewer pairs and steps) is reproduced with `dvc repro`
once per session in a temporary git repository. Right after that run a pristine copy of the
project (git, DVC cache, outputs; no MLflow database) is kept, so a later user of the same state
(the sweep) starts from it even after tests changed the original.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from mlflow_support import seed_database
from prefshift.bench.pipeline import copy_tracked

REPO = Path(__file__).resolve().parents[1]

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

_BUILT: dict[str, dict] = {}


def merge(base: dict, overlay: dict) -> dict:
    for key, value in overlay.items():
        base[key] = merge(base.get(key, {}), value) if isinstance(value, dict) else value
    return base


def run(args: list[str], cwd: Path, env: dict[str, str]) -> str:
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=1800)
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"{' '.join(args)} failed:\n{output[-4000:]}"
    return output


def ran_stages(output: str) -> set[str]:
    return {line.split("'")[1] for line in output.splitlines() if line.startswith("Running stage '")}


def environment(root: Path) -> dict[str, str]:
    """The environment DVC runs in for the project at `root` (its own MLflow database)."""
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "HF_HUB_OFFLINE": "1",
        "MLFLOW_TRACKING_URI": f"sqlite:///{root / 'mlflow.db'}",
        **{
            f"GIT_{who}_{what}": value
            for who in ("AUTHOR", "COMMITTER")
            for what, value in (("NAME", "t"), ("EMAIL", "t@t"))
        },
    }
    env.pop("PREFSHIFT_PIPELINE_RUN_ID", None)
    return env


def project(tmp_path_factory, name: str, overlay: dict) -> tuple[Path, dict[str, str]]:
    """A git repository holding the tracked files, params.yaml overlaid; (root, env to run DVC in)."""
    root = tmp_path_factory.mktemp(name) / "project"
    root.mkdir()
    copy_tracked(REPO, root)
    params = merge(yaml.safe_load((root / "params.yaml").read_text()), overlay)
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    seed_database(tmp_path_factory, root / "mlflow.db")
    env = environment(root)
    run(["git", "init", "-q"], root, env)
    run(["git", "add", "-A"], root, env)
    run(["git", "commit", "-qm", "fixture"], root, env)
    return root, env


def reproduced(tmp_path_factory) -> dict:
    """{root, env, first (the output of `dvc repro`), pristine}: SMALL after one full `dvc repro`.

    Built once per session. `root` is the project the end-to-end tests work in (and change);
    `pristine` is a copy of it taken right after the run, never changed: copy it to use it.
    """
    if "pipeline" not in _BUILT:
        root, env = project(tmp_path_factory, "pipeline", SMALL)
        first = run(["dvc", "repro"], root, env)
        pristine = tmp_path_factory.mktemp("pipeline-pristine") / "project"
        skip = shutil.ignore_patterns("mlflow.db", "mlartifacts")
        shutil.copytree(root, pristine, symlinks=True, ignore=skip)
        _BUILT["pipeline"] = {"root": root, "env": env, "first": first, "pristine": pristine}
    return _BUILT["pipeline"]


def copy_reproduced(tmp_path_factory, name: str) -> tuple[Path, dict[str, str]]:
    """A copy of the pristine reproduced project with an empty MLflow database of its own."""
    root = tmp_path_factory.mktemp(name) / "project"
    shutil.copytree(reproduced(tmp_path_factory)["pristine"], root, symlinks=True)
    seed_database(tmp_path_factory, root / "mlflow.db")
    return root, environment(root)
