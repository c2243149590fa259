"""Grid files (`--grid-file`): blocks of axes and bundles, the paper's grid, the dry run's estimate."""

from __future__ import annotations

import pytest
import yaml
from typer.testing import CliRunner

from e2e_project import REPO
from prefshift.cli import app
from prefshift.pipeline.sweep import SweepError
from prefshift.pipeline.sweep_grid_file import estimate, load_grid_file

SMALL = {
    "bundles": {"setting": {"a": {"data.category": "harmless"}, "b": {"data.category": "helpful"}}},
    "blocks": [
        {
            "name": "methods",
            "axes": {"setting": ["a", "b"], "seed": [1, 2]},
            "set": {"methods": ["naive", "anchor_last"]},
        },
        {
            "name": "lambda",
            "axes": {"setting": ["a"], "anchor.lambda": [0.01]},
            "set": {"methods": ["anchor_last"]},
        },
    ],
    "estimate": {
        "data_axis": "setting",
        "rate_axis": "setting",
        "data": {
            "a": {"train_pairs": 1000, "tokens_per_sequence": 100},
            "b": {"train_pairs": 2000, "tokens_per_sequence": 50},
        },
        "rates": {"a": {"weak": 100, "strong": 10, "source": "made up"}, "b": {"weak": 100, "strong": 20}},
    },
}


def test_blocks_expand_bundles_and_the_estimate_adds_up_by_hand(tmp_path):
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump(SMALL))
    grid = load_grid_file(path)
    assert len(grid.points) == 5
    assert grid.points[0] == {"data.category": "harmless", "seed": "1", "methods": '["naive","anchor_last"]'}
    assert grid.labels[-1] == {"setting": "a", "anchor.lambda": "0.01", "methods": '["anchor_last"]'}
    cost = estimate(grid, REPO / "params.yaml")
    # a: 1000 pairs -> 500 per side of the split x 2 sequences x 100 tokens = 100,000 tokens per training
    # b: 2000 -> 1000 x 2 x 50 = 100,000 tokens. Teachers: 5 x 100,000 / 100 tokens/s = 5,000 s.
    # Students: a: (2 + 2 + 1) x 100,000 / 10 = 50,000 s; b: (2 + 2) x 100,000 / 20 = 20,000 s.
    assert (cost.points, cost.student_runs) == (5, 9)
    assert cost.teacher_hours == pytest.approx(5000 / 3600) and cost.student_hours == pytest.approx(
        70000 / 3600
    )
    assert "rates (a): made up" in cost.lines() and "rates (b): no source given" in cost.lines()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"blocks": [{"axes": {"setting": ["c"]}}]}, "setting 'c' is not in bundles.setting"),
        ({"blocks": []}, "must list at least one block"),
        ({"grid": 1}, "unknown key"),
        ({"blocks": [{"axes": {"seed": 3}}]}, "axis 'seed' needs a list"),
    ],
)
def test_bad_grid_files_are_refused_naming_the_file(tmp_path, change, message):
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump({**SMALL, **change}))
    with pytest.raises(SweepError, match=message) as err:
        load_grid_file(path)
    assert str(path) in str(err.value)


def test_the_paper_grid_dry_run_prints_its_points_estimate_and_sbatch_script(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    args = ["sweep", "--grid-file", str(REPO / "configs" / "paper-grid.yaml"), "--executor", "slurm"]
    args += ["--gpus-per-task", "1", "--time", "12:00:00", "--dry-run", "--root", str(REPO)]
    args += ["--scratch", str(tmp_path / "scratch")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, (result.stdout, result.stderr)
    out = result.stdout
    # 6 settings x 2 families x 3 seeds = 36 cells: methods, robust fine-tuning, and 5 lambdas.
    assert "points: 252" in out and "trainings: 792 students, 252 teachers" in out
    assert "estimated GPU-hours (training only): " in out and "rates (llama): on paper:" in out
    assert (
        "#SBATCH --array=0-251\n" in out
        and "#SBATCH --gres=gpu:1\n" in out
        and "#SBATCH --time=12:00:00" in out
    )
    assert "note: the sweep itself would stop here" in out  # the default sqlite URI, said before submitting
    assert not (tmp_path / "scratch").exists()  # a dry run writes nothing
