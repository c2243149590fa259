"""The report's ablation tables and λ series, from sweep results (reports/sweeps/*.json)."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from prefshift.pipeline.stages.report_format import sd_cell, table
from prefshift.pipeline.sweep_points import ablation_keys
from prefshift.science import figures as figs
from prefshift.science.metrics import across_seeds

ABLATION_KEYS = ("id.acc", "wrg", "mean_acc_ood", "mean_aog", "mean_nts", "training.final_drift_mean")


LAMBDA_KEY = "anchor.lambda"


def sweep_groups(sweeps: Sequence[Mapping[str, Any]]) -> dict[str, dict[tuple[str, str], list[Mapping]]]:
    grouped: dict[str, dict[tuple[str, str], list[Mapping]]] = defaultdict(lambda: defaultdict(list))
    for run in sweeps:
        for key in ablation_keys(run["sweep"]):
            grouped[key][(run["method"], json.dumps(run["sweep"][key]))].append(run)
    return grouped


def ablation_tables(sweeps: Sequence[Mapping[str, Any]]) -> str:
    sections = []
    for key, cells in sorted(sweep_groups(sweeps).items()):
        rows = []
        for (method, value), runs in sorted(cells.items(), key=lambda kv: (kv[0][0], _sort_value(kv[0][1]))):
            stats = across_seeds(runs, ABLATION_KEYS)
            cells = [sd_cell(stats[k], 3 if k.startswith("training.") else 1) for k in ABLATION_KEYS]
            rows.append([method, value, str(len(runs)), *cells])
        sections.append(
            f"### {key}\n\n"
            + table(
                [
                    "Method",
                    key,
                    "runs",
                    "ID acc",
                    "WRG",
                    "mean OOD acc",
                    "mean AOG",
                    "mean NTS",
                    "final drift cos",
                ],
                rows,
            )
        )
    return "\n\n".join(sections)


def _sort_value(text: str) -> tuple[int, Any]:
    value = json.loads(text)
    return (0, value) if isinstance(value, (int, float)) else (1, text)


def lambda_series(sweeps: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    rows = []
    for (method, value), runs in sorted(sweep_groups(sweeps).get(LAMBDA_KEY, {}).items()):
        stats = across_seeds(runs, ABLATION_KEYS)
        rows.append(
            {
                "method": method,
                "lambda": float(json.loads(value)),
                "seeds": len(runs),
                "wrg": stats["wrg"]["mean"],
                "mean_aog": stats["mean_aog"]["mean"],
                "mean_nts": stats["mean_nts"]["mean"],
                "drift_cosine": stats["training.final_drift_mean"]["mean"],
                **{f"{k}_std": stats[k]["std"] for k in ("wrg", "mean_aog", "mean_nts")},
            }
        )
    return pd.DataFrame(rows)


def lambda_figure(series: pd.DataFrame, path: Path) -> None:
    curves: dict[str, dict[str, list[tuple[float, figs.Estimate]]]] = defaultdict(lambda: defaultdict(list))
    for row in series[series["lambda"] > 0].to_dict("records"):
        for name, col in (("WRG", "wrg"), ("mean AOG", "mean_aog"), ("mean NTS", "mean_nts")):
            value, std = row[col], row[f"{col}_std"]
            ci = None if pd.isna(std) else [value - std, value + std]
            curves[row["method"]][name].append((row["lambda"], figs.Estimate(value, ci)))
    figs.lambda_curve(curves, path)
