"""A finished sweep's results: each point's numbers checked in its experiment commit, then filed.

Each method's per-seed metrics are copied from the commit into reports/sweeps/ as the report reads
them: the full JSON (with the confidence intervals `dvc exp show` drops) plus {"sweep": {<dotted
key>: <value in the experiment's params.yaml>, "seed": <seed>}}. These copies outlive `dvc exp gc`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from prefshift.config.params import get_dotted, is_finite_number, load_params, parse_params, read_yaml
from prefshift.core.atomic import write_json
from prefshift.core.paths import Layout
from prefshift.pipeline.sweep.commands import SweepError, run_git
from prefshift.pipeline.sweep.grid import capped, experiment_name

HEADLINE = ("wrg", "mean_aog", "mean_nts")
MAX_FILENAME = 200
"""Bytes in a filed record's name: filesystems take 255, and a write's scratch copy beside it adds 14."""


def sweep_filename(method: str, sweep: Mapping[str, Any]) -> str:
    """`<method>__<key>=<value>__...json`, readable; one that would hold a `/` or pass MAX_FILENAME
    (a grid file's points set a dozen params) is cut and ends in a hash of the whole, so that no two
    records share a file. The report reads the records' own `sweep` field, never their names."""
    parts = [f"{key}={json.dumps(value, separators=(',', ':'))}" for key, value in sweep.items()]
    whole = "__".join([method, *parts])
    return capped(whole.replace("/", "_"), MAX_FILENAME - len(".json"), whole) + ".json"


def _json_at(root: Path, rev: str, rel: str) -> Mapping[str, Any]:
    """The JSON object `rel` in commit `rev`; {} if it has none or it is no JSON object, so that
    every headline number it should hold is reported missing."""
    try:
        data = json.loads(run_git(root, "show", f"{rev}:{rel}"))
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
    params = read_yaml(run_git(root, "show", f"{rev}:params.yaml"), where := f"{rev[:7]}:params.yaml")
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
            record = sweep if "seed" in sweep else {**sweep, "seed": seed}
            records.append((layout.sweeps_dir / sweep_filename(method, record), {**own, "sweep": record}))
    return records, missing


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
