"""`prefshift sweep`: a grid of params run as DVC experiments, results filed for the report.

Each grid point is one `dvc exp run --temp -S key=value ... evaluate@<method>...`: DVC
copies the repository to a temporary directory, applies the overrides there, reruns only
what they invalidate (the run cache and dvc.lock cover the rest) and commits the result to
an experiment ref. The user's params.yaml and outputs are never touched. Points run one
after another: the experiments share the machine's CPUs anyway, and a synchronous run
reports a failure at the point that failed.

A temporary copy holds the git-tracked files (with uncommitted changes) plus DVC-cached
outputs, but not untracked `cache: false` outputs (training logs, metrics JSON); without
them DVC would retrain the teacher, so they are carried with `-C` (see `copy_paths`).
Committing them with dvc.lock, as DVC intends, makes that unnecessary.

Results are read from the experiment ref itself (`git show <ref>:reports/metrics/<m>.json`;
DVC commits `cache: false` outputs there) and written to reports/sweeps/ as the report
expects them: the metrics JSON plus {"sweep": {<dotted key>: <value from the
experiment's params.yaml>}}. Experiment names are readable (`sweep-anchor.lambda-0.01`);
rerunning a point replaces the experiment of that name on the same baseline commit.
"""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from prefshift.atomic import write_json
from prefshift.config import check_method, load_params, read_yaml, split_override
from prefshift.errors import PrefshiftError
from prefshift.paths import Layout

DEFAULT_METHODS = ("anchor_last", "anchor_mid")
_REF_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


class SweepError(PrefshiftError):
    """A grid that cannot be parsed, or an experiment that failed or left no result."""


def split_values(text: str) -> list[str]:
    """Split `a,b,[c,d]` on top-level commas, so list values like `[0.25,0.5]` stay whole."""
    values, depth, current = [], 0, ""
    for char in text:
        depth += {"[": 1, "{": 1, "]": -1, "}": -1}.get(char, 0)
        if char == "," and depth == 0:
            values.append(current.strip())
            current = ""
        else:
            current += char
    values.append(current.strip())
    return values


def parse_grid(specs: Sequence[str]) -> dict[str, list[str]]:
    """`-S key=v1,v2` items → {key: [v1, v2]} (values kept as text; DVC parses them)."""
    if not specs:
        raise SweepError("nothing to sweep: pass at least one -S key=value1,value2")
    grid: dict[str, list[str]] = {}
    for spec in specs:
        keys, values = split_override(spec)
        key = ".".join(keys)
        if key in grid:
            raise SweepError(f"-S {key}: given twice; list every value in one -S")
        points = split_values(values)
        if any(not v for v in points):
            raise SweepError(f"-S {spec!r}: empty value in the list")
        grid[key] = points
    return grid


def grid_points(grid: Mapping[str, Sequence[str]]) -> list[dict[str, str]]:
    keys = list(grid)
    return [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*(grid[k] for k in keys))]


def experiment_name(point: Mapping[str, str]) -> str:
    """A git-ref-safe readable name, e.g. `sweep-anchor.lambda-0.01`."""
    parts = [f"{key}-{_REF_UNSAFE.sub('_', value).strip('_')}" for key, value in point.items()]
    return "sweep-" + "-".join(parts)


def sweep_filename(method: str, sweep: Mapping[str, Any]) -> str:
    parts = [f"{key}={json.dumps(value, separators=(',', ':'))}" for key, value in sweep.items()]
    return "__".join([method, *parts]).replace("/", "_") + ".json"


def _git(root: Path, *args: str) -> str:
    done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True)
    if done.returncode != 0:
        raise SweepError(f"git {' '.join(args)} (in {root}) failed: {done.stderr.strip()}")
    return done.stdout


def _dvc(root: Path, args: Sequence[str]) -> str:
    """Run dvc, echoing its output as it comes (an experiment can take minutes); return it."""
    sibling = Path(sys.executable).parent / "dvc"  # the dvc installed with prefshift, else PATH's
    command = [str(sibling) if sibling.exists() else "dvc", *args]
    proc = subprocess.Popen(command, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    for line in proc.stdout:
        sys.stderr.write(line)
        lines.append(line)
    output = "".join(lines)
    if proc.wait() != 0:
        raise SweepError(f"`dvc {' '.join(args)}` failed (exit {proc.returncode}):\n{output[-3000:]}")
    return output


def _tracked_dirs(root: Path) -> set[Path]:
    """Directories that hold a git-tracked file: the ones a temporary experiment copy has."""
    files = _git(root, "ls-files", "-z").split("\0")
    return {parent for f in files if f for parent in Path(f).parents}


def copy_paths(root: Path) -> tuple[list[str], list[str]]:
    """Paths to pass with `-C`, and the `cache: false` outputs that cannot be passed.

    DVC copies a `-C` path only where its parent directory exists in the temporary copy,
    so each untracked output is carried by its shallowest ancestor that git does not
    track. An ancestor that would also carry DVC-cached outputs (models, parquet) is
    skipped instead: those come from the cache, and the stage owning the output reruns.
    An untracked dvc.lock is carried too, or every stage would count as never run.
    """
    from dvc.repo import Repo

    with Repo(str(root)) as repo:
        base = root.resolve()
        outs = [out for stage in repo.index.stages for out in stage.outs]
        rel = [(Path(out.fs_path).resolve().relative_to(base), out.use_cache) for out in outs]
    tracked_files = set(filter(None, _git(root, "ls-files", "-z").split("\0")))
    present = _tracked_dirs(root)
    cached = [path for path, use_cache in rel if use_cache]
    roots, skipped = set(), []
    for path, use_cache in rel:
        if use_cache or not (root / path).exists() or path.as_posix() in tracked_files:
            continue
        carrier = next(a for a in [*reversed(path.parents), path] if a != Path(".") and a not in present)
        if any(c == carrier or carrier in c.parents for c in cached):
            skipped.append(path.as_posix())
        else:
            roots.add(carrier.as_posix())
    if (root / "dvc.lock").exists() and "dvc.lock" not in tracked_files:
        roots.add("dvc.lock")
    return sorted(roots), sorted(skipped)


def experiment_ref(root: Path, name: str) -> str | None:
    """The ref of experiment `name` on the current HEAD (refs/exps/<sha[:2]>/<sha[2:]>/<name>)."""
    head = _git(root, "rev-parse", "HEAD").strip()
    ref = f"refs/exps/{head[:2]}/{head[2:]}/{name}"
    return ref if _git(root, "for-each-ref", ref).strip() else None


def _dotted(tree: Mapping[str, Any], key: str, where: str) -> Any:
    node: Any = tree
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            raise SweepError(f"{where}: no param {key!r}")
        node = node[part]
    return node


def ran_stages(output: str) -> list[str]:
    return [line.split("'")[1] for line in output.splitlines() if line.startswith("Running stage '")]


def run_point(root: Path, point: Mapping[str, str], methods: Sequence[str], copies: Sequence[str]) -> dict:
    name = experiment_name(point)
    if experiment_ref(root, name):
        _dvc(root, ["exp", "remove", name])
    args = ["exp", "run", "--temp", "--name", name]
    for key, value in point.items():
        args += ["-S", f"{key}={value}"]
    for path in copies:
        args += ["-C", path]
    output = _dvc(root, [*args, *(f"evaluate@{m}" for m in methods)])
    ref = experiment_ref(root, name)
    if ref is None:
        raise SweepError(f"experiment {name} finished but no ref refs/exps/.../{name} exists on HEAD")
    return {"name": name, "ref": ref, "point": dict(point), "stages": ran_stages(output)}


def collect(root: Path, experiment: Mapping[str, Any], methods: Sequence[str], layout: Layout) -> list[Path]:
    """Write reports/sweeps/<method>__<key>=<value>.json for each method from the experiment's ref."""
    ref = experiment["ref"]
    params = read_yaml(_git(root, "show", f"{ref}:params.yaml"), f"{ref}:params.yaml")
    sweep = {key: _dotted(params, key, f"{ref}:params.yaml") for key in experiment["point"]}
    written = []
    for method in methods:
        rel = layout.metrics(method).relative_to(layout.root).as_posix()
        try:
            metrics = json.loads(_git(root, "show", f"{ref}:{rel}"))
        except json.JSONDecodeError as err:
            raise SweepError(f"{ref}:{rel}: not valid JSON ({err})") from None
        path = layout.sweeps_dir / sweep_filename(method, sweep)
        write_json(path, {**metrics, "sweep": sweep})
        written.append(path)
    return written


def run(
    root: Path, specs: Sequence[str], methods: Sequence[str] = DEFAULT_METHODS, report: bool = True
) -> dict[str, Any]:
    """Run every grid point as an experiment, file its results, then rebuild the report."""
    root = Path(root)
    layout = Layout(root)
    methods = [check_method(m) for m in methods]
    if not methods or len(set(methods)) != len(methods):
        raise SweepError(f"--methods {','.join(methods)!r}: name each method to collect once, e.g. naive")
    grid = parse_grid(specs)
    points = grid_points(grid)
    for point in points:  # a typo or a bad value fails here, before any experiment starts
        load_params(root / "params.yaml", [f"{k}={v}" for k, v in point.items()])
    copies, skipped = copy_paths(root)
    if skipped:
        sys.stderr.write(
            f"note: {len(skipped)} untracked `cache: false` output(s) cannot be carried into the experiments "
            f"({', '.join(skipped)}); commit them (with dvc.lock) so their stages do not rerun\n"
        )
    experiments = []
    for point in points:
        experiment = run_point(root, point, methods, copies)
        experiment["files"] = [str(p) for p in collect(root, experiment, methods, layout)]
        experiments.append(experiment)
    if report:
        from prefshift.stages import report as report_stage

        report_stage.run(load_params(root / "params.yaml"), layout)
    return {"experiments": experiments, "report": str(layout.summary) if report else None}
