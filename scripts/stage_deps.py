"""Each DVC stage's source deps, derived from the imports its command loads.

A stage of dvc.yaml runs `prefshift <command>`, which runs `prefshift.pipeline.stages.<command>`.
Every prefshift module that module imports, directly or through others (the import graph, read
by grimp, the library behind import-linter), can change what the stage writes, so each must be
a dep of the stage: otherwise editing it leaves DVC's results silently stale. The lists are not
kept by hand; this script writes them, and `make test` (tests/test_stage_deps.py) fails when
dvc.yaml and the import graph disagree.

Left out, because they cannot change a stage's outputs, only how it talks while it runs:
EXEMPT below. Methods load through entry points, which no import statement shows; the registry
is therefore taken to import every built-in method module (IMPLICIT). A directory is listed
instead of its files when the stage needs every module in it.

Usage: python scripts/stage_deps.py [--write] [--dvc-yaml PATH]
  (no flag: check, print what differs, exit 1 if anything does)
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from pathlib import Path

import grimp
import yaml

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src"
PACKAGE = "prefshift"
EXEMPT = {
    "prefshift.cli": "argument parsing; the stage module and params do the work",
    "prefshift.core.console": "terminal output",
    "prefshift.core.progress": "progress lines",
    "prefshift.core.signals": "how a stage stops on a signal",
    "prefshift.core.errors": "error classes and messages",
    "prefshift.core.locks": "writer locks: who may write, not what",
    "prefshift.tracking": "MLflow bookkeeping: runs and their records, not the stage's files",
}
IMPLICIT = {"prefshift.methods.registry": "prefshift.methods.builtin"}
DEP_LINE = re.compile(r"^(\s*)- (src/prefshift/\S*)\s*$")


def _exempt(module: str) -> bool:
    return any(module == m or module.startswith(m + ".") for m in EXEMPT) or _docstring_only(module)


def _docstring_only(module: str) -> bool:
    """A package `__init__` that holds only its docstring runs no code, so it cannot change an output."""
    path = REPO / _path(module)
    if path.name != "__init__.py":
        return False
    body = ast.parse(path.read_text(encoding="utf-8")).body
    return all(isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) for node in body)


def _graph() -> grimp.ImportGraph:
    graph = grimp.build_graph(PACKAGE, cache_dir=None)
    for importer, package in IMPLICIT.items():
        for module in graph.find_children(package) | {package}:
            graph.add_import(importer=importer, imported=module)
    return graph


def _path(module: str) -> str:
    base = SRC / Path(*module.split("."))
    file = base / "__init__.py" if base.is_dir() else base.with_suffix(".py")
    return str(file.relative_to(REPO))


def _subtree(graph: grimp.ImportGraph, package: str) -> set[str]:
    return {package} | graph.find_descendants(package)


def _collapse(graph: grimp.ImportGraph, needed: set[str], package: str = PACKAGE) -> list[str]:
    """Paths covering `needed`: a directory when every module under it is needed (its `__init__`
    may be exempt), else its parts."""
    package_dir = graph.find_children(package) and package != PACKAGE
    inert = {m for m in _subtree(graph, package) if _docstring_only(m)}
    if package_dir and _subtree(graph, package) - inert <= needed:
        return [str((SRC / Path(*package.split("."))).relative_to(REPO))]
    paths = [_path(package)] if package in needed else []
    for child in sorted(graph.find_children(package)):
        if _subtree(graph, child) & needed:
            paths += _collapse(graph, needed, child)
    return paths


def required(graph: grimp.ImportGraph, command: str) -> list[str]:
    """The source paths `prefshift <command>` loads, less EXEMPT, as dvc.yaml should list them."""
    entry = f"{PACKAGE}.pipeline.stages.{command.replace('-', '_')}"
    if entry not in graph.modules:
        raise SystemExit(f"dvc.yaml runs `prefshift {command}`, but there is no module {entry}")
    return _collapse(graph, {m for m in _loaded(graph, entry) if not _exempt(m)})


def _loaded(graph: grimp.ImportGraph, entry: str) -> set[str]:
    """`entry` and every module importing it loads. Importing a module runs its packages'
    `__init__` first, and what those import, which the graph does not show as edges."""
    loaded: set[str] = set()
    todo = {entry}
    while todo:
        module = todo.pop()
        parts = module.split(".")
        found = {module} | graph.find_upstream_modules(module)
        found |= {".".join(parts[:i]) for i in range(1, len(parts))}
        todo |= found - loaded - {module}
        loaded |= found
    return loaded


def _stages(text: str) -> dict[str, str]:
    """stage name -> the prefshift command it runs."""
    stages = yaml.safe_load(text)["stages"]
    return {name: (body.get("do") or body)["cmd"].split()[1] for name, body in stages.items()}


def _blocks(lines: list[str]) -> dict[str, tuple[int, int]]:
    """stage name -> (first, last + 1) line index of its `src/prefshift` dep lines."""
    blocks: dict[str, tuple[int, int]] = {}
    stage = None
    for i, line in enumerate(lines):
        top = re.match(r"^  (\w[\w-]*):\s*$", line)
        if top:
            stage = top.group(1)
        if stage and DEP_LINE.match(line):
            first, _ = blocks.get(stage, (i, i))
            blocks[stage] = (first, i + 1)
    return blocks


def compare(text: str) -> tuple[str, list[str]]:
    """(dvc.yaml with derived deps, one line per difference)."""
    graph = _graph()
    lines = text.splitlines(keepends=True)
    blocks = _blocks(lines)
    problems: list[str] = []
    for name, command in reversed(list(_stages(text).items())):
        if name not in blocks:
            problems.append(f"stage {name}: lists no src/prefshift deps")
            continue
        first, end = blocks[name]
        listed = [DEP_LINE.match(line).group(2) for line in lines[first:end] if DEP_LINE.match(line)]
        if len(listed) != end - first:
            problems.append(f"stage {name}: keep its src/prefshift deps together, one per line")
            continue
        want = required(graph, command)
        for path in sorted(set(want) - set(listed)):
            problems.append(f"stage {name}: missing dep {path} (`prefshift {command}` loads it)")
        for path in sorted(set(listed) - set(want)):
            problems.append(f"stage {name}: dep {path} is not loaded by `prefshift {command}`")
        indent = DEP_LINE.match(lines[first]).group(1)
        lines[first:end] = [f"{indent}- {path}\n" for path in want]
    return "".join(lines), problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="rewrite dvc.yaml's src deps")
    parser.add_argument("--dvc-yaml", type=Path, default=REPO / "dvc.yaml")
    args = parser.parse_args(argv)
    text = args.dvc_yaml.read_text(encoding="utf-8")
    derived, problems = compare(text)
    if args.write:
        if derived != text:
            tmp = args.dvc_yaml.with_name(args.dvc_yaml.name + ".tmp")
            tmp.write_text(derived, encoding="utf-8")
            tmp.replace(args.dvc_yaml)
        print(f"{args.dvc_yaml}: {len(problems)} difference(s) fixed")
        return 0
    for problem in problems:
        print(f"{args.dvc_yaml}: {problem}", file=sys.stderr)
    if problems:
        print("run `python scripts/stage_deps.py --write` to derive them from the imports", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
