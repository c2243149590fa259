"""Grid files (`--grid-file`): blocks of axes and bundles, the paper's grid, the dry run's estimate."""

from __future__ import annotations

import time

import pytest
import yaml
from typer.testing import CliRunner

from e2e_project import REPO
from prefshift.cli import app
from prefshift.pipeline.sweep.commands import SweepError
from prefshift.pipeline.sweep.grid import check_distinct
from prefshift.pipeline.sweep.grid_file import estimate, load_grid_file

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
    cost = estimate(grid, check_distinct(REPO / "params.yaml", grid.points))
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
        ({"blocks": []}, "blocks: List should have at least 1 item"),
        ({"grid": 1}, "grid: unknown key"),
        ({"blocks": [{"axes": {"seed": 3}}]}, r"blocks\.0\.axes\.seed: Input should be a valid list"),
        ({"blocks": [{"axes": {"seed": []}}]}, r"blocks\.0\.axes\.seed: List should have at least 1 item"),
        ({"blocks": ["lambda"]}, r"blocks\.0: Input should be a valid dictionary"),
        ({"bundles": {"setting": ["a"]}}, r"bundles\.setting: Input should be a valid dictionary"),
        (
            {"estimate": {**SMALL["estimate"], "data": {"a": {"train_pairs": "many"}}}},
            r"data\.a\.train_pairs",
        ),
        ({"estimate": {**SMALL["estimate"], "rates": {"a": {"weak": -1, "strong": 1}}}}, "greater than 0"),
    ],
)
def test_bad_grid_files_are_refused_naming_the_file(tmp_path, change, message):
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump({**SMALL, **change}))
    with pytest.raises(SweepError, match=message) as err:
        load_grid_file(path)
    assert str(path) in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("bundles", "block", "sources"),
    [
        (
            {"model": {"a": {"seed": 3}}},
            {"axes": {"seed": [1, 2], "model": ["a"]}},
            "axis seed sets seed and axis model (bundles.model.a) sets seed",
        ),
        ({}, {"axes": {"seed": [1, 2]}, "set": {"seed": 5}}, "axis seed sets seed and `set` sets seed"),
        (
            {"model": {"a": {"anchor.lambda": 1}}},
            {"axes": {"model": ["a"]}, "set": {"anchor": {"lambda": 2}}},
            "`set` sets anchor and axis model (bundles.model.a) sets anchor.lambda",
        ),
        (  # one bundle of two clashes with the other axis: the point that takes it is refused
            {"x": {"a": {"seed": 1}}, "y": {"b": {"methods": ["naive"]}, "c": {"seed": 2}}},
            {"axes": {"x": ["a"], "y": ["b", "c"]}},
            "axis x (bundles.x.a) sets seed and axis y (bundles.y.c) sets seed",
        ),
        (  # within one bundle, and within `set`
            {"x": {"a": {"anchor": {"lambda": 1}, "anchor.layers": "last"}}},
            {"axes": {"x": ["a"]}},
            "axis x (bundles.x.a) sets anchor and axis x (bundles.x.a) sets anchor.layers",
        ),
        (
            {},
            {"axes": {"seed": [1]}, "set": {"student.lr": 1, "student": {}}},
            "`set` sets student and `set`",
        ),
    ],
)
def test_a_param_set_twice_in_a_point_is_refused_not_overridden(tmp_path, bundles, block, sources):
    """An axis, a bundle and `set` naming one param (or one inside another) in a block: the last won
    in silence, so `seed: [1, 2]` with `set: {seed: 5}` ran seed 5 alone, under labels saying 1 and
    2 (and the GPU-hour estimate counted both)."""
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump({"bundles": bundles, "blocks": [{"name": "b", **block}]}, sort_keys=False))
    with pytest.raises(SweepError, match="one would override the other in silence") as err:
        load_grid_file(path)
    assert str(err.value).startswith(f"{path}: block 1 (b): {sources}")


def test_blocks_may_set_one_param_differently_and_keys_that_only_share_letters_are_apart(tmp_path):
    """Blocks may overlap; `seed` and `seeds`, `student.lr` and `student.lr_head` are two params;
    two bundles of one axis may set `anchor` and `anchor.lambda`, never in one point."""
    path = tmp_path / "grid.yaml"
    bundles = {"x": {"a": {"anchor": {"lambda": 1}}, "b": {"anchor.lambda": 2}}}
    blocks = [
        {"axes": {"seed": [1]}, "set": {"seeds": [1, 2]}},
        {"axes": {"anchor.lambda": [1]}, "set": {"seed": 2}},
        {"axes": {"x": ["a", "b"], "student.lr": [1]}, "set": {"student.lr_head": 2}},
    ]
    path.write_text(yaml.safe_dump({"bundles": bundles, "blocks": blocks}))
    assert load_grid_file(path).points == [
        {"seed": "1", "seeds": "[1,2]"},
        {"anchor.lambda": "1", "seed": "2"},
        {"anchor": '{"lambda":1}', "student.lr": "1", "student.lr_head": "2"},
        {"anchor.lambda": "2", "student.lr": "1", "student.lr_head": "2"},
    ]


def test_an_empty_bundle_sets_nothing_and_a_point_that_sets_nothing_is_refused(tmp_path):
    """An empty bundle (the baseline's values) set a param named after its axis: `lora=on`, refused
    as an unknown param."""
    path = tmp_path / "grid.yaml"
    bundles = {"lora": {"on": {}, "off": {"student.lora.enabled": False}}}
    path.write_text(
        yaml.safe_dump({"bundles": bundles, "blocks": [{"axes": {"lora": ["on", "off"], "seed": [1]}}]})
    )
    grid = load_grid_file(path)
    assert grid.points == [{"seed": "1"}, {"student.lora.enabled": "false", "seed": "1"}]
    assert grid.labels[0] == {"lora": "on", "seed": "1"}
    path.write_text(yaml.safe_dump({"bundles": bundles, "blocks": [{"name": "n", "axes": {"lora": ["on"]}}]}))
    with pytest.raises(
        SweepError, match=r"block 1 \(n\): point \{'lora': 'on'\} sets no param: it is the baseline"
    ):
        load_grid_file(path)


def _refused(args: list[str]) -> str:
    """A sweep command that must end with exit 2 and one line, no traceback; that line."""
    result = CliRunner().invoke(app, ["sweep", *args, "--dry-run", "--root", str(REPO)])
    assert result.exit_code == 2, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
    return result.stderr


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"blocks:\n  - axes: {seed: [1, 2]}\n    name: \xff\xfe\n", "not UTF-8 text (byte 43)"),
        (b"blocks: [{axes: {seed: [1]}, set: 3}]\n", "blocks.0.set: Input should be a valid dictionary"),
        (b"blocks: 7\n", "blocks: Input should be a valid list"),
        (b"description: [1]\nblocks: [{axes: {seed: [1]}}]\n", "description: Input should be a valid string"),
        (b"- a\n- b\n", "(top level): Input should be a valid dictionary"),
    ],
)
def test_an_unreadable_or_mistyped_grid_file_is_one_line(tmp_path, content, message):
    path = tmp_path / "grid.yaml"
    path.write_bytes(content)
    assert message in _refused(["--grid-file", str(path)])


def test_a_grid_file_that_is_no_regular_file_is_refused(tmp_path):
    assert "not a regular file" in _refused(["--grid-file", str(tmp_path)])
    assert "not a regular file" in _refused(["--grid-file", "/dev/zero"])


def test_a_million_point_grid_is_refused_within_seconds_with_the_bound(tmp_path):
    """Before, 1,000 x 1,000 values in a grid file printed nothing for minutes and grew past 1 GB."""
    values = list(range(1000))
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump({"blocks": [{"axes": {"anchor.lambda": values, "seed": values}}]}))
    spec = f"anchor.lambda={','.join(map(str, values))}"
    for args in (["--grid-file", str(path)], ["-S", spec, "-S", spec.replace("anchor.lambda", "seed")]):
        started = time.monotonic()
        line = _refused(args)
        elapsed = time.monotonic() - started
        assert "1,000,000 grid points, more than the 1,000 a sweep takes" in line
        assert "a sweep takes at most 100,000: split the grid" in line
        assert elapsed < 5, f"{elapsed:.1f} s to refuse"
    raised = CliRunner().invoke(
        app, ["sweep", "-S", "anchor.lambda=1,2,3", "--max-points", "2", "--dry-run", "--root", str(REPO)]
    )
    assert raised.exit_code == 2 and "3 grid points, more than the 2" in raised.stderr
    assert "pass --max-points 3 if you mean it" in raised.stderr
    allowed = CliRunner().invoke(
        app, ["sweep", "-S", "anchor.lambda=1,2,3", "--max-points", "3", "--dry-run", "--root", str(REPO)]
    )
    assert allowed.exit_code == 0 and "points: 3" in allowed.stdout


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
    assert "--array=0-251 " in out and " --gres=gpu:1 --time=12:00:00\n" in out
    assert "note: the sweep itself would stop here" in out  # the default sqlite URI, said before submitting
    assert not (tmp_path / "scratch").exists()  # a dry run writes nothing


def test_values_yaml_reads_as_dates_or_numbers_become_the_points_text(tmp_path):
    """A date in an axis (YAML reads `2024-01-01` as one) ended the sweep in a TypeError; `1e-5` is
    a number, as DVC reads it, where PyYAML read the text."""
    path = tmp_path / "grid.yaml"
    path.write_text(
        "blocks:\n  - axes:\n      tracking.experiment: [2024-01-01, x]\n      anchor.lambda: [1e-5]\n"
    )
    points = load_grid_file(path).points
    assert points == [
        {"tracking.experiment": "2024-01-01", "anchor.lambda": "1e-05"},
        {"tracking.experiment": "x", "anchor.lambda": "1e-05"},
    ]
