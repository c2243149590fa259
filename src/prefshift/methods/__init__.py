"""Training objectives: one module per loss, one interface (`Objective.loss`) for the training loop.

`build_objective` maps a method name to its objective; `label_source` says which
targets the method trains on (gold, the teacher's q, or SEAM's labels).
"""

from __future__ import annotations

from prefshift.config import METHODS, Params, check_method
from prefshift.methods.anchor import AnchorObjective, anchor_layers
from prefshift.methods.base import BatchOut, Objective
from prefshift.methods.confidence import ConfidenceObjective

LABEL_SOURCES = {
    "teacher": "gold",
    "ceiling": "gold",
    "naive": "weak",
    "confidence": "weak",
    "anchor_last": "weak",
    "anchor_mid": "weak",
    "seam": "seam",
}
assert set(METHODS) <= set(LABEL_SOURCES)


def label_source(method: str) -> str:
    """gold | weak | seam."""
    if method != "teacher":
        check_method(method)
    return LABEL_SOURCES[method]


def build_objective(method: str, params: Params, num_layers: int) -> Objective:
    """The objective for `method`; anchor settings are validated here, before any training."""
    if method != "teacher":
        check_method(method)
    if method == "confidence":
        return ConfidenceObjective(
            method, alpha=params.confidence.alpha, warmup_frac=params.confidence.warmup_frac
        )
    if method in ("anchor_last", "anchor_mid"):
        layers = anchor_layers(method.removeprefix("anchor_"), num_layers, params.anchor.mid_fractions)
        return AnchorObjective(method, layers=layers, lam=params.anchor.lam)
    return Objective(method)


__all__ = ["BatchOut", "Objective", "build_objective", "label_source"]
