"""`prefshift sweep`: the grid and its bounds, names, records, the baseline, and the workflow
docs/sweeps.md gives, run verbatim on a one-stage project. Stopping and resuming under every
executor is test_sweep_executors.py's; the real one-point lambda sweep on the reproduced pipeline
is in test_pipeline_e2e.py, beside the tests it shares that pipeline with."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e_project import REPO
from e2e_project import run as _run
from prefshift.core import locks
from prefshift.core.errors import PrefshiftError
from prefshift.pipeline.sweep.commands import SweepError
from prefshift.pipeline.sweep.grid import POINTS_CEILING, experiment_name, grid_points, parse_grid
from prefshift.pipeline.sweep.record import SweepRecord, create, open_folder
from prefshift.pipeline.sweep.results import sweep_filename
from prefshift.pipeline.sweep.run import Executor
from prefshift.pipeline.sweep_points import ablation_keys, replicate_seed
from proc_support import processes

BIN = Path(sys.executable).parent
GIT_ID = {f"GIT_{w}_{x}": "t" for w in ("AUTHOR", "COMMITTER") for x in ("NAME", "EMAIL")}


def _record(folder: Path, points: list, names: list) -> SweepRecord:
    """A new sweep record holding every field its readers check, as `start` writes it."""
    data = {"root": str(folder), "baseline": "0" * 40, "points": points, "names": names, "methods": ["naive"]}
    data.update(report=False, tracking_uri="sqlite:///mlflow.db", git_remote=str(folder), dvc_cache=None)
    return create(folder, {**data, "executor": dataclasses.asdict(Executor())})


def test_grid_keeps_list_values_whole_and_crosses_axes():
    grid = parse_grid(["anchor.lambda=1e-4, 1", "anchor.mid_fractions=[0.25,0.5],[0.75]"])
    assert grid == {"anchor.lambda": ["1e-4", "1"], "anchor.mid_fractions": ["[0.25,0.5]", "[0.75]"]}
    assert grid_points(grid) == [
        {"anchor.lambda": "1e-4", "anchor.mid_fractions": "[0.25,0.5]"},
        {"anchor.lambda": "1e-4", "anchor.mid_fractions": "[0.75]"},
        {"anchor.lambda": "1", "anchor.mid_fractions": "[0.25,0.5]"},
        {"anchor.lambda": "1", "anchor.mid_fractions": "[0.75]"},
    ]


def test_seed_and_methods_make_a_replicate_and_anything_else_an_ablation():
    assert replicate_seed({"seed": 2}) == 2
    assert replicate_seed({"seed": 2, "methods": ["naive", "anchor_last"]}) == 2
    assert (
        replicate_seed({"seed": 2, "anchor.lambda": 1.0}) is None and replicate_seed({"methods": []}) is None
    )
    assert ablation_keys({"seed": 2, "methods": ["naive"], "anchor.lambda": 1.0}) == {"anchor.lambda"}


def test_names_are_readable_and_ref_safe():
    assert experiment_name({"anchor.lambda": "1e-4"}) == "sweep-anchor.lambda-1e-4"
    assert experiment_name({"anchor.mid_fractions": "[0.25, 0.5]"}) == "sweep-anchor.mid_fractions-0.25_0.5"
    assert sweep_filename("anchor_mid", {"anchor.mid_fractions": [0.25, 0.5]}) == (
        "anchor_mid__anchor.mid_fractions=[0.25,0.5].json"
    )


def test_filed_record_names_fit_a_file_name_and_keep_the_names_filed_before():
    """The paper grid's points set a dozen params, so every record's name ran past 255 bytes and
    `collect` failed with "file name too long" once every point had run. A name past MAX_FILENAME
    is now cut and ends in a hash of the whole; one that fits keeps the name it was filed under
    before (a second name for one record would count it twice in the report)."""
    import hashlib

    from prefshift.pipeline.sweep.grid import capped, dvc_value
    from prefshift.pipeline.sweep.grid_file import load_grid_file
    from prefshift.pipeline.sweep.results import MAX_FILENAME

    assert sweep_filename("naive", {"backbone.weak.name_or_path": "a/b"}) == (
        'naive__backbone.weak.name_or_path="a_b".json'
    )
    fits = "naive__" + "x" * (MAX_FILENAME - len("naive__.json")) + ".json"
    assert sweep_filename("naive", {}).startswith("naive") and len(fits.encode()) == MAX_FILENAME
    long = sweep_filename("naive", {"note": "é" * 300, "seed": 1})
    assert len(long.encode()) == MAX_FILENAME and long.startswith('naive__note="\\u00e9\\u00e9')
    assert capped("é" * 300, 101) == "é" * 44 + "-" + hashlib.sha256(("é" * 300).encode()).hexdigest()[:12]
    grid, baseline = load_grid_file(REPO / "configs" / "paper-grid.yaml"), (REPO / "params.yaml").read_text()
    names = [
        sweep_filename(method, {key: dvc_value(baseline, key, text) for key, text in point.items()})
        for point in grid.points
        for method in ("naive", "anchor_last", "anchor_mid")
    ]
    assert len(set(names)) == len(names) == 3 * len(grid.points)
    assert max(len(name.encode()) for name in names) <= MAX_FILENAME


@pytest.mark.parametrize("value", ["org/modèle", "a#b", "x=y", "~", "range(1,3)"])
def test_a_value_dvc_cannot_parse_is_refused_before_anything_runs(value):
    """`dvc exp run -S` parses values with Hydra's grammar, which refuses some unquoted text that
    YAML takes: every point then failed after the queue, showing DVC's help banner. The checks now
    parse as DVC does and name the fix; quoted, the value passes."""
    from prefshift.pipeline.sweep.grid import check_distinct

    point = {"backbone.weak.name_or_path": value}
    with pytest.raises(SweepError, match=r"^-S backbone\.weak\.name_or_path=.*quote it as a string: -S "):
        check_distinct(REPO / "params.yaml", [point])
    check_distinct(REPO / "params.yaml", [{"backbone.weak.name_or_path": f"'{value}'"}])


@pytest.mark.parametrize(
    "text",
    [
        "range(1,4)",
        "range(0.5, 2, 0.5)",
        " range(3)",
        "choice(0.5, 2)",
        "choice([1,2],[3], abc, 'q,r', 1e-4)",
    ],
)
def test_range_and_choice_expand_as_dvc_s_own_sweeps_expand_them(text):
    """`dvc exp run -S 'x=range(1,4)' --queue` runs three experiments; prefshift cut the value at its
    commas into `range(1` and `4)`, and its refusal said to quote them. Each point's text is what
    DVC's own sweep expansion gives (dvc.utils.hydra.get_hydra_sweeps), a list's as typed."""
    from dvc.utils.hydra import get_hydra_sweeps

    dvc = [sweep["params.yaml"][0] for sweep in get_hydra_sweeps({"params.yaml": [f"seed={text}"]})]
    assert [f"seed={value}" for value in parse_grid([f"seed={text}"])["seed"]] == dvc
    assert parse_grid(["anchor.lambda=1e-4,int(3)"]) == {"anchor.lambda": ["1e-4", "int(3)"]}


@pytest.mark.parametrize(
    ("key", "says"),
    [
        (
            "other.yaml:anchor.lambda",
            "other.yaml is another params file; a sweep sets the params of params.yaml",
        ),
        ("+anchor.new", "+ adds or deletes a param, and a sweep sets params that params.yaml holds"),
        ("++anchor.lambda", "++ adds or deletes a param"),
        ("~anchor.lambda", "~ adds or deletes a param"),
    ],
)
def test_a_key_of_another_params_file_or_one_hydra_adds_or_deletes_is_refused_as_such(key, says):
    """DVC reads `-S file:key=v` as a param of another file and Hydra's `+key`, `++key` and `~key`
    as adding or deleting one; the refusal said to quote the value, or named `+anchor` an unknown
    section."""
    from prefshift.pipeline.sweep.grid import check_distinct

    with pytest.raises(SweepError, match=re.escape(f"-S {key}=2: {says}")):
        check_distinct(REPO / "params.yaml", [{key: "2"}])


@pytest.mark.parametrize(
    "text, read",
    [("1e-4", 0.0001), ("1e-5", 1e-05), ("yes", "yes"), ("'yes'", "yes"), ("off", "off"), ("1:20", "1:20"),
     ("'1e-5'", "1e-5"), ("[1e-5,on]", [1e-05, "on"]), ("true", True), ("010", "010"),
     ("Qwen/Qwen2.5-0.5B", "Qwen/Qwen2.5-0.5B")],
)  # fmt: skip
def test_a_value_is_read_as_the_point_s_stages_will_read_it(tmp_path, text, read):
    """DVC parses `-S` text with Hydra's grammar and writes it into the point's params.yaml as YAML
    1.2 (`yes`, `1e-05` bare). prefshift read that file as YAML 1.1 (`yes` true, `1e-05` a string), so
    `data.source=yes` failed every point and a swept λ of 1e-5 was filed as a string; it now reads
    it as DVC does. dvc_value agrees with DVC's own apply_overrides and its reader on a real file."""
    from dvc.utils.hydra import apply_overrides
    from dvc.utils.serialize import parse_yaml

    from prefshift.config.params import read_yaml
    from prefshift.pipeline.sweep.grid import dvc_value

    (params := tmp_path / "params.yaml").write_text("data:\n  source: x\n")
    apply_overrides(params, [f"data.source={text}"])
    dvc_reads = parse_yaml(params.read_text(), str(params))["data"]["source"]
    assert (
        read_yaml(params.read_text(), "params")["data"]["source"]
        == dvc_reads
        == dvc_value("data:\n  source: x\n", "data.source", text)
    )
    assert dvc_reads == read


def test_a_mapping_merges_and_a_param_params_yaml_lacks_is_refused_as_dvc_does(tmp_path):
    """The checks set `-S anchor={lambda: 2}` as a new anchor section, where DVC merges it into the
    one params.yaml holds; and they took a param the file lacks, which DVC refuses (it sets only
    what the file holds), so every point failed once the sweep ran. Compared with DVC's own
    apply_overrides on a real file."""
    from dvc.exceptions import InvalidArgumentError
    from dvc.utils.hydra import apply_overrides

    from prefshift.config.params import read_yaml
    from prefshift.pipeline.sweep.grid import check_distinct, dvc_value

    text = (REPO / "params.yaml").read_text().replace("reference_batch_size: 16", "reference_batch_size: 4")
    (params := tmp_path / "params.yaml").write_text(text)
    apply_overrides(params, ["anchor={lambda: 2}"])
    merged = read_yaml(params.read_text(), "params")["anchor"]
    assert merged == dvc_value(text, "anchor", "{lambda: 2}")
    assert merged == {**read_yaml(text, "p")["anchor"], "lambda": 2} and merged["reference_batch_size"] == 4
    params.write_text(text)  # 4, not the default 16: set as a new section, the two points differed
    with pytest.raises(SweepError, match="give the same params"):  # one experiment, written two ways
        check_distinct(params, [{"anchor.lambda": "2"}, {"anchor": "{lambda: 2}"}])
    with pytest.raises(SweepError, match=r"DVC cannot set this value \(Could not override 'anchor'"):
        check_distinct(params, [{"anchor": "{lambda: 2, extra: 1}"}])  # a key the mapping there lacks

    lacking = "\n".join(line for line in text.splitlines() if "cache_max_gb" not in line) + "\n"
    (params := tmp_path / "params.yaml").write_text(lacking)
    with pytest.raises(InvalidArgumentError):
        apply_overrides(params, ["anchor.cache_max_gb=3"])
    with pytest.raises(
        SweepError, match=r"^-S anchor\.cache_max_gb=3: params\.yaml does not hold anchor\.cache_"
    ):
        check_distinct(params, [{"anchor.cache_max_gb": "3"}])
    with pytest.raises(PrefshiftError, match=r"anchor\.cache_max_gbs: unknown key"):  # misspelt: said so
        check_distinct(params, [{"anchor.cache_max_gbs": "3"}])


def test_a_value_the_stages_refuse_or_dvc_resolves_is_refused_before_anything_runs():
    from prefshift.pipeline.sweep.grid import check_distinct

    with pytest.raises(PrefshiftError, match=r"data\.source: Input should be a valid string \(got True\)"):
        check_distinct(REPO / "params.yaml", [{"data.source": "true"}])
    with pytest.raises(
        SweepError, match=r"^-S data\.source=\$\{seed\}: an interpolation, which DVC resolves"
    ):
        check_distinct(REPO / "params.yaml", [{"data.source": "${seed}"}])


def test_quoted_values_stay_whole_and_a_name_clash_says_why():
    from prefshift.pipeline.sweep.grid import check_distinct

    assert parse_grid(["data.source='a,b',\"c,'d\",[e,f]"]) == {"data.source": ["'a,b'", '"c,\'d"', "[e,f]"]}
    with pytest.raises(SweepError, match=r"get the same experiment name \(a name keeps letters, digits"):
        check_distinct(REPO / "params.yaml", grid_points(parse_grid(["tracking.experiment='é','ü'"])))


def test_the_clones_cache_path_is_written_whole_or_refused(tmp_path):
    """Written bare into each clone's config.local, a project path with a space, `#` or `,` sent
    the clone's cache elsewhere or failed it; one DVC's config cannot hold is refused by name."""
    from configobj import ConfigObj

    from prefshift.pipeline.sweep.baseline import cache_config

    for path in ("/w/my work#2,final/.dvc/cache", '/w/it\'s "q"/.dvc/cache'):
        assert ConfigObj(cache_config(path, tmp_path).splitlines())["cache"]["dir"] == path
    for path in ("/w/%(x)s/.dvc/cache", "/w/'''\"\"\"/.dvc/cache"):
        with pytest.raises(SweepError, match=r"DVC's config cannot hold this path .*move the project"):
            cache_config(path, tmp_path)


def test_a_clone_links_and_locks_as_the_project_s_own_config_says_and_gets_none_of_its_remotes(tmp_path):
    """A clone's config.local held the cache path alone: a project set to `cache.type hardlink`
    (or `cache.shared group` for a team's cache) had each clone copy every output it restored (or
    write the shared cache with the user's own permissions). Its remotes, credentials included,
    stay in the project: a task on one machine pulls and pushes no data."""
    from configobj import ConfigObj

    from prefshift.pipeline.sweep.baseline import cache_config

    (tmp_path / ".dvc").mkdir()
    own = tmp_path / ".dvc" / "config.local"
    own.write_text(
        '[core]\n    hardlink_lock = true\n[cache]\n    type = "hardlink,symlink"\n    shared = group\n'
        "    dir = ../elsewhere\n['remote \"s3\"']\n    url = s3://bucket/x\n    secret_access_key = SECRET\n"
    )
    written = cache_config("/w/project/.dvc/cache", tmp_path)
    assert "SECRET" not in written and "remote" not in written
    read = ConfigObj(written.splitlines())
    assert dict(read["cache"]) == {
        "type": "hardlink,symlink",
        "shared": "group",
        "dir": "/w/project/.dvc/cache",
    }
    assert dict(read["core"]) == {"hardlink_lock": "true"}
    own.write_text("[cache\n")
    with pytest.raises(SweepError, match=r"config.local: DVC cannot read it .*fix or remove it"):
        cache_config("/w/project/.dvc/cache", tmp_path)


NASTY_VALUES = [
    "2.",
    "1e-4.",
    "foo..bar",
    "...",
    "model.lock",
    ".lock",
    "a/b.lock",
    "@{u}",
    "a\\b",
    "x y~^:?*[",
]


def test_every_name_is_an_experiment_name_dvc_takes(tmp_path):
    """Before, `-S anchor.lambda=2.` (a YAML float) passed every check and failed in the point's
    `dvc exp run` ("Invalid exp name"), and again on every resume. DVC's own check of a name, on a
    real repository, over the values git refuses in a ref and 5,000 random strings of such characters."""
    import random

    from dvc.repo.experiments.refs import ExpRefInfo
    from dvc.repo.experiments.utils import check_ref_format
    from scmrepo.git import Git

    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    scm, rng, baseline = Git(str(tmp_path)), random.Random(0), "ab" + "c" * 38
    randoms = [
        "".join(rng.choice("./-_@{}:~^?*[ \\lock09") for _ in range(rng.randint(1, 10))) for _ in range(5000)
    ]
    for value in [*NASTY_VALUES, *randoms]:
        check_ref_format(scm, ExpRefInfo(baseline, experiment_name({"anchor.lambda": value})))
    for value in NASTY_VALUES:  # git itself agrees, through the ref the task reads
        ref = f"refs/exps/ab/{'c' * 38}/{experiment_name({'anchor.lambda': value})}"
        assert subprocess.run(["git", "check-ref-format", ref]).returncode == 0, value
    assert experiment_name({"anchor.lambda": "2."}) == "sweep-anchor.lambda-2_"
    assert (
        experiment_name({"backbone.strong.name_or_path": "m.lock"})
        == "sweep-backbone.strong.name_or_path-m_lock"
    )


def test_methods_to_collect_that_a_point_or_the_grid_does_not_train_are_refused_before_anything_runs(
    tmp_path,
):
    """Before, `--methods grm` (not in params.yaml's methods) or `-S methods=[naive] --methods
    anchor_last` ran every point, then failed when filing: no numbers for the method. And the paper
    grid, whose blocks train different methods, would have failed so after all 252 points: each
    point now files those of `--methods` that it trains."""
    from prefshift.pipeline.sweep.grid import check_distinct
    from prefshift.pipeline.sweep.run import start

    shutil.copy2(REPO / "params.yaml", tmp_path / "params.yaml")
    for specs, methods, message in (
        (["anchor.lambda=0.5,2"], ["grm"], "grid point 'anchor.lambda=0.5' trains none of --methods grm"),
        (
            ["methods=[naive],[anchor_last]"],
            ["anchor_last"],
            r"trains none of --methods anchor_last \(its methods: naive\)",
        ),
        (["anchor.lambda=0.5,2"], ["naive", "grm"], "^--methods grm: no grid point trains it"),
    ):
        with pytest.raises(SweepError, match=message) as err:
            start(tmp_path, grid_points(parse_grid(specs)), methods)  # no git or DVC here: refused first
        assert str(err.value).endswith("nothing was run") and "\n" not in str(err.value)
    check_distinct(
        tmp_path / "params.yaml", grid_points(parse_grid(["methods=[naive],[seam]"])), ["naive", "seam"]
    )


def test_a_cap_below_one_point_or_past_the_ceiling_is_refused():
    """Before, `--max-points -5` was taken as a cap ("more than the -5 a sweep takes"), and
    `--max-points 1000000000` let a dry run build points until memory ran out (883 MB in 20 s)."""
    for cap in (0, -5, POINTS_CEILING + 1, 10**9):
        with pytest.raises(
            SweepError, match=rf"^--max-points {cap}: give the most points a sweep may take, 1 to"
        ):
            grid_points({"seed": ["1"]}, cap)
    assert len(grid_points({"seed": ["1", "2"]}, POINTS_CEILING)) == 2


@pytest.mark.parametrize(
    ("specs", "message"),
    [
        ([], "nothing to sweep"),
        (["anchor.lambda"], "expected section.key=value"),
        (["anchor..lambda=1,2"], "has an empty part"),
        (["anchor.lambda=1,,2"], "empty value"),
        (["anchor.lambda=1", "anchor.lambda=2"], "given twice"),
        # one param set by two axes, either way round: the last won in silence
        (
            ["anchor.lambda=0.5,2", "seed=3", "anchor={lambda: 2}"],
            "-S anchor sets anchor and -S anchor.lambda",
        ),
        (["anchor={lambda: 2}", "anchor.lambda=0.5"], "-S anchor sets anchor and -S anchor.lambda sets"),
        # Hydra's sweeps that DVC does not expand, or that expand to nothing or past the ceiling
        (["seed=glob(*)"], r"glob\(\) is no sweep a grid takes; use range\(start, stop, step\), choice"),
        (["seed=interval(0,1)"], r"interval\(\) is no sweep a grid takes"),
        (["seed=range(3,1)"], "expands to no value"),
        (["seed=range(0,1000000000)"], "expands to more than 100,000 values"),
        (["seed=range(1,x)"], r"DVC cannot parse this sweep \(Error parsing override"),
    ],
)
def test_bad_grids_are_refused(specs, message):
    with pytest.raises(PrefshiftError, match=message):  # key errors come from config's -S parser
        parse_grid(specs)


@pytest.mark.parametrize(
    "specs",
    [
        ["anchor.lambda=1,1"],
        ["anchor.lambda=1,1.0"],
        ["anchor.lambda=1e-4,0.0001"],
        ["methods=[naive],['naive']"],
    ],
)
def test_grid_points_that_are_one_experiment_are_refused_before_anything_is_queued(tmp_path, specs):
    """Before, `-S anchor.lambda=1,1` queued two experiments of one name (and 1,1.0 two identical runs)."""
    from prefshift.pipeline.sweep.run import start

    shutil.copy2(REPO / "params.yaml", tmp_path / "params.yaml")
    with pytest.raises(SweepError, match="give the same params: list each value once") as err:
        start(tmp_path, grid_points(parse_grid(specs)), ["naive"])  # no git or DVC here: refused first
    assert "nothing was run" in str(err.value)


def test_distinct_points_pass_the_duplicate_check():
    from prefshift.pipeline.sweep.grid import check_distinct

    check_distinct(REPO / "params.yaml", grid_points(parse_grid(["anchor.lambda=1e-4,1e-2,1", "seed=1,2"])))


@pytest.mark.parametrize("subdir", ["", "ml"])
def test_uncommitted_baseline_names_lock_and_metrics_not_in_head_with_the_command(tmp_path, subdir):
    """Also for a project in a folder of its git repository (a monorepo's, `dvc init --subdir`): git
    names paths from the repository's top, so a project's uncommitted dvc.lock went unseen there and
    the command named paths (`ml/params.yaml`) that `git add` run in the project cannot find."""
    from prefshift.pipeline.sweep.baseline import check_committed, commit_command, uncommitted_baseline

    env = {**os.environ, **{f"GIT_{w}_{x}": "t" for w in ("AUTHOR", "COMMITTER") for x in ("NAME", "EMAIL")}}
    (root := tmp_path / subdir).mkdir(exist_ok=True)
    stages = {
        "ev": {"cmd": "true", "outs": ["scores"], "metrics": [{"reports/metrics/a.json": {"cache": False}}]},
        "report": {"cmd": "true", "metrics": [{"reports/metrics.json": {"cache": False}}]},
    }
    (root / "dvc.yaml").write_text(yaml.safe_dump({"stages": stages}))
    (root / "reports" / "metrics").mkdir(parents=True)
    for rel in ("reports/metrics/a.json", "reports/metrics.json"):
        (root / rel).write_text("{}\n")
    (root / "dvc.lock").write_text("schema: '2.0'\nstages: {}\n")
    (tmp_path / "README").write_text("the repository's\n")
    _run(["git", "init", "-q"], tmp_path, env)
    _run([str(Path(sys.executable).parent / "dvc"), "init", "-q", "--subdir"], root, env)
    _run(["git", "add", "dvc.yaml", ".dvc", "reports/metrics.json", str(tmp_path / "README")], root, env)
    _run(["git", "commit", "-qm", "base"], root, env)
    _run(["git", "add", "dvc.lock"], root, env)  # staged, as core.autostage leaves it: not in HEAD
    assert _opened(uncommitted_baseline, root) == ["dvc.lock", "reports/metrics/a.json"]
    (root / "reports" / "metrics.json").write_text('{"wrg": 1}\n')
    uncommitted = _opened(uncommitted_baseline, root)
    assert uncommitted == ["dvc.lock", "reports/metrics/a.json", "reports/metrics.json"]
    command = commit_command(uncommitted)
    assert command.startswith("git add dvc.lock reports/metrics/a.json reports/metrics.json && git commit")
    subprocess.run(command, shell=True, cwd=root, env=env, check=True, capture_output=True)
    assert _opened(uncommitted_baseline, root) == []
    (tmp_path / "README").write_text("changed: the clone of HEAD would not see it\n")
    with pytest.raises(SweepError) as refused:
        _opened(check_committed, root)
    outside = "../README" if subdir else "README"
    assert f"not committed: {outside};" in str(refused.value)
    subprocess.run(commit_command([outside]), shell=True, cwd=root, env=env, check=True, capture_output=True)
    _opened(check_committed, root)


def test_paths_with_a_space_a_non_ascii_or_a_glob_character_are_checked_as_the_names_they_are(tmp_path):
    """git quotes a name holding a space or a non-ASCII byte in `status --porcelain` (`"my metrics
    \\303\\251.json"`), so such an uncommitted metrics file passed unseen; and git took a path given
    it for a pattern, so for a stage reading `data[1]` an untracked `data1` was refused as its input.
    Run as given, the refusal's command leaves nothing to refuse."""
    from prefshift.pipeline.sweep.baseline import check_committed

    env, root = _git_env(), tmp_path / "project"
    (root / "reports").mkdir(parents=True)
    metrics = "reports/my metrics é.json"
    stages = {"report": {"cmd": "true", "deps": ["data[1]"], "metrics": [{metrics: {"cache": False}}]}}
    (root / "dvc.yaml").write_text(yaml.safe_dump({"stages": stages}, allow_unicode=True), encoding="utf-8")
    (root / metrics).write_text("{}\n")
    (root / "data[1]").write_text("read by the stage\n")
    (root / "dvc.lock").write_text("schema: '2.0'\nstages: {}\n")
    _run(["git", "init", "-q"], root, env)
    _run([str(BIN / "dvc"), "init", "-q"], root, env)
    _run(["git", "add", ".dvc", "dvc.yaml", "dvc.lock", "data[1]"], root, env)
    _run(["git", "commit", "-qm", "base"], root, env)
    (root / "data1").write_text("no stage reads it\n")
    with pytest.raises(SweepError) as refused:
        _opened(check_committed, root)
    assert f"not committed: {metrics};" in str(refused.value) and "data1" not in str(refused.value)
    for command in _advised(str(refused.value)):
        subprocess.run(command, shell=True, cwd=root, env=env, check=True, capture_output=True)
    _opened(check_committed, root)


def test_a_file_a_stage_reads_that_git_does_not_hold_and_no_stage_makes_is_refused(tmp_path):
    """A new module left out of `git add`, or the bytecode Python writes beside a source folder's
    modules: dvc.lock hashed them in the workspace, a point's clone of HEAD lacks them, and there each
    stage reading the folder reran without them, in every point. An output's files (restored from
    the cache) and what .dvcignore lists are no such input."""
    from prefshift.pipeline.sweep.baseline import check_committed, unversioned_inputs

    env = _git_env()
    stage = {"cmd": "true", "deps": ["src", "data"], "outs": ["data/made"]}
    (tmp_path / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"train": stage}}))
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "model.py").write_text("X = 1\n")
    (tmp_path / "data" / "made").mkdir(parents=True)
    (tmp_path / "data" / "made" / "out.txt").write_text("an output's file\n")
    (tmp_path / "dvc.lock").write_text("schema: '2.0'\nstages: {}\n")
    _run(["git", "init", "-q"], tmp_path, env)
    _run([str(BIN / "dvc"), "init", "-q"], tmp_path, env)
    (tmp_path / ".gitignore").write_text("__pycache__/\n/data/made\n")
    _run(["git", "add", "-A"], tmp_path, env)
    _run(["git", "commit", "-qm", "base"], tmp_path, env)
    assert _opened(unversioned_inputs, tmp_path) == []
    (tmp_path / "src" / "method.py").write_text("Y = 2\n")
    (tmp_path / "src" / "__pycache__").mkdir()
    (tmp_path / "src" / "__pycache__" / "model.cpython-311.pyc").write_bytes(b"\x00")
    expected = ["src/__pycache__/model.cpython-311.pyc", "src/method.py"]
    assert _opened(unversioned_inputs, tmp_path) == expected
    with pytest.raises(SweepError) as refused:
        _opened(check_committed, tmp_path)
    assert f"not committed: {', '.join(expected)};" in str(refused.value)
    assert "(or, for data, track it with `dvc add`; a file no stage needs goes in .dvcignore" in str(
        refused.value
    )
    (tmp_path / ".dvcignore").write_text("__pycache__/\n")
    _run(["git", "add", ".dvcignore", "src/method.py"], tmp_path, env)
    _run(["git", "commit", "-qm", "the module, and no bytecode in DVC's hashes"], tmp_path, env)
    _opened(check_committed, tmp_path)


def _advised(refusal: str) -> list[str]:
    """The commands a refusal of check_committed gives, in the order to run them: each submodule's
    own commit, innermost first, then the project's."""
    inside = re.findall(r"\(in submodule [^,]+, first its own: (.+?)\)(?= \(|$)", refusal)
    return [*inside, re.search(r"so commit first: (.+?)(?= \(|$)", refusal)[1]]


def test_a_submodule_s_edited_or_untracked_files_are_refused_with_the_commits_that_fix_them(tmp_path):
    """A clone checks out the commit each submodule records. Edits to a submodule's files were
    refused with `git add lib`, which records the submodule's commit and not the edits, so the same
    refusal came back; and a file a stage reads that the submodule's git does not hold passed
    unseen (git lists none of a submodule's files from outside it), and every point lacked it.
    Each now gets the commits that fix it, inside the submodules first (nested ones innermost
    first); run as given, they leave nothing to refuse."""
    from prefshift.pipeline.sweep.baseline import check_committed

    env, root, lib, vend = _git_env(), tmp_path / "project", tmp_path / "lib", tmp_path / "vend"
    for folder in (root, lib, vend):
        folder.mkdir()
        _run(["git", "init", "-q"], folder, env)
    for repo, name in ((vend, "v.txt"), (lib, "helper.txt")):
        (repo / name).write_text("1\n")
        if repo == lib:
            _run(
                ["git", "-c", "protocol.file.allow=always", "submodule", "-q", "add", str(vend), "vend"],
                lib,
                env,
            )
        _run(["git", "add", "-A"], repo, env)
        _run(["git", "commit", "-qm", "one"], repo, env)
    _run([str(BIN / "dvc"), "init", "-q"], root, env)
    stages = {"s": {"cmd": "true", "deps": ["lib/helper.txt", "lib/vend", "lib/data"]}}
    (root / "dvc.yaml").write_text(yaml.safe_dump({"stages": stages}))
    (root / "dvc.lock").write_text("schema: '2.0'\nstages: {}\n")
    _run(["git", "-c", "protocol.file.allow=always", "submodule", "-q", "add", str(lib), "lib"], root, env)
    _run(
        ["git", "-c", "protocol.file.allow=always", "submodule", "-q", "update", "--init", "--recursive"],
        root,
        env,
    )
    _run(["git", "add", "-A"], root, env)
    _run(["git", "commit", "-qm", "base"], root, env)
    _opened(check_committed, root)

    def refusal() -> str:
        with pytest.raises(SweepError) as refused:
            _opened(check_committed, root)
        return str(refused.value)

    def fix(refused: str) -> None:
        for command in _advised(refused):
            subprocess.run(command, shell=True, cwd=root, env=env, check=True, capture_output=True)
        _opened(check_committed, root)

    (root / "lib" / "unread.txt").write_text("no stage's concern\n")
    (root / "lib" / "helper.txt").write_text("2\n")
    refused = refusal()
    assert "not committed: lib;" in refused
    assert '(in submodule lib, first its own: git -C lib commit -a -m "For the sweep")' in refused
    fix(refused)
    assert "unread.txt" not in subprocess.run(["git", "ls-files"], cwd=root / "lib", capture_output=True,
                                               text=True, check=True).stdout  # fmt: skip
    (root / "lib" / "data").mkdir()
    (root / "lib" / "data" / "new.txt").write_text("read by the stage\n")
    (root / "lib" / "vend" / "w.txt").write_text("read by the stage too\n")
    refused = refusal()
    assert "not committed: lib/data/new.txt, lib/vend/w.txt;" in refused
    assert _advised(refused) == [
        'git -C lib/vend add w.txt && git -C lib/vend commit -m "For the sweep"',
        'git -C lib add data/new.txt vend && git -C lib commit -m "For the sweep"',
        'git add lib && git commit -m "Baseline results for the sweep"',
    ]
    fix(refused)
    _run(["git", "-C", "lib", "checkout", "-q", "--recurse-submodules", "HEAD~1"], root, env)  # not recorded
    refused = refusal()
    assert "not committed: lib;" in refused and "in submodule" not in refused
    fix(refused)


def test_the_files_dvc_builds_the_pipeline_from_are_refused_until_git_holds_them(tmp_path):
    """A `.dvc` file left out of `git add` (the step `dvc add` asks for), a folder's dvc.yaml and
    dvc.lock, a vars file: DVC read them in the workspace, and a point's clone of HEAD lacked them,
    so it had no stage making an input, or could not parse dvc.yaml, and every point failed. The
    refusal names each, and its command, run as given, leaves nothing to refuse. A vars file named
    from the project but outside its repository is refused by name."""
    from prefshift.pipeline.sweep.baseline import check_committed

    env, root = _git_env(), tmp_path / "project"
    root.mkdir()
    stage = {
        "cmd": "cat data/x sub/made.txt > ${out}",
        "deps": ["data/x", "sub/made.txt"],
        "outs": ["${out}"],
    }
    (root / "dvc.yaml").write_text(yaml.safe_dump({"vars": ["local.yaml"], "stages": {"s": stage}}))
    _run(["git", "init", "-q"], root, env)
    _run([str(BIN / "dvc"), "init", "-q"], root, env)
    _run(["git", "add", "-A"], root, env)
    _run(["git", "commit", "-qm", "sources"], root, env)
    (root / "local.yaml").write_text("out: both.txt\n")
    (root / "data").mkdir()
    (root / "data" / "x").write_text("data\n")
    _run([str(BIN / "dvc"), "add", "-q", "data/x"], root, env)
    (root / "sub").mkdir()
    made = {"cmd": "echo 1 > made.txt", "outs": ["made.txt"]}
    (root / "sub" / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"make": made}}))
    for lock in ("dvc.lock", "sub/dvc.lock"):
        (root / lock).write_text("schema: '2.0'\nstages: {}\n")
    with pytest.raises(SweepError) as refused:
        _opened(check_committed, root)
    assert "not committed: data/x.dvc, dvc.lock, local.yaml, sub/dvc.lock, sub/dvc.yaml;" in str(
        refused.value
    )
    for command in _advised(str(refused.value)):
        subprocess.run(command, shell=True, cwd=root, env=env, check=True, capture_output=True)
    _opened(check_committed, root)
    (tmp_path / "outside.yaml").write_text("more: 1\n")  # where no clone finds it
    (root / "dvc.yaml").write_text(
        yaml.safe_dump({"vars": ["local.yaml", "../outside.yaml"], "stages": {"s": stage}})
    )
    with pytest.raises(
        SweepError, match=r"^\.\./outside\.yaml: a vars file dvc.yaml names relative to the project but"
    ):
        _opened(check_committed, root)


def test_a_link_on_the_way_to_an_input_is_refused_where_a_clone_would_reach_other_files(tmp_path):
    """git holds a symbolic link as written, and a point's clone lies elsewhere: a relative link out
    of the repository (`data/raw -> ../../datasets/raw`) led nowhere there, and a link to a folder
    git does not hold led to nothing; every point failed. Both are refused, the first with the
    absolute link that fixes it; an absolute link leads to the same place from every clone. A link
    inside a folder a stage reads counts too: DVC follows it as it hashes the folder."""
    from prefshift.pipeline.sweep.baseline import check_committed

    env, root = _git_env(), tmp_path / "project"
    for folder in (tmp_path / "datasets" / "raw", root / "data" / "v3"):
        folder.mkdir(parents=True)
        (folder / "x.txt").write_text("data\n")
    (root / "data" / "raw").symlink_to("../../datasets/raw")
    (root / "data" / "cur").symlink_to("v3")
    (root / "data" / "abs").symlink_to(tmp_path / "datasets" / "raw")
    stage = {"cmd": "true", "deps": ["data/raw/x.txt", "data/cur", "data/abs"]}
    (root / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"s": stage}}))
    (root / "dvc.lock").write_text("schema: '2.0'\nstages: {}\n")
    _run(["git", "init", "-q"], root, env)
    _run([str(BIN / "dvc"), "init", "-q"], root, env)
    _run(["git", "add", ".dvc", "dvc.yaml", "dvc.lock", "data/raw", "data/cur", "data/abs"], root, env)
    _run(["git", "commit", "-qm", "base"], root, env)
    with pytest.raises(SweepError) as refused:
        _opened(check_committed, root)
    absolute = tmp_path / "datasets" / "raw"
    assert str(refused.value).startswith(
        "data/raw: a relative symbolic link out of the repository, on the way"
    )
    assert f"make it absolute (`ln -sfn {absolute} data/raw`, then commit it)" in str(refused.value)
    _run(["ln", "-sfn", str(absolute), "data/raw"], root, env)
    _run(["git", "commit", "-qam", "the link, absolute"], root, env)
    with pytest.raises(SweepError) as refused:
        _opened(check_committed, root)
    assert "not committed: data/v3/x.txt;" in str(refused.value)
    for command in _advised(str(refused.value)):
        subprocess.run(command, shell=True, cwd=root, env=env, check=True, capture_output=True)
    _opened(check_committed, root)
    (root / "lib").mkdir()  # a link inside a folder a stage reads: DVC follows it as it hashes the folder
    (root / "lib" / "x.txt").symlink_to("../../datasets/raw/x.txt")
    stage["deps"].append("lib")
    (root / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"s": stage}}))
    _run(["git", "add", "dvc.yaml", "lib"], root, env)
    _run(["git", "commit", "-qm", "a folder holding a link"], root, env)
    with pytest.raises(SweepError) as refused:
        _opened(check_committed, root)
    assert f"make it absolute (`ln -sfn {absolute / 'x.txt'} lib/x.txt`, then commit it)" in str(
        refused.value
    )


def test_a_link_inside_a_submodule_s_folder_a_stage_reads_is_refused_as_the_project_s_own(tmp_path):
    """git lists none of a submodule's files from outside it, so a relative link out of the
    repository inside a submodule's folder that a stage reads passed the link check, and only the
    trial clone caught it, with a general message. It gets the `ln -sfn` that fixes it, as a link
    of the project's own does."""
    from prefshift.pipeline.sweep.baseline import check_committed

    env, root, lib = _git_env(), tmp_path / "project", tmp_path / "lib"
    (tmp_path / "datasets").mkdir()
    (tmp_path / "datasets" / "x.txt").write_text("data\n")
    for folder in (root, lib / "data"):
        folder.mkdir(parents=True)
    (lib / "data" / "x.txt").symlink_to("../../../datasets/x.txt")  # as checked out in project/lib/data
    _run(["git", "init", "-q"], lib, env)
    _run(["git", "add", "-A"], lib, env)
    _run(["git", "commit", "-qm", "one"], lib, env)
    _run(["git", "init", "-q"], root, env)
    _run([str(BIN / "dvc"), "init", "-q"], root, env)
    (root / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"s": {"cmd": "true", "deps": ["lib/data"]}}}))
    (root / "dvc.lock").write_text("schema: '2.0'\nstages: {}\n")
    _run(["git", "-c", "protocol.file.allow=always", "submodule", "-q", "add", str(lib), "lib"], root, env)
    _run(["git", "add", "-A"], root, env)
    _run(["git", "commit", "-qm", "base"], root, env)
    with pytest.raises(SweepError) as refused:
        _opened(check_committed, root)
    absolute = tmp_path / "datasets" / "x.txt"
    assert f"make it absolute (`ln -sfn {absolute} lib/data/x.txt`, then commit it)" in str(refused.value)


def test_an_input_a_clone_reads_otherwise_than_the_workspace_is_refused_by_a_trial_clone(tmp_path):
    """A git filter only the workspace's own config sets up (nbstripout's way: `filter.<name>.clean`
    in .git/config, the file in .git/info/attributes) keeps one text in the workspace and another in
    git. A stage reading the file hashed the first, every point's clone reran it on the second, and
    `git status` showed nothing. A trial clone of the baseline, made before anything runs, sees
    each stage's inputs as DVC sees them in every point's clone; a folder DVC cannot hash there (a
    dangling link in it) is named, not a traceback."""
    from prefshift.pipeline.sweep.trial import changed_inputs

    env, root = _git_env(), tmp_path / "project"
    root.mkdir()
    _run(["git", "init", "-q"], root, env)
    _run([str(BIN / "dvc"), "init", "-q"], root, env)
    _run(["git", "config", "filter.strip.clean", "sed /SECRET/d"], root, env)
    _run(["git", "config", "filter.strip.smudge", "cat"], root, env)
    (root / ".git" / "info" / "attributes").write_text("*.txt filter=strip\n")
    shutil.copy2(REPO / "params.yaml", root / "params.yaml")  # a sweep reads it before its checks
    (root / "notes.txt").write_text("kept\nSECRET, which git never holds\n")
    stage = {"cmd": "wc -l notes.txt > count", "deps": ["notes.txt"], "outs": ["count"]}
    (root / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"report": stage}}))
    _run([str(BIN / "dvc"), "repro", "-q"], root, env)
    _run(["git", "add", "-A"], root, env)
    _run(["git", "commit", "-qm", "base"], root, env)
    (refused,) = _preflight(root)
    assert f"{root}: stage report's input notes.txt is modified in a clone of the baseline commit" in refused
    (root / "notes.txt").write_text("kept\n")  # what git holds, and so what a clone reads
    _run([str(BIN / "dvc"), "repro", "-q"], root, env)
    _run(["git", "commit", "-qam", "the baseline as a clone reads it"], root, env)
    assert _preflight(root) == []
    (root / "more").mkdir()  # a dangling link in a folder a stage reads: DVC fails to hash it
    (root / "more" / "gone.txt").symlink_to("nowhere.txt")
    stage["deps"].append("more")
    (root / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"report": stage}}))
    changed = _opened(changed_inputs, root)
    assert changed[("report", "more")] == "unreadable ([Errno 2] No such file or directory: 'more/gone.txt')"


def test_what_a_sweep_writes_in_the_workspace_needs_no_commit_before_the_next_sweep(tmp_path):
    """A sweep files its records in reports/sweeps/, which the report reads, and rebuilds the report.
    Checked like any input, or any tracked file, they refused the next sweep until a commit, and
    that commit made a new baseline, so the same sweep again ran every point instead of reusing the
    first one's experiments (docs/sweeps.md says it reruns nothing). New, edited, or recorded in
    dvc.lock and then left uncommitted, they pass. The report's metrics file (what `dvc exp show`'s
    baseline row reads) must still be committed, and a new file in another folder the report reads
    is still refused."""
    from prefshift.pipeline.sweep.baseline import check_committed

    env, root = _git_env(), tmp_path / "project"
    (root / "reports" / "sweeps").mkdir(parents=True)
    (root / "reports" / "sweeps" / "a.json").write_text('{"sweep": {"anchor.lambda": 1}}\n')
    (root / "code").mkdir()
    (root / "code" / "report.py").write_text("v1\n")
    stage = {
        "cmd": "ls reports/sweeps > summary.md && cat code/*.py > m.json",
        "deps": ["reports/sweeps", "code"],
        "outs": [{"summary.md": {"cache": False}}],
        "metrics": [{"m.json": {"cache": False}}],
    }
    _reproduced_and_committed(root, {"report": stage}, env)  # the report's outputs too
    (root / "reports" / "sweeps" / "a.json").write_text('{"sweep": {"anchor.lambda": 2}}\n')
    (root / "reports" / "sweeps" / "b.json").write_text('{"sweep": {"anchor.lambda": 3}}\n')
    (root / "summary.md").write_text("rebuilt with the ablation tables\n")
    assert _preflight(root) == []
    _run([str(BIN / "dvc"), "repro", "-q"], root, env)  # dvc.lock now holds the records' hash
    _run(["git", "commit", "-qm", "the report rebuilt", "dvc.lock"], root, env)
    assert _preflight(root) == []  # the trial clone: the records differ there, and need not match
    (root / "m.json").write_text("other numbers\n")
    with pytest.raises(SweepError, match=r"not committed: m\.json;"):
        _opened(check_committed, root)
    _run(["git", "checkout", "m.json"], root, env)
    (root / "code" / "new.py").write_text("read by the report\n")
    with pytest.raises(SweepError, match=r"not committed: code/new\.py;"):
        _opened(check_committed, root)


def test_a_cache_false_output_of_a_stage_a_point_skips_is_refused_until_git_holds_it(tmp_path):
    """No cache restores a `cache: false` output: a clone of a baseline that did not hold one reran
    its stage in every point, a shared stage, the cost a sweep exists to save. The target's own such
    outputs (it reruns in every point anyway) and those of a stage outside its pipeline (`promote`)
    need no commit. A pipeline without the target is refused: every point failed on it."""
    from prefshift.pipeline.sweep.baseline import check_committed, check_target, uncommitted_baseline

    env, root = _git_env(), tmp_path / "project"
    root.mkdir()
    stages = {
        "prep": {
            "cmd": "echo 1 > out.txt && echo a,b > plot.csv && mkdir -p figs && echo c > figs/f.csv",
            "outs": ["out.txt", {"plot.csv": {"cache": False}}, {"figs": {"cache": False}}],
        },
        "report": {
            "cmd": "cat out.txt > summary.md",
            "deps": ["out.txt"],
            "outs": [{"summary.md": {"cache": False}}],
        },
        "promote": {
            "cmd": "cat out.txt > chosen.json",
            "deps": ["out.txt"],
            "outs": [{"chosen.json": {"cache": False}}],
        },
    }
    (root / "dvc.yaml").write_text(yaml.safe_dump({"stages": stages}))
    _run(["git", "init", "-q"], root, env)
    _run([str(BIN / "dvc"), "init", "-q"], root, env)
    _run([str(BIN / "dvc"), "repro", "-q"], root, env)
    _run(["git", "add", "dvc.yaml", "dvc.lock", ".gitignore", ".dvc"], root, env)
    _run(["git", "commit", "-qm", "base"], root, env)
    assert _opened(uncommitted_baseline, root) == ["figs", "plot.csv"]  # a folder with a new file: whole
    with pytest.raises(SweepError, match=r"not committed: figs, plot\.csv;"):
        _opened(check_committed, root)
    _run(["git", "add", "figs", "plot.csv"], root, env)
    _run(["git", "commit", "-qm", "the shared stage's plot"], root, env)
    _opened(check_committed, root)
    _opened(check_target, root)
    stages["summarize"] = stages.pop("report")
    (root / "dvc.yaml").write_text(yaml.safe_dump({"stages": stages}))
    with pytest.raises(
        SweepError, match=r"no stage 'report' in dvc.yaml; each point runs `dvc exp run report`"
    ):
        _opened(check_target, root)


def test_a_stage_every_point_would_rerun_as_dvc_lock_is_behind_it_is_named_before_anything_runs(tmp_path):
    """A code change committed without `dvc repro`: dvc.lock is behind a shared stage's inputs, and
    every point reran that stage (a teacher trained once per point) without a word. The sweep now
    names such stages and the `dvc repro` that runs them once; the target's own inputs (it reruns in
    every point anyway) and a stage outside its pipeline (`promote`) are no concern."""
    from typer.testing import CliRunner

    from prefshift.cli import app

    env, root = _git_env(), tmp_path / "project"
    root.mkdir()
    stages = {
        "prep": {"cmd": "cat prep.py > out.txt", "deps": ["prep.py"], "outs": ["out.txt"]},
        "report": {
            "cmd": "cat out.txt report.py > summary.txt",
            "deps": ["out.txt", "report.py"],
            "outs": ["summary.txt"],
        },
        "promote": {
            "cmd": "cat out.txt promote.py > chosen.txt",
            "deps": ["out.txt", "promote.py"],
            "outs": ["chosen.txt"],
        },
    }
    for name in ("prep.py", "report.py", "promote.py"):
        (root / name).write_text("v1\n")
    _reproduced_and_committed(root, stages, env)
    assert _stale(root) == []
    for name in ("prep.py", "report.py", "promote.py"):
        (root / name).write_text("v2\n")
    _run(["git", "commit", "-qam", "code, no repro"], root, env)
    (note,) = _stale(root)
    assert note == (
        "prep: inputs changed since dvc.lock (prep's prep.py), so every point reruns them and the stages "
        "that follow; to run them once, first `dvc repro prep`, then commit dvc.lock"
    )
    dry = CliRunner().invoke(app, ["sweep", "-S", "anchor.lambda=0.5,2", "--root", str(root), "--dry-run"])
    assert dry.exit_code == 0 and f"note: {note}" in dry.stdout and "would stop here" not in dry.stdout
    _run([str(BIN / "dvc"), "repro", "-q", "prep"], root, env)
    _run(["git", "commit", "-qam", "prep, run once"], root, env)
    assert _stale(root) == []


def test_a_local_input_params_name_that_a_point_s_clone_would_lack_is_refused(tmp_path):
    """A model folder or dataset file named by a path relative to the project (`hf/strong`) and kept
    out of git: each point's `inputs` and `backbone` stages read it in the clone, where it is missing
    (or, given as `../`, lands elsewhere), and every point failed after the queue. One given whole,
    one git holds and one a stage makes pass."""
    from prefshift.config.params import load_params
    from prefshift.pipeline.sweep.baseline import unversioned_params_inputs

    env, root = _git_env(), tmp_path / "project"
    (root / "hf" / "strong").mkdir(parents=True)
    (root / "hf" / "strong" / "config.json").write_text("{}\n")
    (root / "models" / "made").mkdir(parents=True)
    (root / "models" / "made" / "config.json").write_text("{}\n")
    (tmp_path / "elsewhere").mkdir()
    stage = {"cmd": "true", "outs": ["models/made"]}
    (root / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"made": stage}}))
    (root / ".gitignore").write_text("/hf/\n/models/made\n")
    _run(["git", "init", "-q"], root, env)
    _run([str(BIN / "dvc"), "init", "-q"], root, env)

    def problems(strong: str, policy: str | None = None) -> list[str]:
        params = yaml.safe_load((REPO / "params.yaml").read_text())
        params["backbone"]["strong"]["name_or_path"] = strong
        params["downstream"]["policy"] = policy
        (root / "params.yaml").write_text(yaml.safe_dump(params))
        return _opened(unversioned_params_inputs, root, [load_params(root / "params.yaml")])

    (refused,) = problems("hf/strong")
    assert refused.startswith("hf/strong/config.json: a local input params name, which git does not hold")
    assert "give its path whole (absolute), or track it (`dvc add`, then commit)" in refused
    (refused,) = problems("tiny", "../elsewhere")
    assert refused.startswith("../elsewhere: a local input given relative to the project but outside its")
    assert problems(str(root / "hf" / "strong")) == []
    assert problems("tiny", "models/made") == []
    _run(["git", "add", "-f", "hf"], root, env)
    assert problems("hf/strong") == []
    (tmp_path / "elsewhere" / "strong").mkdir()
    (tmp_path / "elsewhere" / "strong" / "config.json").write_text("{}\n")
    (root / "linked").symlink_to("../elsewhere")  # git holds it as written; a clone lies elsewhere
    _run(["git", "add", "linked"], root, env)
    (refused,) = problems("linked/strong")
    assert refused.startswith("linked: a relative symbolic link out of the repository")
    (root / "linked").unlink()
    (root / "linked").symlink_to(tmp_path / "elsewhere")
    assert problems("linked/strong") == []


def test_a_check_that_fails_on_a_git_error_drops_no_other_check_s_refusal(tmp_path):
    """A sweep's start lists every refusal it earns at once. A git command failing inside one check
    (here a damaged .git/index, which DVC reads past) is that check's refusal: it once replaced every
    refusal the pipeline's checks had found, so a user fixed git, ran again and met the next one."""
    from prefshift.config.params import load_params
    from prefshift.pipeline.sweep.run import preflight

    env, root = _git_env(), tmp_path / "project"
    (root / "hf" / "strong").mkdir(parents=True)
    (root / "hf" / "strong" / "config.json").write_text("{}\n")
    _reproduced_and_committed(root, {"made": {"cmd": "echo made > out", "outs": ["out"]}}, env)
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["backbone"]["strong"]["name_or_path"] = "hf/strong"  # a local input: checked with git
    (root / "params.yaml").write_text(yaml.safe_dump(params))
    _run(["git", "commit", "-qam", "a local model"], root, env)
    (root / ".git" / "index").write_text("damaged\n")
    point, loaded = {"seed": "0"}, load_params(root / "params.yaml")
    problems, _ = preflight(root, [point], [loaded], ["naive"], Executor(), None)
    assert len(problems) == 3, problems
    assert all("index file smaller than expected" in problems[i] for i in (0, 2)), problems
    assert problems[1].startswith(f"{root}: no stage 'report' in dvc.yaml")


def test_a_point_s_stages_import_the_clone_s_prefshift_when_it_runs_from_the_project_s_repository(tmp_path):
    """Where the running prefshift lies in the project's repository (an editable install; for a
    project in a folder of it, anywhere in the repository), the stages import the point's clone's
    copy; installed from elsewhere, it is no part of the project and is left alone."""
    import prefshift
    from prefshift.pipeline.sweep.task import baseline_code

    package = Path(prefshift.__file__).resolve().parent
    top = package.parents[1]  # the repository a project holding this package would be, `src/` below
    for root, subdir in ((top, ""), (top / "ml", "ml"), (top / "a" / "ml", "a/ml")):
        record = _record(tmp_path / "sweeps", [{"seed": "1"}], ["sweep-seed-1"])
        record.data.update(root=str(root), subdir=subdir)
        record.__post_init__()
        assert baseline_code(record, 0) == str(record.clone(0) / package.parent.relative_to(top))
    record.data.update(root=str(tmp_path / "elsewhere"), subdir="")
    record.__post_init__()
    assert baseline_code(record, 0) is None


def test_python_bytecode_is_in_no_hash_of_prefshift_s_own_pipeline():
    """prefshift's stages read source folders (src/prefshift/config, src/prefshift/models), where
    any import of an editable install writes __pycache__/: a run that wrote it left every such stage
    "changed", and a sweep's clones reran them in every point. Its .dvcignore leaves bytecode out."""
    from dvc.repo import Repo

    with Repo(str(REPO)) as repo:
        folder = REPO / "src" / "prefshift" / "config" / "__pycache__"
        assert repo.dvcignore.is_ignored_dir(str(folder))
        assert repo.dvcignore.is_ignored_file(str(REPO / "src" / "prefshift" / "config" / "params.pyc"))


def test_a_workspace_the_sweep_cannot_start_from_is_refused_in_one_line_and_the_dry_run_says_so(
    tmp_path, monkeypatch
):
    """Before, a fresh clone without `dvc repro` was swept (every point computed every stage), a
    folder without git or DVC gave a git usage page or a NotDvcRepoError traceback, and `--dry-run`
    passed an uncommitted params.yaml that the sweep itself refuses."""
    from typer.testing import CliRunner

    from prefshift.cli import app

    for key, value in GIT_ID.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("PATH", f"{BIN}{os.pathsep}{os.environ['PATH']}")
    shutil.copy2(REPO / "params.yaml", tmp_path / "params.yaml")
    sweep = ["sweep", "-S", "anchor.lambda=0.5,2", "--root", str(tmp_path)]

    def refused(says: str) -> None:
        real, dry = CliRunner().invoke(app, sweep), CliRunner().invoke(app, [*sweep, "--dry-run"])
        assert real.exit_code == 2 and real.stderr.count("\n") == 1 and says in real.stderr, real.stderr
        assert (
            dry.exit_code == 0 and f"note: the sweep itself would stop here: {tmp_path}: {says}" in dry.stdout
        )
        assert not (tmp_path / ".prefshift").exists()

    refused("no git commit to start from")
    _run(["git", "init", "-q"], tmp_path, os.environ)
    _run(["git", "add", "-A"], tmp_path, os.environ)
    _run(["git", "commit", "-qm", "params"], tmp_path, os.environ)
    refused("not a DVC project (no .dvc)")
    _run(["dvc", "init", "-q"], tmp_path, os.environ)
    _run(["git", "commit", "-qm", "dvc"], tmp_path, os.environ)
    refused("no dvc.lock, so no baseline")
    (tmp_path / "dvc.yaml").write_text("stages: [\n")
    (tmp_path / "dvc.lock").write_text("schema: '2.0'\nstages: {}\n")
    _run(["git", "add", "-A"], tmp_path, os.environ)
    _run(["git", "commit", "-qm", "pipeline"], tmp_path, os.environ)
    refused("DVC cannot read the pipeline")
    (tmp_path / "dvc.yaml").write_text("stages:\n  report: {cmd: 'true'}\n")
    _run(["git", "commit", "-qam", "fixed"], tmp_path, os.environ)
    with (tmp_path / "params.yaml").open("a") as params:
        params.write("# an edit\n")
    refused("not committed: params.yaml")
    _run(["git", "checkout", "--", "params.yaml"], tmp_path, os.environ)
    (tmp_path / "dvc.yaml").write_text("stages:\n  summarize: {cmd: 'true'}\n")
    _run(["git", "commit", "-qam", "no report stage"], tmp_path, os.environ)
    refused("no stage 'report' in dvc.yaml; each point runs `dvc exp run report`")


def test_device_sets_are_disjoint_and_jobs_are_plain_slots(tmp_path, capsys):
    from prefshift.pipeline.sweep.local import Pool, Slots, parse_devices

    slots = Slots(1, parse_devices("0, 1,2,3,4"), per_task=2)
    assert slots.free == [("0", "1"), ("2", "3")] and slots.idle == ["4"]  # 4: no set, and said so
    assert Slots(1, ["0", "1"], per_task=2).idle == [] == Slots(2).idle
    record = _record(tmp_path / "sweeps", [{"seed": "1"}], ["sweep-seed-1"])
    Pool(record, slots).launch([])
    assert (
        f"sweep {record.id}: 2 point(s) at a time; device 4 left idle, short of a set"
        in capsys.readouterr().err
    )
    assert Slots(3).free == [None, None, None]
    for text, message in (
        ("0,0", "listed twice"),
        ("0,,1", "separated by commas"),
        ("", "separated by commas"),
    ):
        with pytest.raises(SweepError, match=message):
            parse_devices(text)
    with pytest.raises(SweepError, match="give 1 to 2"):
        Slots(1, ["0", "1"], per_task=3)
    with pytest.raises(SweepError, match="--jobs 0"):
        Slots(0)


def _devices_here(monkeypatch, given: str | None, count: int) -> None:
    """This shell's CUDA_VISIBLE_DEVICES (None: unset) and the machine's device count (no GPU here)."""
    import torch

    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    if given is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", given)


@pytest.mark.parametrize(
    ("given", "count", "text", "says"),
    [
        (None, 0, "0-3", "'0-3' is no device index or GPU-/MIG- UUID"),
        (None, 0, "0,1 2", "'1 2' is no device index"),
        (None, 0, "-1", "'-1' is no device index"),
        (None, 0, "0,gpu0", "'gpu0' is no device index"),
        (None, 0, "1,01", "listed twice"),
        (None, 4, "2,3,4,5", "device 4: this machine has 4 (0 to 3)"),
        (
            "4,5,6,7",
            4,
            "0,1",
            "device 0 is not among those this shell was given (CUDA_VISIBLE_DEVICES=4,5,6,7)",
        ),
        ("GPU-aa,GPU-bb", 2, "GPU-aa,GPU-cc", "device GPU-cc is not among those"),
    ],
)
def test_a_device_cuda_would_hide_or_another_job_holds_is_refused(monkeypatch, given, count, text, says):
    """CUDA reads CUDA_VISIBLE_DEVICES up to its first entry that is no device: `--gpus 0-3` (a
    range), `-1` or index 5 of four GPUs gave a task no device, and it trained on the CPU in
    silence. A device outside this shell's own CUDA_VISIBLE_DEVICES (a scheduler's allocation) is
    another job's, since a task's setting replaces that one."""
    from prefshift.pipeline.sweep.local import parse_devices

    _devices_here(monkeypatch, given, count)
    with pytest.raises(SweepError, match=re.escape(says)):
        parse_devices(text)


def test_several_gpus_per_point_are_said_to_leave_all_but_one_idle_unless_a_stage_launches_processes(
    tmp_path,
):
    """A point given two devices ran each stage as one process, on the first of them: prefshift's
    dvc.yaml starts no `accelerate launch`, and the docs' example asked for two per point."""
    from prefshift.pipeline.sweep import slurm
    from prefshift.pipeline.sweep.run import device_notes

    two = Executor("local-gpus", devices=("0", "1"), resources=slurm.SlurmResources(gpus_per_task=2))
    _run(["git", "init", "-q"], tmp_path, os.environ)
    _run([str(BIN / "dvc"), "init", "-q"], tmp_path, os.environ)
    for cmd, said in (("prefshift train --method naive", True), (["python prep.py", "torchrun x.py"], False)):
        (tmp_path / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"train": {"cmd": cmd}}}))
        notes = _opened(device_notes, tmp_path, two)
        assert bool(notes) == said, notes
    (tmp_path / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"train": {"cmd": "prefshift train"}}}))
    (note,) = _opened(device_notes, tmp_path, two)
    assert note.startswith(
        "--gpus-per-task 2: each stage of a point runs as one process and trains on the first"
    )
    assert _opened(device_notes, tmp_path, Executor("local-gpus", devices=("0", "1"))) == []
    assert _opened(device_notes, tmp_path, Executor(jobs=2)) == []


def test_jobs_on_a_gpu_machine_say_that_every_point_trains_on_the_first_device(tmp_path, monkeypatch, capsys):
    """`--executor local --jobs 2` on a machine with GPUs ran both points on its first device, side by
    side, without a word (the paper's 8-GPU machine ran 8 points on one)."""
    from prefshift.pipeline.sweep.local import Pool, Slots

    _devices_here(monkeypatch, None, 4)
    assert (Slots(2).shared, Slots(1).shared, Slots(1, ["0", "1"]).shared) == (4, 0, 0)
    record = _record(tmp_path / "sweeps", [{"seed": "1"}], ["sweep-seed-1"])
    Pool(record, Slots(2)).launch([])
    said = capsys.readouterr().err
    assert "2 point(s) at a time; each sees this machine's 4 GPU(s) and trains on the first" in said
    assert "--executor local-gpus --gpus gives each its own" in said
    _devices_here(monkeypatch, None, 0)
    assert Slots(2).shared == 0


@pytest.mark.parametrize(
    ("given", "count", "text", "devices"),
    [
        (None, 0, "0,1", ["0", "1"]),  # no CUDA here (the executor tests' fake list): taken as given
        (None, 4, " 00, 3", ["0", "3"]),
        (None, 2, "GPU-8a3c-11,MIG-9b/1/0", ["GPU-8a3c-11", "MIG-9b/1/0"]),
        ("4,5,6,7", 4, "6,7", ["6", "7"]),
    ],
)
def test_devices_this_machine_has_and_this_shell_was_given_pass(monkeypatch, given, count, text, devices):
    from prefshift.pipeline.sweep.local import parse_devices

    _devices_here(monkeypatch, given, count)
    assert parse_devices(text) == devices


def test_a_sweep_folder_is_its_user_s_alone(tmp_path):
    """Its record and the SLURM script carry the tracking URI, which may hold a password; they were
    readable by every user of a shared filesystem."""
    import stat

    record = _record(tmp_path, [{"seed": "1"}], ["a"])
    assert stat.S_IMODE(record.folder.stat().st_mode) == 0o700


def test_a_point_state_reads_silence_after_running_as_stopped():
    from prefshift.pipeline.sweep.record import point_state

    assert point_state({"state": "success"}, "running") == "success"  # a requeued finished task
    assert point_state({"state": "running"}, "running") == "running"
    assert point_state({}, "pending") == "pending"
    assert point_state({"state": "running"}, None) == "stopped"  # killed before it could say more
    assert point_state({"state": "failed"}, None) == "failed"
    assert point_state({}, None) == "missing"  # cancelled while pending


def test_sbatch_gets_the_sweep_s_own_options_and_the_resources_on_its_command_line(tmp_path):
    """The job's name (how squeue and scancel find the sweep's jobs), its array and its logs went in
    as `#SBATCH` lines, which a template's later line or an `SBATCH_*` variable overrode: a template
    naming the job hid it from the sweep, which started its points again beside the running ones.
    sbatch's command line wins over both, and takes each value as one argument (a newline in
    `--partition` wrote directives into the script; a space in the folder broke `--output`)."""
    from prefshift.core.reading import InputFileError
    from prefshift.pipeline.sweep.record import SweepRecord
    from prefshift.pipeline.sweep.slurm import SlurmResources, array_spec, render_script, sbatch_options

    template = tmp_path / "extra.sh"
    template.write_text("#SBATCH --qos=long\n#SBATCH --job-name=mine\nmodule load cuda\n")
    resources = SlurmResources(
        gpus_per_task=2, partition="gpu,gpu-long", time="1-00:00:00", account="lab", template=str(template)
    )
    resources.check()
    folder = tmp_path / "sweeps with space" / "s1"
    record = SweepRecord(folder, {"id": "s1", "points": [{}] * 5, "names": [], "jobs": []})
    options = sbatch_options(record, [0, 1, 2, 4], resources)
    assert options == [
        "--job-name=prefshift-s1",
        "--array=0-2,4",
        f"--output={folder}/logs/%a.log",
        f"--chdir={folder}",
        "--open-mode=append",
        "--gres=gpu:2",
        "--partition=gpu,gpu-long",
        "--time=1-00:00:00",
        "--account=lab",
    ]
    lines = render_script(
        record, [0, 1, 2, 4], resources, {"MLFLOW_TRACKING_URI": "http://h:5000"}
    ).splitlines()
    assert not [
        line for line in lines if line.startswith("#SBATCH") and "qos" not in line and "mine" not in line
    ]
    assert any("--job-name=prefshift-s1" in line for line in lines if line.startswith("# "))  # said, not set
    # The template's #SBATCH lines come before the first command, or sbatch would ignore them.
    first_command = lines.index("module load cuda")
    assert lines.index("#SBATCH --qos=long") < first_command < lines.index("set -euo pipefail")
    assert lines[-1].endswith(f'sweep task {shlex.quote(str(folder))} "$SLURM_ARRAY_TASK_ID"')
    assert array_spec([3, 1, 2, 7]) == "1-3,7"
    for bad, message in (
        (SlurmResources(time="12h"), "SLURM's form"),
        (SlurmResources(partition="debug\n#SBATCH --array=0-3"), "has no spaces"),
        (SlurmResources(account="my lab"), "has no spaces"),
        (SlurmResources(cpus_per_task=0), "give 1 or more"),
    ):
        with pytest.raises(SweepError, match=message):
            bad.check()
    with pytest.raises(InputFileError, match="sbatch template not found"):
        SlurmResources(template=str(tmp_path / "absent.sh")).check()
    (tmp_path / "latin1.sh").write_bytes(b"# caf\xe9\n")
    with pytest.raises(SweepError, match=rf"^{tmp_path / 'latin1.sh'}: not UTF-8 text"):
        SlurmResources(template=str(tmp_path / "latin1.sh")).check()


def test_a_job_script_path_that_is_a_link_is_refused_and_its_target_kept(tmp_path):
    """The job script went in with a plain write, through whatever stood at its path: a link there
    rewrote the file it named. It goes through the atomic writer, which replaces only what prefshift
    may replace, so the link's target is untouched and nothing reaches sbatch."""
    from prefshift.core.atomic import OutputError
    from prefshift.pipeline.sweep.record import SweepRecord
    from prefshift.pipeline.sweep.slurm import SlurmResources, submit

    folder = tmp_path / "s1"
    folder.mkdir()
    data = {"id": "s1", "points": [{}], "names": ["p"], "jobs": [], "tracking_uri": "x"}
    record = SweepRecord(folder, data)
    mine = tmp_path / "mine.sh"
    mine.write_text("my own script\n")
    (folder / "job-1.sbatch").symlink_to(mine)
    with pytest.raises(OutputError, match=r"job-1\.sbatch"):
        submit(record, [0], SlurmResources())
    assert mine.read_text() == "my own script\n"
    assert record.data["jobs"] == []


def test_a_sweep_folder_or_template_sbatch_would_misread_is_escaped_or_refused(tmp_path):
    """A `%` in the sweep folder's path (the project's, by default) was read by sbatch as a pattern
    in the logs' path, a `\\` turned the patterns off: every task's log went elsewhere and each point
    showed as never started. A line break in the folder's or the template's path ended the script's
    comment naming it, and ran the rest as commands."""
    from prefshift.pipeline.sweep.record import SweepRecord
    from prefshift.pipeline.sweep.slurm import SlurmResources, check_folder, render_script, sbatch_options

    folder = tmp_path / "lab%u" / "s1"
    record = SweepRecord(folder, {"id": "s1", "points": [{}], "names": [], "jobs": []})
    assert f"--output={tmp_path}/lab%%u/s1/logs/%a.log" in sbatch_options(record, [0], SlurmResources())
    check_folder(folder)
    for bad in ("back\\slash", "line\nbreak"):
        with pytest.raises(
            SweepError, match=r"^--scratch .*: holds .*, which sbatch cannot take in a log's path"
        ):
            check_folder(tmp_path / bad)
    injected = tmp_path / "x\ntouch PWNED\n#.sh"
    with pytest.raises(SweepError, match="a path with a line break"):
        SlurmResources(template=str(injected)).check()
    script = render_script(record, [0], SlurmResources(), {})
    assert "PWNED" not in script
    for limit in ("UNLIMITED", "infinite", "0", "30", "4:00:00", "1-12"):
        SlurmResources(time=limit).check()  # what sbatch takes


def test_a_sweep_submits_the_template_it_started_with_whatever_became_of_the_file(tmp_path):
    """A resume read the template's file again: removed, the sweep could not be resumed; edited, the
    resubmitted points ran under other directives than the first. The record keeps the text read at
    the start, and a resume that names a template reads that one."""
    from prefshift.pipeline.sweep.run import Executor
    from prefshift.pipeline.sweep.slurm import SlurmResources, render_script

    template = tmp_path / "extra.sh"
    template.write_text("#SBATCH --comment=first\n")
    started = Executor("slurm", resources=SlurmResources(template=str(template))).read()
    template.write_text("#SBATCH --comment=second\n")
    record = _record(tmp_path / "sweeps", [{"seed": "1"}], ["sweep-seed-1"])
    assert "--comment=first" in render_script(record, [0], started.resources, {})
    template.unlink()
    started.check()
    record.data["executor"] = dataclasses.asdict(started)
    kept = Executor.of(record)
    assert kept == started, "the record keeps the text"
    (other := tmp_path / "other.sh").write_text("#SBATCH --comment=third\n")
    resumed = started.changed(template=str(other)).read()
    assert "--comment=third" in render_script(record, [0], resumed.resources, {})


def test_a_long_point_gets_a_short_stable_name():
    from prefshift.pipeline.sweep.grid import MAX_NAME

    point = {f"backbone.strong.option_{i}": "meta-llama/Llama-3.1-8B" for i in range(6)}
    name = experiment_name(point)
    assert len(name) <= MAX_NAME and name == experiment_name(dict(point))
    assert name != experiment_name({**point, "seed": "2"})


def test_status_names_each_unfinished_point_with_why_and_its_log(tmp_path):
    import socket

    from prefshift.core.atomic import write_json
    from prefshift.pipeline.sweep.run import status_lines

    names = [f"sweep-seed-{i}" for i in range(4)]
    record = _record(tmp_path, [{"seed": str(i)} for i in range(4)], names)
    record.data["executor"] = {"kind": "local-gpus"}
    here = socket.gethostname()
    error = "`dvc exp run ...` failed (exit 1):\nRunning stage 'report':\nERROR: failed to reproduce 'report'"
    error += "\n\nHaving any troubles? Hit us up at https://dvc.org/support, we are always happy to help!\n"
    write_json(record.state_file(0), {"state": "success", "commit": "c" * 40})
    write_json(
        record.state_file(1), {"state": "failed", "step": "run", "error": error, "host": here, "pid": 1}
    )
    write_json(record.state_file(2), {"state": "running", "step": "run", "host": here, "pid": 2**22 + 1})
    lines = status_lines(record)
    assert lines[0] == "0  sweep-seed-0  success"
    assert lines[1] == (
        "1  sweep-seed-1  failed  (failed during run: ERROR: failed to reproduce 'report')  "
        f"log: {record.log(1)}"
    )
    assert lines[2].startswith(
        "2  sweep-seed-2  stopped  (ended during run without a word: cancelled, preempted"
    )
    assert lines[3] == f"3  sweep-seed-3  missing  (never started)  log: {record.log(3)}"


def test_status_says_a_point_ran_out_of_its_time_or_recomputed_what_dvc_could_not_pull(tmp_path):
    """A task SLURM ended at its --time showed as `stopped by a signal`, as a cancelled one does, so
    nothing said that the fix is more time. A point whose shared stages DVC could not pull from the
    remote (one the nodes do not reach) recomputed them and said `success` alone: on a cluster, a
    teacher retrained in every point."""
    from prefshift.core.atomic import write_json
    from prefshift.pipeline.sweep.record import TASK_HEADER
    from prefshift.pipeline.sweep.run import status_lines

    record = _record(tmp_path, [{"seed": "1"}, {"seed": "2"}], ["sweep-seed-1", "sweep-seed-2"])
    write_json(
        record.state_file(0), {"state": "stopped", "step": "run", "error": "stopped by a signal during run"}
    )
    record.log(0).write_text(
        f"{TASK_HEADER} s point 0 ===\nslurmstepd: error: *** JOB 2 ON node1 CANCELLED AT "
        "2026-12-06T17:00:00 DUE TO TIME LIMIT ***\n"
    )
    write_json(
        record.state_file(1), {"state": "success", "commit": "c" * 40, "unpulled": ["prepare", "teacher"]}
    )
    stopped, finished = status_lines(record)
    assert stopped.startswith(
        f"0  sweep-seed-1  stopped  (its job ran out of its time; `prefshift sweep resume {record.id} --time "
        "<longer>` goes on from its checkpoint)"
    )
    assert finished == (
        "1  sweep-seed-2  success (recomputed prepare, teacher: DVC could not pull them from the remote the "
        "sweep pushed the baseline to; check that the nodes reach it)"
    )


HOLD_LOCK = """
import sys, time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from prefshift.core import locks
locks.take(Path(sys.argv[1]), "holder", lambda holder: "taken")
print("held", flush=True)
time.sleep(120)
"""


def _hold(lock: Path) -> subprocess.Popen:
    """Another process holding lock file `lock` until killed."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(lock)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "held\n"
    return proc


def test_a_point_runs_while_its_task_holds_its_lock_whatever_its_pid_now_names(tmp_path):
    """A task killed before it could say more (SIGKILL, the OOM killer, a reboot) leaves `running`
    with its pid, which a later process may hold: pid 1 after a reboot, this test's own process
    here. Taken by pid, status said `running` for good and resume waited on it forever. A point is
    running while its task holds the point's lock, which the kernel drops with the process."""
    import socket

    from prefshift.core.atomic import write_json
    from prefshift.pipeline.sweep.run import point_states

    record = _record(tmp_path, [{"seed": str(i)} for i in range(3)], list("abc"))
    record.data["executor"] = {"kind": "local"}
    for index, pid in enumerate([1, os.getpid(), 2**22 + 1]):
        entry = {"state": "running", "step": "run", "host": socket.gethostname(), "pid": pid}
        write_json(record.state_file(index), entry)
    assert point_states(record) == {0: "stopped", 1: "stopped", 2: "stopped"}
    task = _hold(record.task_lock(2))
    try:
        assert point_states(record) == {0: "stopped", 1: "stopped", 2: "running"}
    finally:
        task.kill()
        task.wait()
    assert point_states(record)[2] == "stopped", "the kernel dropped the lock with its process"


def test_a_slurm_task_waits_for_its_point_s_lock_where_a_local_one_is_refused(tmp_path, monkeypatch):
    """A task killed alone leaves its dvc and stage working in the point's clone, holding the lock it
    handed down. SLURM tasks took no lock, so a resumed one started a second dvc in that clone on a
    cluster whose process tracking lets orphans outlive their job (proctrack/linuxproc). A SLURM
    task now waits for the lock, saying so; a local pool never starts a held point, so a local task
    finding one held is refused."""
    import threading

    from prefshift.core import locks
    from prefshift.pipeline.sweep import task

    record, said = _record(tmp_path, [{"seed": "1"}], ["a"]), []
    holder = _hold(record.task_lock(0))
    try:
        with pytest.raises(locks.LockedError, match=rf"point 0 of sweep {record.id} is being run by process"):
            task.take_point(record, 0, said.append)
        record.data["executor"]["kind"] = "slurm"
        monkeypatch.setattr(task, "LOCK_REPORT_S", 0.2)
        threading.Timer(3.0, holder.kill).start()  # past the first probe (PROBE_GRACE_S)
        lock = task.take_point(record, 0, said.append)
    finally:
        holder.kill()
        holder.wait()
    try:
        assert locks.held(record.task_lock(0))
    finally:
        os.close(lock)
    assert len(said) >= 2 and all(line.endswith("or what it started; waiting for it to end") for line in said)


def test_a_task_waits_for_a_killed_sweep_s_work_without_holding_the_experiment(tmp_path, monkeypatch):
    """The experiment lock's last holder wrote down its point lock, which the work it left still
    holds. The next task waits for that work, but not while holding the experiment: the killed
    sweep's resumed task, holding that point lock once the work ends, may need the experiment too."""
    import threading

    from prefshift.pipeline.sweep import task

    record, said = _record(tmp_path / "sweeps", [{"seed": "1"}], ["sweep-seed-1"]), []
    record.data.update(dvc_cache=str(tmp_path / "cache"), root=str(tmp_path))
    experiment = locks.lock_file(
        tmp_path, tmp_path / task.experiment_ref(record.data["baseline"], "sweep-seed-1")
    )
    theirs = tmp_path / "other-sweep" / "points" / "0.lock"
    theirs.parent.mkdir(parents=True)
    experiment.parent.mkdir(parents=True)
    experiment.with_name(experiment.name + ".point").write_text(str(theirs))
    work = _hold(theirs)
    seen_free = []
    monkeypatch.setattr(task, "LOCK_REPORT_S", 1.0)

    def watch() -> None:
        time.sleep(1.5)
        seen_free.append(not locks.held(experiment))
        work.kill()

    threading.Thread(target=watch).start()
    try:
        fd = task.take_experiment(record, 0, said.append)
    finally:
        work.kill()
        work.wait()
    os.close(fd)
    assert seen_free == [True], "the experiment was free while the task waited"
    assert said and "work left by a killed task of another sweep runs on; waiting for it" in said[0]
    assert experiment.with_name(experiment.name + ".point").read_text() == str(record.task_lock(0))


def test_where_the_sweep_folder_takes_no_flock_a_slurm_sweep_goes_on_unlocked_and_a_local_one_stops(
    tmp_path, monkeypatch, capsys
):
    """A cluster filesystem mounted without locks answers flock with ENOLCK. A SLURM sweep and its
    tasks go on unlocked (squeue is their liveness) and say so; a local one, whose liveness is the
    locks, is refused with a way out."""
    import errno
    import fcntl

    from prefshift.pipeline.sweep import local, task

    def no_locks(fd, operation):
        raise OSError(errno.ENOLCK, "No locks available")

    record = _record(tmp_path, [{"seed": "1"}], ["a"])
    monkeypatch.setattr(fcntl, "flock", no_locks)
    with pytest.raises(OSError, match="No locks available"):
        task.take_point(record, 0, print)
    refused = r"cannot be locked here .*; pass a --scratch on a local disk"
    with pytest.raises(SweepError, match=refused), local.driving(record):
        pass
    record.data["executor"]["kind"], said = "slurm", []
    assert task.take_point(record, 0, said.append) is None
    unlocked = f"cannot be locked ([Errno {errno.ENOLCK}] No locks available); running unlocked"
    assert said == [f"{record.task_lock(0)} {unlocked}"]
    with local.driving(record, required=False) as again:
        assert again.id == record.id
    assert "its folder cannot be locked" in capsys.readouterr().err


def test_a_slurm_task_that_cannot_lock_its_experiment_goes_on_without_it_and_says_so(tmp_path, monkeypatch):
    """The experiment's lock saves a second training of a point swept twice at once; the clone needs
    none of it. A SLURM task on a node that does not see the project, or where the project's
    filesystem takes no flock, runs the point without the lock and says why in its log."""
    import errno
    import fcntl

    from prefshift.pipeline.sweep import task

    record, said = _record(tmp_path / "sweeps", [{"seed": "1"}], ["sweep-seed-1"]), []
    record.data.update(root=str(tmp_path / "elsewhere"), executor={"kind": "slurm"})
    assert task.take_experiment(record, 0, said.append) is None
    assert said == [f"{tmp_path / 'elsewhere'}: not on this node; another sweep of this grid at once may "
                    "train this point too"]  # fmt: skip

    def no_locks(fd, operation):
        raise OSError(errno.ENOLCK, "No locks available")

    record.data["root"], said = str(tmp_path), []
    monkeypatch.setattr(fcntl, "flock", no_locks)
    assert task.take_experiment(record, 0, said.append) is None
    assert len(said) == 1 and said[0].endswith(
        f"cannot be locked ([Errno {errno.ENOLCK}] No locks available); another sweep of this grid at once "
        "may train it too"
    )


@pytest.mark.parametrize("kind", ["link", "dangling link", "fifo", "folder"])
def test_a_point_log_that_is_no_regular_file_is_refused_and_what_is_there_kept(tmp_path, kind):
    """The pool opened a point's log with a plain append, through whatever stood at its path: a link
    there had the task write into the file it named (or create the file a dangling one named), and a
    FIFO blocked the sweep until a reader came. Only a regular file is opened; the rest is refused by
    name before any task starts (or a SLURM job is submitted to write there), and left as it was."""
    from prefshift.pipeline.sweep import local, slurm

    record = _record(tmp_path / "sweeps", [{"seed": "1"}], ["sweep-seed-1"])
    log, mine = record.log(0), tmp_path / "mine.txt"
    if kind == "link":
        mine.write_text("my notes\n")
        log.symlink_to(mine)
    elif kind == "dangling link":
        log.symlink_to(mine)
    elif kind == "fifo":
        os.mkfifo(log)
    else:
        log.mkdir()
    refusal = rf"^{re.escape(str(log))}: a .*, not the point's log; move it away, then resume$"
    pool = local.Pool(record, local.Slots(1))
    pool.launch([0])
    with pytest.raises(SweepError, match=refusal):
        pool.live()
    assert not pool.running
    with pytest.raises(SweepError, match=refusal):  # slurmstepd would append there: nothing is submitted
        slurm.submit(record, [0], slurm.SlurmResources())
    assert not list(record.folder.glob("job-*.sbatch")) and record.data["jobs"] == []
    assert (mine.read_text() == "my notes\n") if kind == "link" else not mine.exists()


def _status_error(record: SweepRecord, fifo: Path) -> str:
    """The error `status_lines(record)` ends with, or a failure if it waits on `fifo` (then let go)."""
    import threading

    from prefshift.pipeline.sweep.run import status_lines

    errors: list[str] = []

    def status() -> None:
        try:
            status_lines(record)
        except PrefshiftError as err:
            errors.append(str(err))

    thread = threading.Thread(target=status, daemon=True)
    thread.start()
    thread.join(60)
    if thread.is_alive():
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))  # lets the blocked reader go
        pytest.fail(f"status waited on the FIFO {fifo}")
    assert errors, "status read a FIFO as a file"
    return errors[0]


def test_a_fifo_at_a_point_s_state_or_log_is_refused_and_never_waited_on(tmp_path):
    """Status read a point's state and log with a plain open, which on a FIFO waits for a writer:
    `prefshift sweep status` (and a sweep's wait) hung for good. Each is refused by name."""
    record = _record(tmp_path, [{"seed": "1"}], ["sweep-seed-1"])
    for fifo, said in ((record.state_file(0), "point's state"), (record.log(0), "point's log")):
        os.mkfifo(fifo)
        refusal = f"{fifo}: is a FIFO (named pipe), not a regular file; prefshift reads a {said} only"
        assert _status_error(record, fifo).startswith(refusal)
        fifo.unlink()


def test_the_sweep_waits_for_a_task_that_said_success_until_it_exits_and_prints_its_log(tmp_path, capsys):
    """A task writes `success`, then removes its clone (seconds, under load longer) before it exits.
    The sweep once returned at the word alone: that point's log was never printed and its process
    outlived the sweep (a CI run under load caught one of two logs missing)."""
    import time

    from prefshift.core.atomic import write_json
    from prefshift.pipeline.sweep import local
    from prefshift.pipeline.sweep.record import TASK_HEADER
    from prefshift.pipeline.sweep.run import wait_for

    record = _record(tmp_path, [{"seed": "1"}], ["sweep-seed-1"])
    record.data["executor"] = {"kind": "local"}
    record.log(0).write_text(f"{TASK_HEADER} point 0 ===\nexperiment committed\n")
    pool = local.Pool(record, local.Slots(1))
    lingering = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(2)"], start_new_session=True)
    pool.running[0] = (lingering, pool.free.pop())
    write_json(record.state_file(0), {"state": "success", "commit": "c" * 40})
    started = time.monotonic()
    wait_for(record, pool)
    assert lingering.poll() == 0 and not pool.running and time.monotonic() - started >= 1.5
    err = capsys.readouterr().err
    assert "--- experiment sweep-seed-1: exit 0 ---" in err and "experiment committed" in err


@pytest.mark.parametrize(
    "earlier, value, reused",
    [
        ("anchor:\n  lambda: 0.5\n", "0.5", True),
        ("anchor:\n  lambda: '0.5'\n", "0.5", False),  # the string: named like the number, another point
        ("anchor:\n  other: 1\n", "0.5", False),
        ("anchor: [unclosed\n", "0.5", False),
        (None, "0.5", False),  # no params.yaml in the commit
        ("anchor:\n  lambda: 0.0001\n", "1e-4", True),  # as DVC writes `-S anchor.lambda=1e-4`
        ("anchor:\n  lambda: 1e-05\n", "1e-5", True),  # as DVC writes `-S anchor.lambda=1e-5`
        ("anchor:\n  lambda: off\n", "off", True),  # as DVC writes `-S anchor.lambda=off`
        ("anchor:\n  lambda: 'off'\n", "off", True),  # YAML 1.2, as DVC reads it: `off` is a string
        ("anchor:\n  lambda: false\n", "off", False),
    ],
)
def test_a_task_reuses_an_earlier_experiment_only_with_the_points_params(tmp_path, earlier, value, reused):
    """What a repeated sweep's task finds under the point's experiment ref decides whether it runs:
    only an experiment whose params hold the point's values is pushed back as the point's result.
    Values are read as the point's stages read them (dvc_value): read as YAML, `1e-4` was a string
    that no experiment of the point held, so a repeated sweep reran it."""
    from prefshift.pipeline.sweep.task import _fetch_earlier, experiment_commit, experiment_ref

    env = {**os.environ, **GIT_ID}
    user, clone = tmp_path / "user", tmp_path / "clone"
    user.mkdir()
    _run(["git", "init", "-q"], user, env)
    (user / "params.yaml").write_text("anchor:\n  lambda: 1\n")
    _run(["git", "add", "params.yaml"], user, env)
    _run(["git", "commit", "-qm", "baseline"], user, env)
    baseline = _run(["git", "rev-parse", "HEAD"], user, env).strip()
    (user / "params.yaml").unlink() if earlier is None else (user / "params.yaml").write_text(earlier)
    _run(["git", "commit", "-qam", "experiment"], user, env)
    point = {"anchor.lambda": value}
    ref = experiment_ref(baseline, experiment_name(point))
    _run(["git", "update-ref", ref, "HEAD"], user, env)
    _run(["git", "clone", "-q", str(user), str(clone)], tmp_path, env)
    _run(["git", "checkout", "-q", "--detach", baseline], clone, env)
    record = _record(tmp_path / "sweeps", [point], [experiment_name(point)])
    record.data.update(baseline=baseline)
    said = []
    _fetch_earlier(record, 0, clone, said.append)
    assert bool(experiment_commit(clone, experiment_name(point))) is reused
    assert bool(said) is not reused  # "... has other params; running the point"


def test_a_clone_an_attempt_left_half_made_is_removed_by_the_next_and_nothing_else(tmp_path):
    """Before, a task killed mid-clone left its staging copy (`clones/.<i>.<pid>.tmp`, a checkout)
    in the sweep's folder for good. The clone is now made in scratch prefshift can prove its own,
    so the next attempt removes what a killed one left, and a lookalike it did not make stays."""
    from prefshift.core import scratch
    from prefshift.pipeline.sweep.task import _clone

    env, origin = {**os.environ, **GIT_ID}, tmp_path / "origin"
    origin.mkdir()
    (origin / "params.yaml").write_text("seed: 1\n")
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "baseline"]):
        _run(["git", *args], origin, env)
    record = _record(tmp_path / "sweeps", [{"seed": "1"}], ["sweep-seed-1"])
    record.data.update(
        baseline=_run(["git", "rev-parse", "HEAD"], origin, env).strip(), git_remote=str(origin)
    )
    killed = scratch.create(record.clone(0), directory=True)
    (killed.work / "half-a-checkout").write_text("")
    killed.release()  # its writer is gone: the kernel dropped the lock
    lookalike = record.clone(0).with_name(".0.4242.tmp")  # the old staging name, and a user's folder
    lookalike.mkdir()
    (lookalike / "keep").write_text("mine")
    _clone(record, 0, lambda line: None)
    assert (record.clone(0) / "params.yaml").read_text() == "seed: 1\n"
    assert sorted(p.name for p in record.clone(0).parent.iterdir()) == [".0.4242.tmp", "0"]
    assert (lookalike / "keep").read_text() == "mine"


@pytest.mark.parametrize("tampered", ["link", "folder"])
def test_a_clone_the_sweep_did_not_make_is_refused_not_run_in_or_replaced(tmp_path, tampered):
    """`clones/<i>` made a link to a user's repository ran `dvc exp run` there, applying the
    experiment to its workspace; a plain folder there was replaced by a fresh clone, its files gone."""
    from prefshift.pipeline.sweep.task import _clone

    record = _record(tmp_path / "sweeps", [{"seed": "1"}], ["sweep-seed-1"])
    user = tmp_path / "user"
    _run(["git", "init", "-q", str(user)], tmp_path, {**os.environ, **GIT_ID})
    (user / "notes.txt").write_text("mine")
    if tampered == "link":
        record.clone(0).symlink_to(user)
    else:
        shutil.copytree(user, record.clone(0), ignore=shutil.ignore_patterns(".git"))
    with pytest.raises(SweepError, match=rf"{record.clone(0)}: not a clone this sweep made .*move it away"):
        _clone(record, 0, lambda line: None)
    assert (record.clone(0) / "notes.txt").read_text() == "mine" and (user / ".git").is_dir()


def test_resume_and_collect_of_a_sweep_whose_project_moved_say_so(tmp_path):
    """Before, resume ran each point into a git error about the missing path ("... and the
    repository exists." as its status), and collect failed in git."""
    from prefshift.pipeline.sweep.run import collect_id, resume

    record = _record(tmp_path / "sweeps", [{"seed": "1"}], ["sweep-seed-1"])
    record.data["root"] = str(tmp_path / "moved")
    record.save()
    for command in (resume, collect_id):
        with pytest.raises(
            SweepError, match=rf"sweep {record.id}: its project .*moved is gone .*move it back"
        ):
            command(tmp_path, record.id, tmp_path / "sweeps")


def test_a_record_path_the_sweep_could_not_file_is_refused_before_any_point_runs(tmp_path):
    """A link at a record's path, or a file where reports/sweeps/ goes, failed `collect` once every
    point had run, after filing some records; the checks before a sweep (and its dry run) find them.
    A record filed by an earlier sweep, and reports/sweeps/ as a link to a folder, are fine."""
    from prefshift.pipeline.sweep.grid import check_distinct
    from prefshift.pipeline.sweep.results import filing_problems

    shutil.copy2(REPO / "params.yaml", tmp_path / "params.yaml")
    points = grid_points(parse_grid(["anchor.lambda=0.5,1e-5"]))
    loaded = check_distinct(tmp_path / "params.yaml", points, ["anchor_last"])
    seeds = yaml.safe_load((REPO / "params.yaml").read_text())["seeds"]
    (elsewhere := tmp_path / "elsewhere").mkdir()
    (sweeps := tmp_path / "reports" / "sweeps").parent.mkdir()
    sweeps.symlink_to(elsewhere)
    (elsewhere / f"anchor_last__anchor.lambda=0.5__seed={seeds[0]}.json").write_text("{}")
    assert filing_problems(tmp_path, points, loaded, ["anchor_last"]) == []
    link = sweeps / f"anchor_last__anchor.lambda=1e-05__seed={seeds[-1]}.json"  # as the stages read it
    link.symlink_to(tmp_path / "user-file")
    (problem,) = filing_problems(tmp_path, points, loaded, ["anchor_last"])
    assert problem.startswith(f"collect would file a record here: {link}: is a symbolic link")
    sweeps.unlink()
    sweeps.write_text("mine")
    (problem,) = filing_problems(tmp_path, points, loaded, ["anchor_last"])
    assert problem == f"{sweeps}: not a folder (a file, or a link to none), and the sweep files its " + (
        "records in it; move it away"
    )


@pytest.mark.parametrize("index", [-1, 2])
def test_a_task_refuses_an_index_that_is_no_point_of_its_sweep(tmp_path, index):
    """`sweep task` is run by the executors with indices they took from the record; by hand, -1
    would run the last point under a state file of its own and 2 would fail with an IndexError."""
    from prefshift.pipeline.sweep.task import run_point

    record = _record(tmp_path, [{"seed": "1"}, {"seed": "2"}], ["a", "b"])
    with pytest.raises(SweepError, match=rf"sweep {record.id}: no point {index}; its points are 0 to 1"):
        run_point(record.folder, index)
    assert not list((record.folder / "points").iterdir()) and not list((record.folder / "clones").iterdir())


def test_a_sweep_folder_inside_a_pipeline_output_is_refused(tmp_path):
    """DVC deletes and restores an output whole: a sweep folder there (named, or reached through a
    symlink) would lose the record and the clones at the next stage rerun or `dvc checkout`."""
    from prefshift.pipeline.sweep.baseline import check_scratch

    subprocess.run([sys.executable, "-m", "dvc", "init", "-q", "--no-scm"], cwd=tmp_path, check=True)
    stages = {"make": {"cmd": "mkdir -p models/out", "outs": ["models/out"]}}
    (tmp_path / "dvc.yaml").write_text(yaml.safe_dump({"stages": stages}))
    (tmp_path / "models" / "out" / "deep").mkdir(parents=True)
    (tmp_path / "link").symlink_to(tmp_path / "models" / "out" / "deep")
    for inside in ("models/out", "models/out/deep/sweeps", "link/sweeps"):
        with pytest.raises(
            SweepError, match=rf"--scratch {tmp_path / inside}: inside models/out, a pipeline output"
        ):
            _opened(check_scratch, tmp_path, tmp_path / inside)
    for outside in ("models", "models/outside", ".prefshift/sweeps"):
        _opened(check_scratch, tmp_path, tmp_path / outside)


def test_a_sweep_run_by_a_live_process_shows_its_queue_as_pending_and_refuses_a_second_driver(tmp_path):
    """A local sweep's points wait in its own process until a slot frees. Another shell saw them as
    never started, and its `resume` started them too: two tasks of one point in one clone. The
    process running the sweep holds `sweep.lock`, and the record lists what it queued."""
    from prefshift.core.atomic import write_json
    from prefshift.pipeline.sweep import local
    from prefshift.pipeline.sweep.record import load
    from prefshift.pipeline.sweep.run import point_states, resume

    record = _record(tmp_path, [{"seed": str(i)} for i in range(4)], list("abcd"))
    record.data["executor"] = dataclasses.asdict(Executor())
    record.data["driver"] = {"points": [1, 2, 3], "since": "2026-12-05T10:00:00Z"}
    record.save()
    write_json(record.state_file(2), {"state": "failed", "time": "2026-12-05T09:00:00Z"})  # to rerun
    # failed since the claim, in its very second: failed, not pending
    write_json(record.state_file(3), {"state": "failed", "time": "2026-12-05T10:00:00Z"})
    other = _hold(record.driver_lock)
    try:
        assert point_states(load(tmp_path, record.id)) == {
            0: "missing",
            1: "pending",
            2: "pending",
            3: "failed",
        }
        message = rf"sweep {record.id} is being run by process {other.pid} \(`holder`, since .*\); stop it"
        with pytest.raises(locks.LockedError, match=message), local.driving(load(tmp_path, record.id)):
            pass
        with pytest.raises(locks.LockedError, match=message):
            resume(tmp_path, record.id, scratch=tmp_path)
        assert "stops" not in load(tmp_path, record.id).data, "a refusal is no stop"
    finally:
        other.kill()
        other.wait()
    assert point_states(load(tmp_path, record.id)) == {0: "missing", 1: "missing", 2: "failed", 3: "failed"}
    with local.driving(load(tmp_path, record.id)) as held:  # the other is gone: this one takes over
        local.Pool(held, local.Slots(1)).launch([1])
        assert point_states(load(tmp_path, record.id))[1] == "pending"
    with local.driving(load(tmp_path, record.id)):  # left, the lock is free again
        pass


ORPHANING_TASK = """
import os, signal, subprocess, sys, time
child = '''
import pathlib, signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: (pathlib.Path(sys.argv[1]).write_text("SIGTERM"), sys.exit(0)))
print("child", flush=True)
time.sleep(300)
'''
stage = subprocess.Popen([sys.executable, "-c", child, sys.argv[1]], stdout=subprocess.PIPE, text=True)
assert stage.stdout.readline() == "child\\n"
print(stage.pid, flush=True)
os.kill(os.getpid(), signal.SIGKILL)  # the task alone, as `kill -9 <task pid>` does
"""


def test_a_task_killed_alone_has_its_group_ended_before_its_slot_is_reused(tmp_path, capsys):
    """`kill -9 <task pid>` (or the OOM killer) ends the task and leaves its dvc and stage running in
    its process group: the pool once freed the slot at once and started the next point beside the
    orphaned training (on local-gpus, on its device). The pool now ends what the task left, SIGTERM
    first so that a stage records its run stopped, before the slot is free."""
    from prefshift.core.process_group import group_alive, kill_group
    from prefshift.pipeline.sweep import local

    record = _record(tmp_path, [{"seed": "1"}], ["sweep-seed-1"])
    record.data["executor"] = {"kind": "local"}
    pool, task = local.Pool(record, local.Slots(1)), None
    try:
        task = subprocess.Popen(
            [sys.executable, "-c", ORPHANING_TASK, str(tmp_path / "stage-said")],
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        stage_pid = int(task.stdout.readline())
        task.wait()
        pool.running[0] = (task, pool.free.pop())
        assert group_alive(task.pid), "the task's stage outlived it"
        assert pool.live() == {}
        assert not group_alive(task.pid) and pool.free == [None]
        assert (tmp_path / "stage-said").read_text() == "SIGTERM", f"stage {stage_pid} was asked first"
        assert (
            "point 0: its task ended and left processes of its group; ended them\n" in capsys.readouterr().err
        )
    finally:
        if task:
            kill_group(task.pid)  # what the old pool left


def test_the_pool_reaps_the_orphans_it_adopts_and_leaves_its_tasks_exit_status_to_them(tmp_path):
    """The pool adopts its tasks' orphans (so that it can tell when a task's group has ended), and
    with them the daemons each dvc command leaves outside that group: never reaped, every one stayed
    a zombie until the sweep ended (a real sweep showed two per point). A task's own end is its
    Popen's to read, exit status and all."""
    from prefshift.pipeline.sweep import local

    record = _record(tmp_path, [{"seed": "1"}], ["sweep-seed-1"])
    pool = local.Pool(record, local.Slots(1))
    task = subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(3)"], start_new_session=True)
    pool.running[0] = (task, pool.free.pop())
    daemon = subprocess.run(  # as dvc does: a grandchild that outlives its parent, adopted here
        ["sh", "-c", "sleep 0.5 & echo $!"], capture_output=True, text=True, check=True
    )
    orphan = int(daemon.stdout)
    deadline = time.monotonic() + 30
    while not {orphan, task.pid} <= _zombies():
        assert time.monotonic() < deadline, "the orphan and the task to end"
        time.sleep(0.05)
    pool.live()
    assert not Path(f"/proc/{orphan}").exists(), "the adopted orphan was reaped"
    assert task.returncode == 3, "the task's exit status was left to its Popen"


def _zombies() -> set[int]:
    """This process's children that ended and wait to be reaped."""
    return {pid for pid, state, ppid, _ in processes() if state == "Z" and ppid == os.getpid()}


def _opened(check: Callable[..., Any], root: Path, *args: Any) -> Any:
    """`check`, one of a sweep's start, run on project `root`'s pipeline opened as the start opens it."""
    from prefshift.pipeline.sweep.baseline import open_pipeline

    with open_pipeline(root) as repo:
        return check(repo, *args)


def _stale(root: Path) -> list[str]:
    from prefshift.pipeline.sweep.trial import changed_inputs, stale_notes

    return _opened(lambda repo: stale_notes(repo, changed_inputs(repo)), root)


def _preflight(root: Path) -> list[str]:
    """What a sweep of `root` with no points refuses before it starts: the workspace's refusals."""
    from prefshift.pipeline.sweep.run import preflight

    return preflight(root, [], [], [], Executor(), None)[0]


def _reproduced_and_committed(root: Path, stages: dict, env: dict[str, str]) -> None:
    """Project `root` (made) with a dvc.yaml of `stages` and the repository's params.yaml (a sweep
    reads it before its checks): reproduced, and everything in it committed as the baseline."""
    root.mkdir(exist_ok=True)
    (root / "dvc.yaml").write_text(yaml.safe_dump({"stages": stages}))
    shutil.copy2(REPO / "params.yaml", root / "params.yaml")
    _run(["git", "init", "-q"], root, env)
    _run([str(BIN / "dvc"), "init", "-q"], root, env)
    _run([str(BIN / "dvc"), "repro", "-q"], root, env)
    _run(["git", "add", "-A"], root, env)
    _run(["git", "commit", "-qm", "base"], root, env)


def _git_env() -> dict[str, str]:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    return {**env, **{f"GIT_{w}_{x}": "t" for w in ("AUTHOR", "COMMITTER") for x in ("NAME", "EMAIL")}}


def test_a_cluster_sweep_checks_its_remotes_as_the_tasks_clones_will_see_them(tmp_path):
    """Each of these passed the checks and then failed every point on the cluster, or quietly cost
    every point the shared stages: an `origin` or a DVC remote given as a relative path (the tasks
    read it from the sweep's folder, or from their clone's .dvc/; git reads `origin` from the
    repository's top, for a project in a folder of it too), a default DVC remote set with
    --local (the clones never get config.local), a baseline pushed to another remote only."""
    from prefshift.pipeline.sweep.slurm import check_pushed, dvc_remote, git_origin

    env, root = _git_env(), tmp_path / "project"
    root.mkdir()
    for args in (
        ["git", "init", "-q", "-b", "main"],
        ["dvc", "init", "-q"],
        ["git", "commit", "-qm", "init"],
    ):
        _run(args, root, env)
    for name in ("shared.git", "backup.git"):
        _run(["git", "init", "-q", "--bare", str(tmp_path / name)], tmp_path, env)
    _run(["git", "remote", "add", "origin", "../shared.git"], root, env)
    assert git_origin(root) == str(tmp_path / "shared.git")
    (root / "ml").mkdir()  # a project in a folder of the repository: git reads the URL from the top
    _run(["git", "ls-remote", "origin"], root / "ml", env)
    assert git_origin(root / "ml") == str(tmp_path / "shared.git")
    _run(["git", "remote", "set-url", "origin", "git@host.example:lab/project.git"], root, env)
    assert git_origin(root) == "git@host.example:lab/project.git"
    _run(["git", "remote", "set-url", "origin", str(tmp_path / "shared.git")], root, env)

    _run(["git", "remote", "add", "backup", "../backup.git"], root, env)
    _run(["git", "push", "-q", "backup", "main"], root, env)
    baseline = _run(["git", "rev-parse", "HEAD"], root, env).strip()
    with pytest.raises(SweepError, match=f"baseline {baseline[:12]} is not on origin"):
        check_pushed(root, baseline, git_origin(root))
    _run(["git", "push", "-q", "origin", "main"], root, env)
    check_pushed(root, baseline, git_origin(root))

    with pytest.raises(SweepError, match=r"no default DVC remote.*commit \.dvc/config"):
        dvc_remote(root)
    _run(["dvc", "remote", "add", "--local", "-d", "mine", str(tmp_path / "store")], root, env)
    with pytest.raises(SweepError, match="no default DVC remote"):
        dvc_remote(root)
    _run(["dvc", "remote", "add", "-d", "shared", "../store"], root, env)
    with pytest.raises(SweepError, match=re.escape("DVC remote 'shared' is the relative path '../../store'")):
        dvc_remote(root)
    _run(["dvc", "remote", "modify", "shared", "url", str(tmp_path / "store")], root, env)
    assert dvc_remote(root) == "shared"
    _run(["dvc", "remote", "add", "-d", "-f", "cloud", "s3://bucket/prefshift"], root, env)
    assert dvc_remote(root) == "cloud"


def test_a_cluster_sweep_refuses_an_mlflow_server_that_does_not_answer(tmp_path):
    """The URI's form was all that was checked: a server that was down failed every point after the
    queue, and each resume again."""
    import http.server
    import threading

    from mlflow_support import free_port
    from prefshift.pipeline.sweep.slurm import check_tracking

    with pytest.raises(SweepError, match="the server does not answer"):
        check_tracking(f"http://127.0.0.1:{free_port()}")
    with pytest.raises(SweepError, match="cannot log to a sqlite file"):
        check_tracking("sqlite:///mlflow.db")
    server = http.server.HTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)  # 501 to all
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:  # a refusal (an auth proxy's, say) is an answer: the server is up; URI schemes ignore case
        check_tracking(f"HTTP://127.0.0.1:{server.server_port}")
    finally:
        server.shutdown()


def test_a_new_attempt_starts_its_point_s_state_afresh(tmp_path):
    """A resumed point said `running` with the stopped attempt's error: had the new attempt died
    without a word, status would have shown the old attempt's reason as its own."""
    record = _record(tmp_path, [{"seed": "1"}], ["sweep-seed-1"])
    record.write_state(0, "stopped", attempt=1, step="run", error="stopped by a signal during run")
    record.write_state(0, "running", new_attempt=True, attempt=2, step="clone")
    assert "error" not in record.read_state(0) and record.read_state(0)["attempt"] == 2
    record.write_state(0, "running", step="run")
    assert record.read_state(0)["attempt"] == 2, "within an attempt, what it said stays"


def test_options_of_another_executor_are_refused_not_ignored():
    """`--jobs 4` with slurm or local-gpus, and `--partition` with a local executor, were taken and
    ignored."""
    from prefshift.pipeline.sweep.slurm import SlurmResources

    for executor in (Executor("slurm", jobs=4), Executor("local-gpus", jobs=4, devices=("0", "1"))):
        with pytest.raises(SweepError, match="--jobs 4: for --executor local alone"):
            executor.check()
    for resources in (SlurmResources(partition="gpu"), SlurmResources(time="1:00:00")):
        with pytest.raises(SweepError, match="slurm's alone"):
            Executor("local", resources=resources).check()
    Executor("local-gpus", devices=("0", "1"), resources=SlurmResources(gpus_per_task=2)).check()


def test_a_resume_changes_only_the_resources_it_names_and_checks_them_as_a_start_does(tmp_path):
    """A point out of its `--time` could be given more only by a new sweep, whose new clone lost the
    checkpoint its training had reached. A resume now takes the executor's options: one left out
    keeps what the sweep was started with, and one the executor does not take is refused before
    the record changes."""
    from typer.testing import CliRunner

    from prefshift.cli import app
    from prefshift.pipeline.sweep.slurm import SlurmResources

    started = Executor("slurm", resources=SlurmResources(gpus_per_task=1, partition="gpu", time="1:00:00"))
    resumed = started.changed(jobs=None, devices=None, time="8:00:00", partition=None, template=None)
    assert resumed == Executor(
        "slurm", resources=SlurmResources(gpus_per_task=1, partition="gpu", time="8:00:00")
    )
    assert Executor().changed(jobs=3) == Executor(jobs=3)

    record = _record(tmp_path, [{"seed": "1"}], ["sweep-seed-1"])
    before = (record.folder / "sweep.json").read_bytes()
    where = [record.id, "--scratch", str(tmp_path)]
    for option, refusal in (
        (
            ["--time", "8:00:00"],
            "--partition, --time, --account, --cpus-per-task, --sbatch-template: slurm's alone",
        ),
        (["--jobs", "0"], "--jobs 0: run at least one point at a time"),
        (["--gpus", "0,0"], "--gpus '0,0': a device is listed twice"),
        (["--gpus-per-task", "2"], "--gpus-per-task 2: 1 or more, for --executor local-gpus or slurm"),
        (["--gpus", "0,1"], "runs with --executor local, as its resumes do: --executor local-gpus takes"),
    ):
        result = CliRunner().invoke(app, ["sweep", "resume", *where, *option])
        assert result.exit_code != 0 and refusal in result.stderr, (option, result.stderr)
    assert (record.folder / "sweep.json").read_bytes() == before
    # Refused once it holds the sweep (its project gone), or with no point to rerun: the record's
    # executor is kept until points are launched with the new one.
    record.data["root"] = str(tmp_path / "moved")
    record.save()
    before = (record.folder / "sweep.json").read_bytes()
    result = CliRunner().invoke(app, ["sweep", "resume", *where, "--jobs", "3"])
    assert "its project" in result.stderr and "is gone" in result.stderr
    assert (record.folder / "sweep.json").read_bytes() == before
    record.data["root"] = str(tmp_path)
    record.save()
    before = (record.folder / "sweep.json").read_bytes()
    record.write_state(0, "success", commit="c" * 40)
    result = CliRunner().invoke(app, ["sweep", "resume", *where, "--jobs", "3"])  # then fails to collect
    assert "nothing to rerun" in result.stderr and "now run with" not in result.stderr
    assert open_folder(record.folder).data["executor"] == json.loads(before)["executor"]


def test_a_damaged_executor_in_the_record_is_refused_as_such(tmp_path):
    """A record's executor of an unknown kind was refused as if the user had passed `--executor`,
    and a `jobs` of "2" or true was taken for a number."""
    record = _record(tmp_path, [{"seed": "1"}], ["sweep-seed-1"])
    for field, value in (("kind", "pbs"), ("jobs", "2"), ("jobs", True), ("devices", "0,1")):
        record.data["executor"] = {**dataclasses.asdict(Executor()), field: value}
        with pytest.raises(SweepError, match=rf"sweep\.json: executor\.{field}.*the sweep record is damaged"):
            Executor.of(record)


def test_a_job_that_ended_before_its_task_began_says_so_from_its_log(tmp_path):
    """A template's set-up that fails (`module load` of a missing module) ends the job before
    prefshift's task writes a word: status said `never started`, while the log held the reason. A
    task stopped while it waited for a lock did begin, and status says so."""
    from prefshift.pipeline.sweep.record import TASK_HEADER
    from prefshift.pipeline.sweep.run import status_lines

    record = _record(tmp_path, [{"seed": "1"}, {"seed": "2"}], ["sweep-seed-1", "sweep-seed-2"])
    record.data["executor"] = {"kind": "local"}
    record.log(0).write_text("module: command not found\nLmod has detected the following error: no cuda/99\n")
    lines = status_lines(record)
    assert "(its job ended before prefshift's task began: Lmod has detected the following error" in lines[0]
    assert "(never started)" in lines[1]
    record.log(1).write_text(f"{TASK_HEADER} s point 1 ===\n10:00:00 [b] experiment b is being run by ...\n")
    assert (
        "(its task ended before its first step: 10:00:00 [b] experiment b is being" in status_lines(record)[1]
    )


def test_a_job_that_ended_silently_or_left_no_log_says_which(tmp_path):
    """A job whose set-up failed without a word (a template's `false`) leaves an empty log, which
    SLURM makes as the job starts (checked on the one-node cluster): status said `never started`.
    On a cluster, no log at all is a job cancelled while pending or a node that cannot write the
    sweep's folder, and status says where to look."""
    from prefshift.pipeline.sweep.run import _never_started

    record = _record(tmp_path, [{"seed": "1"}, {"seed": "2"}], ["sweep-seed-1", "sweep-seed-2"])
    record.data["executor"] = {"kind": "slurm"}
    record.log(0).write_text("\n")
    assert _never_started(record, 0) == (
        "its job began (its log was made) and ended before prefshift's task wrote a line"
    )
    assert _never_started(record, 1) == (
        f"never started: no log; cancelled while pending, or its node could not write {record.log(1).parent} "
        "(is the sweep's folder on a filesystem the nodes share?)"
    )
    record.data["executor"] = {"kind": "local"}
    assert _never_started(record, 1) == "never started"
