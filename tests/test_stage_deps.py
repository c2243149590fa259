"""Each DVC stage's source deps are what its command imports (scripts/stage_deps.py derives
them from the import graph): a module a stage loads but does not list would leave its results
silently stale after an edit, as once when modules moved."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "stage_deps.py"


@pytest.fixture(scope="module")
def stage_deps():
    spec = importlib.util.spec_from_file_location("stage_deps", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _check(dvc_yaml: Path) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(SCRIPT), "--dvc-yaml", str(dvc_yaml)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=REPO)


def test_dvc_yaml_lists_what_every_stage_imports():
    done = _check(REPO / "dvc.yaml")
    assert done.returncode == 0, done.stderr


def test_a_dep_left_out_is_named_with_its_stage(tmp_path):
    text = (REPO / "dvc.yaml").read_text()
    broken = text.replace("      - src/prefshift/science/probe.py\n", "", 1)
    assert broken != text
    (tmp_path / "dvc.yaml").write_text(broken)
    done = _check(tmp_path / "dvc.yaml")
    assert done.returncode == 1
    assert (
        "stage probe: missing dep src/prefshift/science/probe.py (`prefshift probe` loads it)" in done.stderr
    )
    assert "scripts/stage_deps.py --write" in done.stderr


def test_a_dep_the_stage_does_not_load_is_named(tmp_path):
    text = (REPO / "dvc.yaml").read_text()
    stale = text.replace(
        "      - src/prefshift/science/probe.py\n",
        "      - src/prefshift/science/probe.py\n      - src/prefshift/engine/seam.py\n",
        1,
    )
    (tmp_path / "dvc.yaml").write_text(stale)
    done = _check(tmp_path / "dvc.yaml")
    assert "stage probe: dep src/prefshift/engine/seam.py is not loaded by `prefshift probe`" in done.stderr


def test_write_restores_the_derived_lists(tmp_path):
    text = (REPO / "dvc.yaml").read_text()
    (tmp_path / "dvc.yaml").write_text(text.replace("      - src/prefshift/science/probe.py\n", "", 1))
    subprocess.run(
        [sys.executable, str(SCRIPT), "--write", "--dvc-yaml", str(tmp_path / "dvc.yaml")], check=True
    )
    assert (tmp_path / "dvc.yaml").read_text() == text


def test_what_a_package_init_imports_counts(stage_deps):
    """probe imports prefshift.methods.layers only, but that runs prefshift/methods/__init__.py,
    which imports the registry and, through entry points, every built-in method."""
    graph = stage_deps._graph()
    assert "src/prefshift/methods" in stage_deps.required(graph, "probe")


def test_exempt_modules_are_never_deps(stage_deps):
    graph = stage_deps._graph()
    for command in ("train", "report", "promote"):
        paths = stage_deps.required(graph, command)
        assert "src/prefshift/core/progress.py" not in paths
        assert not any(p.startswith("src/prefshift/tracking") for p in paths)
        assert "src/prefshift/config" in paths  # params defaults live there
