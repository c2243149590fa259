"""A finished sweep's results: each point's numbers checked in its experiment commit, then filed.

Each method's metrics for each seed the experiment lists are read from its commit and written to
reports/sweeps/ as the report reads them: the full JSON (with the confidence intervals `dvc exp show`
drops) plus {"sweep": {<dotted key>: <value in the experiment's params.yaml>, "seed": <seed>}}.
These copies outlive `dvc exp gc`. Nothing is filed unless every point has a finite WRG, mean AOG
and mean NTS for every method.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from prefshift.config.params import load_params, read_yaml
from prefshift.core.atomic import write_json
from prefshift.core.paths import Layout
from prefshift.pipeline.sweep.commands import SweepError, run_git
from prefshift.pipeline.sweep.grid import experiment_name

HEADLINE = ("wrg", "mean_aog", "mean_nts")


def sweep_filename(method: str, sweep: Mapping[str, Any]) -> str:
    parts = [f"{key}={json.dumps(value, separators=(',', ':'))}" for key, value in sweep.items()]
    return "__".join([method, *parts]).replace("/", "_") + ".json"


def ran_stages(output: str) -> list[str]:
    return [line.split("'")[1] for line in output.splitlines() if line.startswith("Running stage '")]


def _dotted(tree: Mapping[str, Any], key: str, where: str) -> Any:
    node: Any = tree
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            raise SweepError(f"{where}: no param {key!r}")
        node = node[part]
    return node


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _json_at(root: Path, rev: str, rel: str) -> Any:
    """The JSON file `rel` in commit `rev`, None if it has none or it is no JSON (then reported)."""
    try:
        return json.loads(run_git(root, "show", f"{rev}:{rel}"))
    except (SweepError, ValueError):
        return None


def point_results(
    root: Path, rev: str, point: Mapping[str, str], methods: Sequence[str], layout: Layout
) -> tuple[list[tuple[Path, dict]], list[str]]:
    """The records to file for one experiment commit, and every headline number it lacks."""
    params = read_yaml(run_git(root, "show", f"{rev}:params.yaml"), f"{rev[:7]}:params.yaml")
    sweep = {key: _dotted(params, key, f"{rev[:7]}:params.yaml") for key in point}
    summary_rel = layout.metrics_summary.relative_to(layout.root).as_posix()
    summary = _json_at(root, rev, summary_rel) or {}
    records, missing = [], []
    for method in methods:
        block = summary.get(method) if isinstance(summary, Mapping) else None
        missing += [f"{summary_rel}:{method}.{k}" for k in HEADLINE if not _is_number((block or {}).get(k))]
        for seed in params.get("seeds") or [0]:
            rel = layout.for_seed(seed).metrics(method).relative_to(layout.root).as_posix()
            metrics = _json_at(root, rev, rel)
            own = metrics if isinstance(metrics, Mapping) else {}
            missing += [f"{rel}:{k}" for k in HEADLINE if not _is_number(own.get(k))]
            record = sweep if "seed" in sweep else {**sweep, "seed": seed}
            records.append((layout.sweeps_dir / sweep_filename(method, record), {**own, "sweep": record}))
    return records, missing


def file_results(
    root: Path,
    points: Sequence[Mapping[str, str]],
    commits: Sequence[str],
    logs: Sequence[str],
    methods: Sequence[str],
    report: bool,
) -> dict[str, Any]:
    """Check every point's experiment commit, then file them all in reports/sweeps/ and rebuild the
    report; `logs` are the points' run logs, from which the stages each one ran are read."""
    layout = Layout(root)
    checked, problems = [], []
    for point, rev in zip(points, commits, strict=True):
        records, missing = point_results(root, rev, point, methods, layout)
        if missing:
            problems.append(f"{experiment_name(point)} ({rev[:7]}): no numeric {', '.join(missing)}")
        checked.append(records)
    if problems:
        raise SweepError("experiments without results:\n  " + "\n  ".join(problems))
    experiments = []
    for point, rev, log, records in zip(points, commits, logs, checked, strict=True):
        for path, data in records:
            write_json(path, data)
        files = [str(path) for path, _ in records]
        name = experiment_name(point)
        experiments.append(
            {"name": name, "rev": rev, "point": dict(point), "stages": ran_stages(log), "files": files}
        )
    if report:
        from prefshift.pipeline.stages import report as report_stage

        report_stage.run(load_params(root / "params.yaml"), layout)
    return {"experiments": experiments, "report": str(layout.summary) if report else None}
