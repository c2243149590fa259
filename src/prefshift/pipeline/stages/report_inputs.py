"""What the report reads, checked before anything renders: every seed's metrics files, sweep
results, one split version, one teacher per seed."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from prefshift.config.params import Params
from prefshift.core.paths import Layout
from prefshift.data.splits import load_manifest
from prefshift.pipeline.stages.report_errors import ReportError
from prefshift.pipeline.sweep_points import replicate_seed
from prefshift.science.metrics import ID_SPLIT, check_finite, with_ceiling


def read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ReportError(f"{path}: not valid JSON ({err})") from None
    if not isinstance(data, dict):
        raise ReportError(f"{path}: expected a JSON object")
    for key in ("method", "split_version", "id", "teacher", "targets"):
        if key not in data:
            raise ReportError(f"{path}: not a metrics file (no {key!r}); re-run `prefshift evaluate`")
    check_finite(data, str(path))
    return data


def load_runs(params: Params, layout: Layout) -> dict[int, dict[str, dict[str, Any]]]:
    """seed → method → metrics document, for every seed params list (reports/metrics/<method>/seed-<k>.json).

    The first listed seed's documents are the detail tables' (the report names it); a seed with
    no metrics at all is left out and the header says which seeds the numbers rest on.
    """
    runs = {}
    for seed in params.seeds:
        seeded = layout.for_seed(seed)
        found = {m: read_json(seeded.metrics(m)) for m in params.methods if seeded.metrics(m).exists()}
        if "ceiling" in found:
            found = {m: v if m == "ceiling" else with_ceiling(v, found["ceiling"]) for m, v in found.items()}
        if found:
            runs[seed] = found
    first = layout.for_seed(params.seeds[0]).metrics("x").parent
    if params.seeds[0] not in runs:
        raise ReportError(
            f"no metrics in {first} (the first seed of params `seeds`); run `dvc repro`, or "
            f"`prefshift evaluate --method M --seed {params.seeds[0]}` for one of {', '.join(params.methods)}"
        )
    return runs


def load_sweeps(layout: Layout) -> list[dict[str, Any]]:
    runs = []
    for path in sorted(layout.sweeps_dir.glob("*.json")):
        data = read_json(path)
        if not isinstance(data.get("sweep"), dict) or not data["sweep"]:
            raise ReportError(f"{path}: a sweep result needs a non-empty 'sweep' object of dotted params")
        data["_path"] = str(path)
        runs.append(data)
    return runs


def check_versions(named: Mapping[str, Mapping[str, Any]], layout: Layout) -> str:
    """One split version for everything compared, equal to the current manifest's when there is one."""
    versions = {name: str(m["split_version"]) for name, m in named.items()}
    if layout.split_manifest.exists():
        versions = {"current splits (manifest)": str(load_manifest(layout)["version"]), **versions}
    if len(set(versions.values())) > 1:
        listing = "; ".join(f"{name}: {v}" for name, v in versions.items())
        raise ReportError(
            f"refusing to compare metrics from different split versions ({listing}); "
            f"re-run `prefshift evaluate` for the stale ones (or remove stale sweep files)"
        )
    return next(iter(versions.values()))


def check_replicates(replicates: Sequence[Mapping[str, Any]]) -> None:
    """Seed replicates: one split version per seed, shared by its methods.

    `seed` reshuffles the split, so a replicate's split differs from the main run's by design;
    what must hold is that the methods compared within one seed saw the same split.
    """
    by_seed: dict[int, dict[str, str]] = defaultdict(dict)
    for run in replicates:
        by_seed[replicate_seed(run["sweep"])][run["_path"]] = str(run["split_version"])
    for seed, versions in sorted(by_seed.items()):
        if len(set(versions.values())) > 1:
            listing = "; ".join(f"{name}: {v}" for name, v in versions.items())
            raise ReportError(
                f"seed {seed}'s replicates come from different split versions ({listing}); "
                "re-run that seed's sweep point (or remove its stale sweep files)"
            )


def _teacher_accuracies(m: Mapping[str, Any]) -> dict[str, float]:
    teacher = m["teacher"]
    return {ID_SPLIT: teacher["id"]["acc"], **{t: block["acc"] for t, block in teacher["targets"].items()}}


def check_teachers(runs: Mapping[int, Mapping[str, Mapping[str, Any]]], layout: Layout) -> None:
    """Within a seed every method compares to one teacher labelling and one list of targets."""
    for seed, metrics in runs.items():
        seeded = layout.for_seed(seed)
        first = next(iter(metrics.values()))
        targets = first["setting"]["targets"]
        for name, m in metrics.items():
            if _teacher_accuracies(m) != _teacher_accuracies(first):
                raise ReportError(
                    f"{seeded.metrics(name)}: its teacher accuracies differ from {first['method']}'s, so the "
                    "teacher was re-labelled in between; re-run `prefshift evaluate` for every method of "
                    f"seed {seed}"
                )
            if m["setting"]["targets"] != targets:
                raise ReportError(
                    f"{seeded.metrics(name)}: evaluated on targets {m['setting']['targets']}, "
                    f"others on {targets}; re-run `prefshift evaluate --method {name} --seed {seed}`"
                )
