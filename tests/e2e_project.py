"""The whole pipeline as a user runs it, shared by the end-to-end and sweep tests.

One shrunken embedded default (same stages, fewer pairs and steps) is reproduced with `dvc repro`
once per session in a temporary git repository. Right after that run a pristine copy of the
project (git, DVC cache, outputs; no MLflow database) is kept, so a later user of the same state
(the sweep) starts from it even after tests changed the original.

Under pytest-xdist the workers of one session share it: the first to ask builds it under a file
lock in the session's common temporary directory (xdist's documented pattern), the others wait
for that lock and then read it. So a test that only reads the pipeline can live in a file of its
own and run on the other worker (test_pipeline_ui.py).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from mlflow_support import seed_database
from prefshift.bench.pipeline import copy_project_sources

REPO = Path(__file__).resolve().parents[1]

SMALL = {
    # One seed (each costs about 160 s of CI here): the one-seed report path runs end to end; several
    # seeds' stages are planned by test_methods_is_the_pipeline, and their verdicts are computed
    # from a real two-seed run's outputs by test_report.
    "seeds": [0],
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
    "promote": {"id_tolerance": 100.0, "min_mean_aog": -100.0, "allow_below_chance": True},
}

STUDENTS = ("naive", "confidence", "seam", "anchor_last", "anchor_mid", "ceiling")
"""The embedded default's students: one targets, train and evaluate stage each, for every seed."""
SEEDS = tuple(SMALL["seeds"])


def per_method(stages, methods) -> set[str]:
    """DVC's names for the per-method stages (each runs every seed): train@naive, ..."""
    return {f"{stage}@{m}" for stage in stages for m in methods}


BEST_OF_N = ("policy_samples", "gold_judge", "downstream")
"""The best-of-n stages of id_test; each has a `<stage>_target@<target>` twin per target."""


def best_of_n_stages(targets) -> set[str]:
    """Every best-of-n stage and the judge's: id_test's, and one of each per target (prompts are
    sampled, judged and ranked per split; the judge is scored on each target by judge_target)."""
    per_target = (*(f"{stage}_target" for stage in BEST_OF_N), "judge_target")
    return {*BEST_OF_N, "judge", *(f"{stage}@{t}" for stage in per_target for t in targets)}


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


def project(parent: Path, overlay: dict, tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """A git repository in parent/project holding the committed sources (copy_project_sources:
    what a fresh clone holds, whatever the checkout reproduced), params.yaml overlaid;
    (root, env to run DVC in)."""
    root = parent / "project"
    root.mkdir()
    copy_project_sources(REPO, root)
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
        if os.environ.get("PYTEST_XDIST_WORKER"):
            _BUILT["pipeline"] = _shared(tmp_path_factory)
        else:
            _BUILT["pipeline"] = _build(tmp_path_factory.mktemp("pipeline-session"), tmp_path_factory)
    return _BUILT["pipeline"]


def _shared(tmp_path_factory) -> dict:
    """This xdist session's pipeline: built by the first worker to ask, read by the others."""
    from filelock import FileLock

    where = tmp_path_factory.getbasetemp().parent / "pipeline-session"  # common to the workers
    marker = where.with_suffix(".json")
    with FileLock(where.with_suffix(".lock")):
        if not marker.exists():  # also after another worker's build failed: it left no marker
            shutil.rmtree(where, ignore_errors=True)
            where.mkdir()
            built = _build(where, tmp_path_factory)
            marker.write_text(json.dumps({"first": built["first"]}))
            return built
    root = where / "project"
    first = json.loads(marker.read_text())["first"]
    return {"root": root, "env": environment(root), "first": first, "pristine": _pristine(where)}


def _pristine(where: Path) -> Path:
    return where / "pipeline-pristine" / "project"


def _build(where: Path, tmp_path_factory) -> dict:
    root, env = project(where, SMALL, tmp_path_factory)
    first = run(["dvc", "repro"], root, env)
    skip = shutil.ignore_patterns("mlflow.db", "mlartifacts")
    shutil.copytree(root, _pristine(where), symlinks=True, ignore=skip)
    return {"root": root, "env": env, "first": first, "pristine": _pristine(where)}


def copy_reproduced(tmp_path_factory, name: str) -> tuple[Path, dict[str, str]]:
    """A copy of the pristine reproduced project with an empty MLflow database of its own."""
    root = tmp_path_factory.mktemp(name) / "project"
    shutil.copytree(reproduced(tmp_path_factory)["pristine"], root, symlinks=True)
    seed_database(tmp_path_factory, root / "mlflow.db")
    return root, environment(root)
