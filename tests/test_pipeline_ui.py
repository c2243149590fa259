"""The MLflow UI in a real browser, on the runs of the pipeline test_pipeline_e2e.py reproduces.

A file of its own, collected last (tests/conftest.py), so the worker that is not busy with the
pipeline file runs it once the pipeline exists (tests/e2e_project.py shares it between workers).
"""

from __future__ import annotations

import shutil

import pytest

from e2e_project import STUDENTS, reproduced
from e2e_project import run as _run
from mlflow_support import free_port


@pytest.mark.slow
def test_mlflow_ui_in_a_real_browser_shows_each_evaluate_run_and_its_metrics(tmp_path_factory, tmp_path):
    if not (shutil.which("chromium") or shutil.which("chromium-browser")):
        pytest.skip("no Chromium on PATH: scripts/install_chromium.sh installs it (.ci/run does)")
    pipeline = reproduced(tmp_path_factory)
    root, env = pipeline["root"], pipeline["env"]
    shot = tmp_path / "ui.png"
    port = str(free_port())
    output = _run(["prefshift", "ui", "--check", "--port", port, "--screenshot", str(shot)], root, env)
    for method in STUDENTS:
        assert f"evaluate@{method}-0" in output
    assert shot.stat().st_size > 10_000
