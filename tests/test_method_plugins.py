"""Methods are plug-ins: a method from a package outside the repository, installed with pip and
registered in the `prefshift.methods` entry-point group, runs plan -> targets -> train ->
evaluate -> report with no change to prefshift's files; the registry's refusals name what to fix."""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from prefshift.config.params import ConfigError, known_methods, method_entry_points, parse_params
from prefshift.core.paths import Layout
from prefshift.methods import build_objective, registry, train_settings
from tiny_project import copy_project, pipeline_root

PREFSHIFT = str(Path(sys.executable).parent / "prefshift")
BOUND_S = 900

TOY_MODULE = '''
"""A toy method: Bradley-Terry on q with a margin, and a step after training that marks the model."""

from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from prefshift.methods.registry import Build, Method


class MarginSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    margin: float = Field(0.5, ge=0, description="Subtracted from the reward gap on the preferred side.")


def objective(build: Build):
    import torch.nn.functional as F

    from prefshift.methods.base import Objective

    @dataclass
    class MarginBT(Objective):
        margin: float = 0.0

        def loss(self, out, step, total_steps):
            shifted = out.delta - self.margin * (2 * out.targets - 1)
            return F.binary_cross_entropy_with_logits(shifted, out.targets), {"margin": self.margin}

    return MarginBT(build.name, margin=build.settings.margin)


def mark(model, build: Build) -> None:
    model.hf.config.toy_margin_after_training = build.settings.margin


METHOD = Method(
    name="toy_margin", labels="weak", objective=objective, settings=MarginSettings, after_training=mark
)
'''

TOY_PYPROJECT = """
[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "toy-margin-method"
version = "0.3.0"

[project.entry-points."prefshift.methods"]
toy_margin = "toy_margin_method:METHOD"

[tool.setuptools]
py-modules = ["toy_margin_method"]
"""


def _install(tmp_path: Path, module: str = TOY_MODULE, pyproject: str = TOY_PYPROJECT) -> Path:
    """pip-install the toy package into its own site directory (no network, no build isolation)."""
    source, site = tmp_path / "toy-src", tmp_path / "site"
    source.mkdir()
    (source / "toy_margin_method.py").write_text(textwrap.dedent(module))
    (source / "pyproject.toml").write_text(pyproject)
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index"]
    subprocess.run([*cmd, "--target", str(site), str(source)], check=True, timeout=BOUND_S, cwd=tmp_path)
    return site


@pytest.fixture
def installed(tmp_path, monkeypatch):
    """The toy package on sys.path of this process, with the registry's caches cleared around it."""
    site = _install(tmp_path)
    monkeypatch.syspath_prepend(str(site))
    method_entry_points.cache_clear()
    registry._loaded.cache_clear()
    yield site
    method_entry_points.cache_clear()
    registry._loaded.cache_clear()
    sys.modules.pop("toy_margin_method", None)


def _with(site: Path) -> str:
    """PYTHONPATH with the toy package's site first, keeping the checkout's own (a worktree's src)."""
    return os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))


def _run(root: Path, env: dict, *args: str) -> subprocess.CompletedProcess:
    cmd = [PREFSHIFT, *args, "--root", str(root), "--params", str(root / "params.yaml")]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=BOUND_S, cwd=root)
    assert done.returncode == 0, f"{' '.join(args)}: {done.stderr[-3000:]}"
    return done


@pytest.mark.slow
def test_a_method_from_an_installed_package_runs_plan_to_report(tmp_path, tmp_path_factory):
    site = _install(tmp_path)
    layout = copy_project(pipeline_root(tmp_path_factory), tmp_path / "project")
    params = yaml.safe_load((layout.root / "params.yaml").read_text())
    params["methods"] = ["naive", "toy_margin"]
    params["toy_margin"] = {"margin": 0.25}
    (layout.root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": _with(site)}
    _run(layout.root, env, "plan")
    plan = json.loads((layout.root / "data" / "plan" / "train" / "toy_margin.json").read_text())
    assert plan == {
        "method": "toy_margin",
        "toy_margin": {"margin": 0.25},
        "plugin": "toy-margin-method 0.3.0",
    }
    _run(layout.root, env, "targets", "--method", "toy_margin")
    _run(layout.root, env, "train", "--method", "toy_margin")
    for target in params["data"]["targets"]:  # scored apart from training, as DVC's score_target@ does
        _run(layout.root, env, "score-target", "--model", "toy_margin", "--target", target)
    _run(layout.root, env, "evaluate", "--method", "toy_margin")
    log = json.loads(Layout(layout.root, seed=0).train_log("toy_margin").read_text())
    assert log["objective"] == "toy_margin"
    assert {row["margin"] for row in log["steps"]} == {0.25}  # the plug-in's loss ran, with its settings
    assert log["after_training"] == {"hook": "toy_margin_method.mark"}
    saved = json.loads((Layout(layout.root, seed=0).student_dir("toy_margin") / "config.json").read_text())
    assert saved["toy_margin_after_training"] == 0.25  # the step after training ran before the save
    metrics = json.loads(Layout(layout.root, seed=0).metrics("toy_margin").read_text())
    assert metrics["method"] == "toy_margin"
    _run(layout.root, env, "report")
    summary = (layout.root / "reports" / "summary.md").read_text()
    assert "toy_margin" in summary
    headline = json.loads((layout.root / "reports" / "metrics.json").read_text())
    assert {"naive", "toy_margin"} <= set(headline)
    assert headline["toy_margin"]["id_acc"] == metrics["id"]["acc"]


def test_the_toy_method_is_known_only_while_its_package_is_installed(installed):
    assert "toy_margin" in known_methods()
    assert known_methods()[:6] == ("naive", "confidence", "seam", "anchor_last", "anchor_mid", "ceiling")
    params = parse_params({"methods": ["toy_margin"], "toy_margin": {"margin": 0.1}}, "params.yaml")
    assert params.resolved()["toy_margin"] == {"margin": 0.1}
    assert build_objective("toy_margin", params, 2).margin == 0.1
    assert train_settings("toy_margin", params)["plugin"] == "toy-margin-method 0.3.0"


def test_a_plug_in_section_with_a_wrong_key_names_it(installed):
    params = parse_params({"methods": ["toy_margin"], "toy_margin": {"margn": 0.1}}, "params.yaml")
    with pytest.raises(ConfigError, match=r"params key toy_margin\.margn: Extra inputs are not permitted"):
        train_settings("toy_margin", params)
    params = parse_params({"methods": ["toy_margin"], "toy_margin": {"margin": -1}}, "params.yaml")
    with pytest.raises(ConfigError, match=r"params key toy_margin\.margin: Input should be greater than"):
        build_objective("toy_margin", params, 2)


def test_an_unknown_top_level_key_is_still_refused():
    with pytest.raises(ConfigError, match="toy_margin"):
        parse_params({"methods": ["naive"], "toy_margin": {"margin": 0.1}}, "params.yaml")
    with pytest.raises(ConfigError, match="unknown method 'toy_margin'; valid methods: naive, confidence"):
        parse_params({"methods": ["toy_margin"]}, "params.yaml")


@pytest.mark.parametrize(
    ("module", "message"),
    [
        ("METHOD = 3\n", "is a int, not a prefshift.methods.registry.Method"),
        (
            "from prefshift.methods.registry import Method\n"
            "METHOD = Method(name='other', labels='weak', objective=None)\n",
            "declares name 'other'; the entry point and Method must agree",
        ),
        ("import no_such_module_anywhere\n", "cannot be loaded (ModuleNotFoundError"),
    ],
)
def test_a_broken_plug_in_is_refused_naming_its_entry_point(tmp_path, monkeypatch, module, message):
    site = _install(tmp_path, module)
    monkeypatch.syspath_prepend(str(site))
    method_entry_points.cache_clear()
    registry._loaded.cache_clear()
    sys.modules.pop("toy_margin_method", None)
    try:
        with pytest.raises(
            registry.MethodError, match="entry point toy_margin = 'toy_margin_method:METHOD'"
        ) as err:
            registry.get("toy_margin")
        assert message in str(err.value)
    finally:
        method_entry_points.cache_clear()
        registry._loaded.cache_clear()
        sys.modules.pop("toy_margin_method", None)


def test_every_built_in_method_is_registered_by_its_own_module():
    builtin = ("naive", "confidence", "seam", "anchor_last", "anchor_mid", "ceiling")
    for name in (*builtin, "linear_probe", "lp_ft", "wise_ft", "l2_sp"):
        method = registry.get(name)
        assert method.name == name
        assert method_entry_points()[name].value == f"prefshift.methods.builtin.{name}:METHOD"
    assert registry.get("teacher").labels == "gold"


# --- the contract is checked where a plug-in is registered ---------------------------------------

CONTRACT_MODULE = """
from dataclasses import dataclass

from pydantic import BaseModel

from prefshift.methods.registry import Method, bradley_terry


@dataclass
class NotPydantic:
    margin: float = 0.0


METHOD = Method({fields})
"""


def _entry(tmp_path: Path, monkeypatch, name: str, fields: str) -> importlib.metadata.EntryPoint:
    """An entry point of the prefshift.methods group whose module declares Method(**fields)."""
    module = f"contract_{abs(hash((name, fields)))}"
    (tmp_path / f"{module}.py").write_text(CONTRACT_MODULE.format(fields=fields))
    monkeypatch.syspath_prepend(str(tmp_path))
    return importlib.metadata.EntryPoint(name=name, value=f"{module}:METHOD", group="prefshift.methods")


def _fields(name: str, **changed: str) -> str:
    """Method(...)'s arguments as source: a valid weak-label method named `name`, with `changed`."""
    fields = {"name": repr(name), "labels": "'weak'", "objective": "bradley_terry", **changed}
    return ", ".join(f"{k}={v}" for k, v in fields.items())


UNSAFE = "is not one safe path component"


@pytest.mark.parametrize(
    ("name", "fields", "message"),
    [
        ("..", _fields(".."), f"name '..' {UNSAFE}"),
        ("", _fields(""), f"name '' {UNSAFE}"),
        (".hidden", _fields(".hidden"), UNSAFE),
        ("a/b", _fields("a/b"), UNSAFE),
        ("../x", _fields("../x"), UNSAFE),
        ("-rf", _fields("-rf"), UNSAFE),
        ("a.b", _fields("a.b"), UNSAFE),
        ("m" * 65, _fields("m" * 65), "at most 64"),
        ("m", _fields("m", labels="'golden'"), "labels 'golden' is not one of gold, weak, seam"),
        ("m", _fields("m", settings="NotPydantic"), "is not a pydantic model class"),
        ("m", _fields("m", settings="{'margin': 1}"), "is not a pydantic model class"),
        ("m", _fields("m", objective="None"), "objective None is not a callable"),
        ("m", _fields("m", prepare="3"), "prepare 3 is not a callable"),
        ("m", _fields("m", anchor_kind="'first'"), "anchor_kind 'first' is not one of"),
        ("m", _fields("m", sections="'anchor'"), "sections 'anchor' is not a tuple"),
    ],
)
def test_a_method_that_breaks_the_contract_is_refused_where_it_is_registered(
    tmp_path, monkeypatch, name, fields, message
):
    entry = _entry(tmp_path, monkeypatch, name, fields)
    with pytest.raises(registry.MethodError, match=f"entry point {re.escape(name)} = ") as err:
        registry._load(entry)
    assert message in str(err.value)
    assert registry.contract_problem(registry.get("naive")) is None


FAILING_MODULE = """
from pydantic import BaseModel

from prefshift.methods.registry import Build, Method, bradley_terry


class Settings(BaseModel):
    fail: str = ""


def objective(build: Build):
    if build.settings.fail == "objective":
        raise ValueError("the margin table is empty")
    if build.settings.fail == "type":
        return "not an objective"
    return bradley_terry(build)


def prepare(model, objective, build: Build):
    raise RuntimeError("cannot freeze layer 7")


METHOD = Method(name="toy_margin", labels="weak", objective=objective, settings=Settings, prepare=prepare)
"""

BAD_LABELS_MODULE = """
from prefshift.methods.registry import Method, bradley_terry

METHOD = Method(name="toy_margin", labels="gold_ish", objective=bradley_terry)
"""


@pytest.fixture
def reinstallable(tmp_path, monkeypatch):
    """Install a toy package variant on sys.path, with the registry's caches cleared around it."""

    def install(module: str) -> Path:
        site = _install(tmp_path, module)
        monkeypatch.syspath_prepend(str(site))
        method_entry_points.cache_clear()
        registry._loaded.cache_clear()
        sys.modules.pop("toy_margin_method", None)
        return site

    yield install
    method_entry_points.cache_clear()
    registry._loaded.cache_clear()
    sys.modules.pop("toy_margin_method", None)


def test_a_failing_objective_factory_or_hook_is_one_line_naming_the_package(reinstallable):
    from prefshift.core.errors import boundary_line

    reinstallable(FAILING_MODULE)
    package = "method toy_margin (package toy-margin-method 0.3.0)"
    params = parse_params({"methods": ["toy_margin"], "toy_margin": {"fail": "objective"}}, "params.yaml")
    with pytest.raises(registry.MethodError) as err:
        build_objective("toy_margin", params, 2)
    line = boundary_line(err.value)
    assert line.startswith(f"{package}: its objective factory failed: ValueError: the margin table is empty")
    assert "(at toy_margin_method.py:" in line and "in objective)" in line and "\n" not in line

    params = parse_params({"methods": ["toy_margin"], "toy_margin": {"fail": "type"}}, "params.yaml")
    with pytest.raises(
        registry.MethodError, match=f"{re.escape(package)}: its objective factory returned a str"
    ):
        build_objective("toy_margin", params, 2)

    spec = registry.get("toy_margin")
    built = registry.build("toy_margin", parse_params({"methods": ["toy_margin"]}, "params.yaml"), 2)
    with pytest.raises(
        registry.MethodError, match=f"{re.escape(package)}: its prepare hook failed: RuntimeError"
    ):
        registry.call_hook(spec, "prepare hook", spec.prepare, None, None, built)

    params = parse_params({"methods": ["toy_margin"], "toy_margin": {"fail": [1]}}, "params.yaml")
    with pytest.raises(
        ConfigError, match=r"toy_margin\.fail.*\(settings of method toy_margin, package toy-margin"
    ):
        train_settings("toy_margin", params)


def test_a_built_in_method_s_failure_keeps_its_traceback():
    """A failure inside prefshift's own method is a prefshift bug, not an input to correct."""
    spec = registry.get("naive")

    def broken(*_):
        raise KeyError("bug")

    with pytest.raises(KeyError):
        registry.call_hook(spec, "prepare hook", broken)


def test_the_cli_refuses_a_plug_in_with_unknown_labels_before_writing_anything(reinstallable, tmp_path):
    """Before, a Method with an unknown `labels` value trained on some other source in silence."""
    site = reinstallable(BAD_LABELS_MODULE)
    root = tmp_path / "project"
    root.mkdir()
    (root / "params.yaml").write_text("methods: [naive, toy_margin]\n")
    env = {**os.environ, "PYTHONPATH": _with(site), "HF_HUB_OFFLINE": "1"}
    cmd = [
        PREFSHIFT,
        "targets",
        "--method",
        "toy_margin",
        "--root",
        str(root),
        "-p",
        str(root / "params.yaml"),
    ]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=BOUND_S, cwd=root)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert "of toy-margin-method 0.3.0" in done.stderr
    assert "labels 'gold_ish' is not one of gold, weak, seam" in done.stderr
    assert not (root / "data").exists()
