"""The report's mechanism section: does staying close to the start buy OOD robustness, and which
way of staying close buys most?

One point per method and seed: its drift from the start (the cosine between its and the start's
final-layer states at the reward position on id_test, `prefshift.engine.drift`, copied into each
metrics file's `training` block) against its mean OOD accuracy; a table with the same numbers.
For WiSE-FT, the α curve: ID validation's and id_test's accuracy at every α from its training log
(training reads no OOD target), each target's from `score-target` (data/target_scores/wise_ft/
<target>/seed-<k>/on_target.json, the grid rebuilt from the kept θ_ft and scored on that target
alone), and the α chosen on ID validation data.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from prefshift.core.paths import Layout
from prefshift.pipeline.stages.report_errors import ReportError
from prefshift.pipeline.stages.score_target import on_target_path
from prefshift.science import figures as figs

Point = tuple[float, figs.Estimate, float]
"""(cosine at the reward position, mean OOD accuracy with its interval, ID accuracy)."""


def mechanism_points(runs: Mapping[int, Mapping[str, Mapping[str, Any]]]) -> dict[str, dict[int, Point]]:
    """method → seed → its Point, for every model whose metrics record the cosine."""
    points: dict[str, dict[int, Point]] = {}
    for seed, metrics in runs.items():
        for method, doc in metrics.items():
            cosine = (doc.get("training") or {}).get("reward_position_cosine")
            if cosine is not None:
                ood = figs.Estimate(doc["mean_acc_ood"], doc["ci"]["mean_acc_ood"])
                points.setdefault(method, {})[seed] = (cosine, ood, doc["id"]["acc"])
    return points


def mechanism_section(
    runs: Mapping[int, Mapping[str, Mapping[str, Any]]], figures_dir: Path
) -> tuple[str | None, list[Path]]:
    points = mechanism_points(runs)
    if not points:
        return None, []
    rows = ["| method | seed | cosine to start | ID acc | mean OOD acc |", "|---|---|---|---|---|"]
    for method, by_seed in points.items():
        for seed, (cosine, ood, id_acc) in by_seed.items():
            lo, hi = ood.ci or (ood.value, ood.value)
            rows.append(
                f"| {method} | {seed} | {cosine:.4f} | {id_acc:.1f} | {ood.value:.1f} [{lo:.1f}, {hi:.1f}] |"
            )
    path = figures_dir / "mechanism.png"
    figs.mechanism({m: [(c, ood) for c, ood, _ in by_seed.values()] for m, by_seed in points.items()}, path)
    seeds = len(runs)
    caution = (
        "One seed: read the ordering, not the gaps." if seeds == 1 else f"One point per seed ({seeds} seeds)."
    )
    text = (
        "## Staying close and OOD accuracy\n\n"
        "Cosine between each model's final-layer state at the reward position and its start's, "
        "mean over the first id_test pairs (1 = unmoved), after any post-training step; mean OOD "
        f"accuracy in %, with its interval. {caution}\n\n" + "\n".join(rows)
    )
    return text, [path]


def alpha_curves(logs: Mapping[str, Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    """method → its after_training record, for every method whose log has an α curve (WiSE-FT)."""
    found = {}
    for method, log in logs.items():
        record = log.get("after_training") or {}
        if "alphas" in record and "accuracy" in record:
            found[method] = record
    return found


def with_target_rows(
    logs: Mapping[str, Mapping[str, Any]], layout: Layout, targets: Sequence[str]
) -> dict[str, Mapping[str, Any]]:
    """`logs` with each α curve's OOD rows joined in: one row per listed target, from what
    `score-target` recorded on it for this layout's seed. A listed target without its row, or a row
    on another α grid, is refused with the stage to run, so the curve never silently lacks one."""
    out: dict[str, Mapping[str, Any]] = dict(logs)
    for method, record in alpha_curves(logs).items():
        accuracy = dict(record["accuracy"])
        for target in targets:
            path = on_target_path(layout, method, target)
            rerun = f"run `prefshift score-target --model {method} --target {target}`"
            if not path.exists():
                raise ReportError(f"{path}: no α curve of {method} on {target}; {rerun}")
            try:
                row = json.loads(path.read_text(encoding="utf-8"))
            except json.JSONDecodeError as err:
                raise ReportError(f"{path}: not valid JSON ({err}); {rerun}") from None
            if row.get("alphas") != record["alphas"]:
                raise ReportError(
                    f"{path}: α grid {row.get('alphas')}, the training log's is {record['alphas']}; {rerun}"
                )
            accuracy[target] = row["accuracy"][target]
        out[method] = {**logs[method], "after_training": {**record, "accuracy": accuracy}}
    return out


def _rule(record: Mapping[str, Any]) -> str:
    """How α was chosen: the one-standard-error rule (decided before results) or, in older logs, the best."""
    if record.get("rule") == "one standard error":
        return (
            f"by the one-standard-error rule (the smallest α within one binomial SE, "
            f"{record['standard_error']:.1f} pp on {record['validation_pairs']} pairs, of the best)"
        )
    return "as the best α (an older log, before the one-standard-error rule)"


def alpha_section(logs: Mapping[str, Mapping[str, Any]], figures_dir: Path) -> tuple[str | None, list[Path]]:
    curves = alpha_curves(logs)
    if not curves:
        return None, []
    parts, written = ["## WiSE-FT: accuracy against α"], []
    for method, record in curves.items():
        alphas: Sequence[float] = record["alphas"]
        header = "| split | " + " | ".join(f"α={a:g}" for a in alphas) + " |"
        rows = [header, "|---|" + "---|" * len(alphas)]
        for split, values in record["accuracy"].items():
            rows.append(f"| {split} | " + " | ".join(f"{v:.1f}" for v in values) + " |")
        path = figures_dir / f"alpha_{method}.png"
        figs.alpha_curve(alphas, record["accuracy"], record["chosen_alpha"], path)
        written.append(path)
        parts.append(
            f"{method}: α = {record['chosen_alpha']:g}, chosen on {record['chosen_on']} (teacher_train's "
            f"gold labels) only, {_rule(record)}; the other rows are recorded, never used to choose "
            "(each target's after training, by `score-target`).\n\n" + "\n".join(rows)
        )
    return "\n\n".join(parts), written
