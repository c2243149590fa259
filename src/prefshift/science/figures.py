"""The report's PNG figures; each takes plain numbers so the report decides what to plot.

Matplotlib runs on the Agg backend (no display on CI or servers). Figures carry no
timestamp metadata, so an unchanged input gives an unchanged file.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from prefshift.core.atomic import atomic_path

_METADATA = {"Software": None}


@dataclass(frozen=True)
class Estimate:
    """A point estimate with its interval (pp); `ci` None when there is none (e.g. a single seed's std)."""

    value: float
    ci: Sequence[float] | None = None

    def errors(self) -> list[float]:
        """Error-bar lengths below and above the point. A percentile bootstrap interval need not
        contain its point estimate (few pairs, few resamples, a ratio like PGR): the bar on that
        side is then empty rather than negative, which matplotlib refuses."""
        if self.ci is None:
            return [0.0, 0.0]
        return [max(0.0, self.value - self.ci[0]), max(0.0, self.ci[1] - self.value)]


def _save(fig: Any, path: Path) -> None:
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=120, metadata=_METADATA)
    plt.close(fig)


def _finish(fig: Any, ax: Any, path: Path, xlabel: str, ylabel: str, title: str) -> None:
    """Labels, a light grid and a legend on a one-panel figure, then save it."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    _save(fig, path)


def id_vs_ood(points: Mapping[str, tuple[Estimate, Estimate]], path: Path) -> None:
    """One marker per model: ID accuracy against mean OOD accuracy, both with intervals."""
    fig, ax = plt.subplots(figsize=(6, 5))
    for name, (id_acc, ood_acc) in points.items():
        ax.errorbar(
            id_acc.value,
            ood_acc.value,
            xerr=[[e] for e in id_acc.errors()],
            yerr=[[e] for e in ood_acc.errors()],
            fmt="o",
            capsize=3,
            label=name,
        )
    _finish(
        fig,
        ax,
        path,
        "ID accuracy (%)",
        "mean OOD accuracy (%)",
        "In-distribution vs out-of-distribution accuracy",
    )


def gains(per_metric: Mapping[str, Mapping[str, Mapping[str, Estimate]]], path: Path) -> None:
    """Grouped bars: one panel per gain (AOG, NTS), targets on the x axis, one bar per method."""
    fig, axes = plt.subplots(1, len(per_metric), figsize=(6 * len(per_metric), 4.5), squeeze=False)
    for ax, (metric, by_method) in zip(axes[0], per_metric.items(), strict=True):
        methods = list(by_method)
        targets = list(next(iter(by_method.values()))) if methods else []
        width = 0.8 / max(1, len(methods))
        for i, method in enumerate(methods):
            xs = [t + (i - (len(methods) - 1) / 2) * width for t in range(len(targets))]
            ests = [by_method[method][t] for t in targets]
            ax.bar(
                xs,
                [e.value for e in ests],
                width,
                label=method,
                yerr=[[e.errors()[0] for e in ests], [e.errors()[1] for e in ests]],
                capsize=2,
            )
        ax.axhline(0.0, color="black", linewidth=0.8)
        ax.set_xticks(range(len(targets)))
        ax.set_xticklabels(targets, rotation=15)
        ax.set_ylabel(f"{metric} (pp)")
        ax.set_title(f"{metric} per target")
        ax.legend(fontsize=8)
    _save(fig, path)


def lambda_curve(curves: Mapping[str, Mapping[str, Sequence[tuple[float, Estimate]]]], path: Path) -> None:
    """WRG, mean AOG and mean NTS against λ (log axis), one panel per gain, one line per method."""
    names = ["WRG", "mean AOG", "mean NTS"]
    fig, axes = plt.subplots(1, len(names), figsize=(15, 4.5), squeeze=False)
    for ax, name in zip(axes[0], names, strict=True):
        for method, series in curves.items():
            points = sorted(series.get(name, []))
            if not points:
                continue
            ax.errorbar(
                [p[0] for p in points],
                [p[1].value for p in points],
                yerr=[[p[1].errors()[0] for p in points], [p[1].errors()[1] for p in points]],
                marker="o",
                capsize=3,
                label=method,
            )
        ax.set_xscale("log")
        ax.axhline(0.0, color="black", linewidth=0.8)
        ax.set_xlabel("anchor λ")
        ax.set_ylabel(f"{name} (pp)")
        ax.set_title(f"{name} vs λ")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    _save(fig, path)


def training_curves(logs: Mapping[str, Sequence[Mapping[str, float]]], path: Path) -> None:
    """Loss and running accuracy against step, one line per trained model."""
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for name, steps in logs.items():
        xs = [s["step"] for s in steps]
        axes[0].plot(xs, [s["loss"] for s in steps], label=name)
        axes[1].plot(xs, [s["acc"] for s in steps], label=name)
    for ax, label in zip(axes, ("loss", "training accuracy"), strict=True):
        ax.set_xlabel("step")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    _save(fig, path)


def drift(per_method: Mapping[str, Sequence[Mapping[str, float]]], path: Path) -> None:
    """Per-layer cosine similarity to the frozen reference against step, one panel per method."""
    methods = [m for m, rows in per_method.items() if rows]
    cols = min(3, max(1, len(methods)))
    rows = max(1, -(-len(methods) // cols))
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.8 * rows), squeeze=False, sharey=True)
    for ax, method in zip(axes.flat, methods, strict=False):
        series = per_method[method]
        layers = sorted({k for row in series for k in row if k != "step"}, key=layer_order)
        for layer in layers:
            pts = [(row["step"], row[layer]) for row in series if layer in row]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], label=layer)
        ax.set_title(method)
        ax.set_xlabel("step")
        ax.set_ylabel("cosine to reference")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(methods) :]:
        ax.set_visible(False)
    _save(fig, path)


def layer_order(name: str) -> tuple[int, str]:
    """Sort `layer_10` after `layer_2`."""
    suffix = name.rsplit("_", 1)[-1]
    return (int(suffix), name) if suffix.isdigit() else (10**9, name)


def best_of_n_curves(
    per_split: Mapping[str, Mapping[str, Mapping[str, Sequence[float]]]], path: Path, ylabel: str
) -> None:
    """Gold score of the best-of-n pick vs KL = log n − (n−1)/n, one panel per split, a line per proxy.

    Each curve holds `n`, `kl`, `gold` and `gold_se` (standard error over prompts, drawn as a band).
    """
    fig, axes = plt.subplots(1, len(per_split), figsize=(4.5 * len(per_split), 4), squeeze=False, sharey=True)
    for ax, (split, curves) in zip(axes[0], per_split.items(), strict=True):
        for name, c in curves.items():
            gold, se = [float(v) for v in c["gold"]], [float(v) for v in c["gold_se"]]
            ax.plot(c["kl"], gold, marker="o", label=name)
            low = [g - s for g, s in zip(gold, se, strict=True)]
            high = [g + s for g, s in zip(gold, se, strict=True)]
            ax.fill_between(c["kl"], low, high, alpha=0.12)
        first = next(iter(curves.values()))
        ax.set_xticks(first["kl"], [f"{k:.2f}\nn={n}" for k, n in zip(first["kl"], first["n"], strict=True)])
        ax.set_title(split)
        ax.set_xlabel("KL(best-of-n ‖ policy), nats")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel(ylabel)
    axes[0][-1].legend(fontsize=8)
    _save(fig, path)


def mechanism(points: Mapping[str, Sequence[tuple[float, Estimate]]], path: Path) -> None:
    """One marker shape per model, one marker per seed: how far its representation moved from the
    start (1 − cosine at the reward position) against its mean OOD accuracy, with the OOD interval."""
    fig, ax = plt.subplots(figsize=(6.5, 5))
    markers = "osD^vP*Xh<>"  # with matplotlib's ten colours, eleven or more methods stay distinguishable
    for i, (name, seeds) in enumerate(points.items()):
        colour, marker = f"C{i % 10}", markers[i % len(markers)]
        for j, (cosine, ood) in enumerate(seeds):
            x = 1.0 - cosine
            label = name if j == 0 else None
            ax.errorbar(
                x,
                ood.value,
                yerr=[[e] for e in ood.errors()],
                fmt=marker,
                color=colour,
                capsize=3,
                label=label,
            )
        x_mean = sum(1.0 - c for c, _ in seeds) / len(seeds)
        y_mean = sum(o.value for _, o in seeds) / len(seeds)
        ax.annotate(name, (x_mean, y_mean), textcoords="offset points", xytext=(5, 4), fontsize=7)
    _finish(
        fig,
        ax,
        path,
        "drift from the start: 1 − cosine at the reward position (id_test)",
        "mean OOD accuracy (%)",
        "Does staying close buy robustness?",
    )


def alpha_curve(
    alphas: Sequence[float], curves: Mapping[str, Sequence[float]], chosen: float, path: Path
) -> None:
    """WiSE-FT: accuracy of each split against the interpolation weight α, the chosen α marked."""
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for split, values in curves.items():
        ax.plot(alphas, values, marker="o", label=split)
    ax.axvline(chosen, color="grey", linestyle="--", label=f"chosen α = {chosen:g} (ID validation)")
    _finish(fig, ax, path, "α (0 = start, 1 = fine-tuned)", "accuracy (%)", "WiSE-FT: accuracy against α")
