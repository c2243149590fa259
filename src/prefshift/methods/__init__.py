"""Training objectives: one module per loss, one interface (`Objective.loss`) for the training loop.

`build_objective` maps a method name to its objective; `label_source` says which
targets the method trains on (gold, the teacher's q, or SEAM's labels).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prefshift.config.params import METHODS, Params, check_method
from prefshift.methods.layers import anchor_layers

if TYPE_CHECKING:
    from prefshift.methods.base import Objective

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

TRAIN_SECTIONS = {"confidence": ("confidence",), "anchor_last": ("anchor",), "anchor_mid": ("anchor",)}
"""params sections a method's training reads beyond the shared ones (seed, encode, student)."""
TARGET_SECTIONS = {"seam": ("label", "seam")}
"""params sections that shape a method's targets beyond the teacher's labels (SEAM writes its own)."""
ANCHOR_KINDS = {"anchor_last": "last", "anchor_mid": "mid"}


def _sections(params: Params, names: tuple[str, ...]) -> dict:
    resolved = params.resolved()
    return {name: resolved[name] for name in names}


def train_settings(method: str, params: Params) -> dict:
    """Everything `method`'s training reads that other methods do not: the plan stage writes it
    per method, so changing anchor.lambda changes only the anchor methods' files (and stages)."""
    return {"method": method, **_sections(params, TRAIN_SECTIONS.get(method, ()))}


def target_settings(method: str, params: Params) -> dict:
    """Where `method`'s training targets come from, and the params that shape them."""
    sections = _sections(params, TARGET_SECTIONS.get(method, ()))
    return {"method": method, "labels": label_source(method), **sections}


def reference_request(params: Params) -> dict:
    """What the reference stage stores: the anchor kinds listed (their layers' union) and its limits."""
    kinds = sorted(ANCHOR_KINDS[m] for m in params.methods if m in ANCHOR_KINDS)
    return {
        "kinds": kinds,
        "mid_fractions": params.anchor.mid_fractions if "mid" in kinds else None,
        "max_gb": params.anchor.reference_max_gb,
        "batch_size": params.anchor.reference_batch_size,
    }


def reference_layers(request: dict, num_layers: int) -> tuple[int, ...]:
    """The union of hidden_states indices the listed anchor methods use."""
    fractions = request["mid_fractions"] or [1.0]
    return tuple(sorted({k for kind in request["kinds"] for k in anchor_layers(kind, num_layers, fractions)}))


def label_source(method: str) -> str:
    """gold | weak | seam."""
    if method != "teacher":
        check_method(method)
    return LABEL_SOURCES[method]


def build_objective(method: str, params: Params, num_layers: int) -> Objective:
    """The objective for `method`; anchor settings are validated here, before any training.

    The objectives are imported here, not at module level, because they need torch and the
    light stages (plan, targets) read only this module's tables."""
    from prefshift.methods.anchor import AnchorObjective
    from prefshift.methods.base import Objective
    from prefshift.methods.confidence import ConfidenceObjective

    if method != "teacher":
        check_method(method)
    if method == "confidence":
        return ConfidenceObjective(
            method, alpha=params.confidence.alpha, warmup_frac=params.confidence.warmup_frac
        )
    if method in ("anchor_last", "anchor_mid"):
        layers = anchor_layers(method.removeprefix("anchor_"), num_layers, params.anchor.mid_fractions)
        anchor = params.anchor
        return AnchorObjective(method, layers=layers, lam=anchor.lam, normalize=anchor.normalize)
    return Objective(method)


__all__ = [
    "build_objective",
    "label_source",
    "reference_layers",
    "reference_request",
    "target_settings",
    "train_settings",
]
