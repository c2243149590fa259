"""Shared test set-up: never touch the Hugging Face hub, and build params and layouts cheaply."""

from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
# `make test` runs two pytest-xdist workers. torch's default, a thread per core in every process,
# gave each worker's stages as many threads as the machine has cores, and OpenMP's idle threads
# spin: beside a busy core, a scoring stage took 2.1x as long with 2 threads as with 1. Each worker,
# and all it starts (DVC, the stages, the CLIs), gets its share of the cores instead.
# (xdist names the count in its workers only; its controller runs no test.)
if _WORKERS := os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    from prefshift.core.host import core_share

    os.environ.setdefault("OMP_NUM_THREADS", str(core_share(int(_WORKERS))))

from pathlib import Path
from typing import Any

import pytest

from prefshift.config.params import Params, parse_params
from prefshift.core.paths import Layout

FIXTURES = Path(__file__).parent / "fixtures"
LONGEST_FIRST = ("test_pipeline_e2e.py",)
"""Files that hold most of the suite's time (the reproduced pipeline and what reads it, about
half of it on a 2-core machine). `make test` runs two pytest-xdist workers with `--dist
loadfile --no-loadscope-reorder`, which hands out files in collection order (xdist's default
order, most tests first, started this 8-test file last, after everything else on its worker:
998 s of wall time for 1420 s of tests). Started first, the other worker takes the rest
meanwhile. Its worker is then given further files as any other: an xdist worker holds back its
last test until it has more work or is shut down, so withholding work from it (a scheduler hook
did, from 2026-12-04 to 12-06) left the pipeline file's last test, the minutes-long λ sweep,
waiting for the whole suite to end and then running alone."""


HEAVY = (
    "test_real_rehearsal.py",
    "test_target_scoring.py",
    "test_sweep.py",
    "test_resume.py",
    "test_bench.py",
    "test_sweep_executors.py",
    "test_sweep_slurm.py",
    "test_method_plugins.py",
)
"""The next longest files (fresh-clone CI on 2026-12-04: 193, 103, 67, 50, 37 and 35 s), started
right after LONGEST_FIRST, so the other worker takes them while the pipeline builds and the
short files fill both workers at the end. Alphabetical order started the rehearsals and the
sweeps late, behind the short files (947 s of wall time in that run, of which the pipeline file
took 470 s on its worker). The target-scoring file (a copy of the reproduced pipeline and two
repros of it, 273 s in CI) comes right after the rehearsals, which outlast the pipeline's build:
in alphabetical order it started last, on the pipeline's worker, and ran alone for its last
250 s (timeline of a CI run, 2026-12-06)."""

LAST = ("test_pipeline_ui.py",)
"""Files that read the pipeline LONGEST_FIRST reproduces, from the other worker: collected last,
they start when that worker has run everything else, by then long after the pipeline was built."""


def _start_order(name: str) -> tuple[int, bool]:
    first = (*LONGEST_FIRST, *HEAVY)
    return (first.index(name) if name in first else len(first), name in LAST)


def pytest_collection_modifyitems(config, items):
    items.sort(key=lambda item: _start_order(item.path.name))


@pytest.fixture
def fixtures_dir() -> Path:
    return FIXTURES


@pytest.fixture
def tmp_layout(tmp_path: Path) -> Layout:
    """A project root in a temporary directory, as stages see it."""
    return Layout(tmp_path, seed=0)


@pytest.fixture
def make_params():
    """Params from the defaults plus a nested override mapping, validated like params.yaml."""

    def build(**sections: Any) -> Params:
        return parse_params(sections, "test params")

    return build


@pytest.fixture(autouse=True, scope="session")
def _shared_tracking_database(tmp_path_factory):
    """Stages log to MLflow; tests that don't set a URI share one migrated sqlite database.

    Migrating a fresh database costs seconds, so it is done once per session (tests of
    tracking itself point MLFLOW_TRACKING_URI elsewhere with monkeypatch).
    """
    if os.environ.get("MLFLOW_TRACKING_URI"):
        yield
        return
    from mlflow_support import seed_database

    path = tmp_path_factory.mktemp("tracking") / "mlflow.db"
    seed_database(tmp_path_factory, path)
    os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{path}"
    yield
    os.environ.pop("MLFLOW_TRACKING_URI", None)
