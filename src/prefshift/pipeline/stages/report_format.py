"""Cell and table formatting shared by the report's sections (pp, intervals, mean ± std, markdown)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from prefshift.config.params import method_order

DASH = "—"


def num(value: float | None, digits: int = 1) -> str:
    return DASH if value is None else f"{value:.{digits}f}"


def ci_cell(value: float | None, ci: Sequence[float] | None) -> str:
    if value is None:
        return DASH
    return f"{value:.1f} [{ci[0]:.1f}, {ci[1]:.1f}]" if ci else f"{value:.1f}"


def sd_cell(stat: Mapping[str, Any], digits: int = 1) -> str:
    if stat["mean"] is None:
        return DASH
    mean = f"{stat['mean']:.{digits}f}"
    return mean if stat["std"] is None else f"{mean} ± {stat['std']:.{digits}f}"


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def ordered(metrics: Mapping[str, Any]) -> list[str]:
    return method_order(metrics)


def models_of(metrics: Mapping[str, Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    """Teacher first, then every method: each with ece, length_shortcut and best_of_n blocks."""
    return {"teacher": next(iter(metrics.values()))["teacher"], **{m: metrics[m] for m in ordered(metrics)}}


def is_synthetic(setting: Mapping[str, Any]) -> bool:
    return any(str(d).startswith("syn_") for d in [setting["source"], *setting["targets"]])
