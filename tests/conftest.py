"""Shared test set-up: never touch the Hugging Face hub, and build params and layouts cheaply."""

from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"

from pathlib import Path
from typing import Any

import pytest

from prefshift.config import Params, parse_params
from prefshift.paths import Layout

FIXTURES = Path(__file__).parent / "fixtures"
LONGEST_FIRST = ("test_pipeline_e2e.py",)
"""Files that hold most of the suite's time (the reproduced pipeline and what reads it, over
half of it on a 2-core machine). `make test` runs two pytest-xdist workers with `--dist
loadfile`, which hands out files in collection order: started last, this file ran after
everything else on its worker and set the suite's wall time; started first, the other worker
takes the rest meanwhile."""


def pytest_collection_modifyitems(config, items):
    items.sort(key=lambda item: item.path.name not in LONGEST_FIRST)


@pytest.fixture
def fixtures_dir() -> Path:
    return FIXTURES


@pytest.fixture
def tmp_layout(tmp_path: Path) -> Layout:
    """A project root in a temporary directory, as stages see it."""
    return Layout(tmp_path)


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
