"""The report's figures (reports/figures) and DVC plot series (reports/plots)."""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from prefshift.core.atomic import write_text
from prefshift.core.paths import Layout
from prefshift.pipeline.stages.report_ablations import lambda_figure
from prefshift.pipeline.stages.report_format import models_of, ordered
from prefshift.science import figures as figs
from prefshift.science.metrics import ID_SPLIT


def _csv(path: Path, frame: pd.DataFrame) -> None:
    buffer = io.StringIO()
    frame.to_csv(buffer, index=False, lineterminator="\n")
    write_text(path, buffer.getvalue())


def _accuracy_rows(models: Mapping[str, Mapping[str, Any]], targets: Sequence[str]) -> pd.DataFrame:
    rows = []
    for name, m in models.items():
        blocks = {ID_SPLIT: m["id"], **{t: m["targets"][t] for t in targets}}
        for split, block in blocks.items():
            ci = block["ci"]["acc"] if isinstance(block["ci"], Mapping) else block["ci"]
            rows.append(
                {"model": name, "split": split, "acc": block["acc"], "ci_low": ci[0], "ci_high": ci[1]}
            )
    return pd.DataFrame(rows, columns=["model", "split", "acc", "ci_low", "ci_high"])


def write_figures(
    layout: Layout,
    metrics: Mapping[str, Mapping[str, Any]],
    targets: Sequence[str],
    logs: Mapping[str, Mapping[str, Any]],
    lambda_series: pd.DataFrame,
    into: Path | None = None,
) -> list[Path]:
    """The figures, written into `into` (the report's staged figures directory) or reports/figures."""
    out = into or layout.figures
    models = models_of(metrics)
    points = {}
    for name, m in models.items():
        ood_ci = m["ci"]["mean_acc_ood"]
        points[name] = (
            figs.Estimate(m["id"]["acc"], m["id"]["ci"]),
            figs.Estimate(m["mean_acc_ood"], ood_ci),
        )
    written = [out / "id_vs_ood.png", out / "gains.png"]
    figs.id_vs_ood(points, written[0])
    figs.gains(
        {
            gain.upper(): {
                method: {
                    t: figs.Estimate(
                        metrics[method]["targets"][t][gain], metrics[method]["targets"][t]["ci"][gain]
                    )
                    for t in targets
                }
                for method in ordered(metrics)
            }
            for gain in ("aog", "nts")
        },
        written[1],
    )
    curves = {name: log["steps"] for name, log in logs.items() if log.get("steps")}
    if curves:
        written.append(out / "training.png")
        figs.training_curves(curves, written[-1])
    drifts = {name: log["drift"] for name, log in logs.items() if log.get("drift")}
    if drifts:
        written.append(out / "drift.png")
        figs.drift(drifts, written[-1])
    if not lambda_series.empty:
        written.append(out / "lambda_ablation.png")
        lambda_figure(lambda_series, written[-1])
    return written


def write_plots(
    layout: Layout, metrics: Mapping, targets: Sequence[str], logs: Mapping, lambda_series, into=None
) -> None:
    plots = into or layout.plots_dir
    _csv(plots / "accuracy.csv", _accuracy_rows(models_of(metrics), targets))
    for name, log in logs.items():
        if log.get("steps"):
            frame = pd.DataFrame(log["steps"]).reindex(columns=["step", "loss", "acc", "lr"])
            _csv(plots / "training" / f"{name}.csv", frame)
        if log.get("drift"):
            frame = pd.DataFrame(log["drift"])
            layers = sorted([c for c in frame.columns if c != "step"], key=figs.layer_order)
            frame["mean_cosine"] = frame[layers].mean(axis=1)
            _csv(plots / "drift" / f"{name}.csv", frame[["step", "mean_cosine", *layers]])
    if not lambda_series.empty:
        _csv(plots / "lambda.csv", lambda_series)
