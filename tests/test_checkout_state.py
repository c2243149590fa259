"""The suite does not depend on the state of the checkout it runs in (issue 30, item 1).

The end-to-end tests and `prefshift bench` copy the project into a temporary git repository
(`copy_project_sources`). That copy must be what a fresh clone holds, whatever a `dvc repro` left
in the checkout: `make repro` and then `make test` in one clone used to fail, because DVC's
core.autostage had staged dvc.lock and the .gitignore files and the copy took git's index.
Here a real `dvc repro prepare` runs in a temporary clone (never in the real checkout), and the
copy taken after it is compared with one taken before.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from e2e_project import REPO, environment, run
from prefshift.bench.common import BenchError
from prefshift.bench.pipeline import committed_files, copy_project_sources


def _files(root: Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and ".git" not in p.relative_to(root).parts
    }


@pytest.fixture(scope="module")
def checkout(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """A clone of the project's committed sources, one commit, nothing reproduced yet."""
    root = tmp_path_factory.mktemp("checkout") / "project"
    root.mkdir()
    copy_project_sources(REPO, root)
    env = environment(root)
    run(["git", "init", "-q"], root, env)
    run(["git", "add", "-A"], root, env)
    run(["git", "commit", "-qm", "sources"], root, env)
    return root, env


def _copy(checkout: Path, tmp_path: Path, name: str) -> dict[str, bytes]:
    target = tmp_path / name
    target.mkdir()
    copy_project_sources(checkout, target)
    return _files(target)


def test_a_copy_after_dvc_repro_is_the_copy_of_a_fresh_clone(checkout, tmp_path):
    root, env = checkout
    fresh = _copy(root, tmp_path, "fresh")
    run(["dvc", "repro", "prepare"], root, env)
    staged = run(["git", "diff", "--cached", "--name-only"], root, env).split()
    assert {"dvc.lock", "data/.gitignore"} <= set(staged), "core.autostage staged the repro's files"
    assert _copy(root, tmp_path, "after-repro") == fresh

    # A developer who committed the results (as `prefshift sweep` suggests) still gets a fresh clone.
    (root / "reports" / "metrics" / "teacher").mkdir(parents=True, exist_ok=True)
    (root / "reports" / "metrics" / "teacher" / "seed-0.json").write_text('{"acc": 1}\n', encoding="utf-8")
    run(["git", "add", "-f", "dvc.lock", "data/.gitignore", "reports/metrics"], root, env)
    run(["git", "commit", "-qm", "results"], root, env)
    assert "dvc.lock" in committed_files(root) and "data/.gitignore" in committed_files(root)
    assert _copy(root, tmp_path, "after-commit") == fresh


def test_the_copy_runs_uncommitted_edits_of_committed_sources_but_not_untracked_files(checkout, tmp_path):
    root, _ = checkout
    module = root / "src" / "prefshift" / "core" / "errors.py"
    original = module.read_bytes()
    try:
        module.write_bytes(original + b"\n# edited, not committed\n")
        (root / "src" / "prefshift" / "scratch.py").write_text("x = 1\n", encoding="utf-8")
        copied = _copy(root, tmp_path, "edited")
    finally:
        module.write_bytes(original)
        (root / "src" / "prefshift" / "scratch.py").unlink()
    assert copied["src/prefshift/core/errors.py"].endswith(b"# edited, not committed\n")
    assert "src/prefshift/scratch.py" not in copied


def test_the_real_checkout_gives_no_pipeline_output_whatever_its_state(tmp_path):
    copied = copy_project_sources(REPO, tmp_path)
    assert "dvc.yaml" in copied and "params.yaml" in copied
    outputs = ("data/", "models/", "reports/metrics")
    assert [rel for rel in copied if rel == "dvc.lock" or rel.startswith(outputs)] == []


def test_a_checkout_without_a_commit_is_refused_with_its_path(tmp_path):
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    with pytest.raises(BenchError, match=str(tmp_path)):
        committed_files(tmp_path)
