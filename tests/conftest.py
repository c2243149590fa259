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
