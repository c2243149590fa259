"""A finished sweep's results: each point's numbers checked in its experiment commit, then filed.

Each method's per-seed metrics are copied from the commit into reports/sweeps/ as the report reads
them: the full JSON (with the confidence intervals `dvc exp show` drops) plus {"sweep": {<dotted
key>: <value in the experiment's params.yaml>, "seed": <seed>}}. These copies outlive `dvc exp gc`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from prefshift.config.params import Params, get_dotted, is_finite_number, load_params, parse_params, read_yaml
from prefshift.core.atomic import OutputError, refuse_unowned, write_json
from prefshift.core.paths import Layout
from prefshift.pipeline.sweep.commands import SweepError, run_git
from prefshift.pipeline.sweep.grid import capped, dvc_value, experiment_name

HEADLINE = ("wrg", "mean_aog", "mean_nts")
MAX_FILENAME = 241
"""Bytes in a filed record's name: filesystems take 255, and a write's scratch copy beside it adds
14. Every name that could be filed before names were cut is so still: no record is filed twice."""


def sweep_filename(method: str, sweep: Mapping[str, Any]) -> str:
    """`<method>__<key>=<value>__...json` (a `/` made `_`); one that would pass MAX_FILENAME (a grid
    file's points set a dozen params) is cut and ends in a hash of the whole. The report reads the
    records' own `sweep` field, never their names."""
    parts = [f"{key}={json.dumps(value, separators=(',', ':'))}" for key, value in sweep.items()]
    return capped("__".join([method, *parts]).replace("/", "_"), MAX_FILENAME - len(".json")) + ".json"


def _json_at(root: Path, rev: str, rel: str) -> Mapping[str, Any]:
    """The JSON object `rel` in commit `rev`; {} if it has none or it is no JSON object, so that
    every headline number it should hold is reported missing."""
    try:
        data = json.loads(run_git(root, "show", f"{rev}:./{rel}"))  # ./: from the project's folder
    except (SweepError, ValueError):
        return {}
    return data if isinstance(data, Mapping) else {}


def _missing(block: Any, prefix: str) -> list[str]:
    block = block if isinstance(block, Mapping) else {}
    return [f"{prefix}{key}" for key in HEADLINE if not is_finite_number(block.get(key))]


def point_results(
    root: Path, rev: str, point: Mapping[str, str], methods: Sequence[str], layout: Layout
) -> tuple[list[tuple[Path, dict]], list[str]]:
    """The records to file for one experiment commit (each of `methods` that it trains), and every
    headline number it lacks."""
    params = read_yaml(run_git(root, "show", f"{rev}:./params.yaml"), where := f"{rev[:7]}:params.yaml")
    try:
        sweep = {key: get_dotted(params, key) for key in point}
    except KeyError as err:
        raise SweepError(f"{where}: no param {err.args[0]!r}") from None
    parsed, missing = parse_params(params, where), []  # the experiment's own, defaults included
    summary_rel = layout.metrics_summary.relative_to(layout.root).as_posix()
    summary, records = _json_at(root, rev, summary_rel), []
    for method in (m for m in methods if m in parsed.methods):
        missing += _missing(summary.get(method), f"{summary_rel}:{method}.")
        for seed in parsed.seeds:
            rel = layout.for_seed(seed).metrics(method).relative_to(layout.root).as_posix()
            missing += _missing(own := _json_at(root, rev, rel), f"{rel}:")
            path, record = _filed_as(layout, method, sweep, seed)
            records.append((path, {**own, "sweep": record}))
    return records, missing


def _filed_as(layout: Layout, method: str, sweep: Mapping[str, Any], seed: int) -> tuple[Path, dict]:
    """Where one method's record of one seed of a point is filed, and its `sweep` field."""
    record = dict(sweep) if "seed" in sweep else {**sweep, "seed": seed}
    return layout.sweeps_dir / sweep_filename(method, record), record


def filing_problems(
    root: Path, points: Sequence[Mapping[str, str]], loaded: Sequence[Params], methods: Sequence[str]
) -> list[str]:
    """Why the records the sweep will file could not be written (a link, a folder or another user's
    file at a record's path; a file where reports/sweeps/ goes), found before any point runs: found
    when filing, they failed the sweep after every point had run."""
    layout, paths = Layout(root), []
    baseline = (Path(root) / "params.yaml").read_text(encoding="utf-8")
    for point, params in zip(points, loaded, strict=True):
        sweep = {key: dvc_value(baseline, key, text) for key, text in point.items()}
        paths += [
            _filed_as(layout, method, sweep, seed)[0]
            for method in methods
            if method in params.methods
            for seed in params.seeds
        ]
    relative = layout.sweeps_dir.relative_to(layout.root)  # reports/sweeps, and reports above it
    for folder in (layout.root / part for part in reversed([relative, *relative.parents][:-1])):
        if os.path.lexists(folder) and not folder.is_dir():  # a link to a folder is the user's choice
            return [f"{folder}: not a folder (a file, or a link to none), and the sweep files its records "
                    "in it; move it away"]  # fmt: skip
    problems = []
    for path in paths:
        try:
            refuse_unowned(path)
        except OutputError as err:
            problems.append(f"collect would file a record here: {err}")
    return problems


def file_results(
    root: Path,
    points: Sequence[Mapping[str, str]],
    commits: Sequence[str],
    methods: Sequence[str],
    report: bool,
) -> dict[str, Any]:
    """File every point's records in reports/sweeps/ and rebuild the report; nothing unless every
    point has a finite WRG, mean AOG and mean NTS for every one of `methods` that it trains."""
    layout, experiments, filed, problems = Layout(root), [], [], []
    for point, rev in zip(points, commits, strict=True):
        records, missing = point_results(root, rev, point, methods, layout)
        name, files = experiment_name(point), [str(path) for path, _ in records]
        problems += [f"{name} ({rev[:7]}): no numeric {', '.join(missing)}"] if missing else []
        experiments.append({"name": name, "rev": rev, "point": dict(point), "files": files})
        filed += records
    if problems:
        raise SweepError("experiments without results:\n  " + "\n  ".join(problems))
    for path, data in filed:
        write_json(path, data)
    if report:
        from prefshift.pipeline.stages import report as report_stage

        report_stage.run(load_params(root / "params.yaml"), layout)
    return {"experiments": experiments, "report": str(layout.summary) if report else None}
