"""Training methods: the registry (`registry.py`), prefshift's own methods (`builtin/`, one module
each) and the losses they use (`base.py`, `confidence.py`, `anchor.py`).

May import config, core, data and models; never tracking, the pipeline or MLflow. The
functions below are what the stages ask of a method, answered from its registry entry.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prefshift.config.params import Params
from prefshift.methods import registry
from prefshift.methods.layers import anchor_layers

if TYPE_CHECKING:
    from prefshift.methods.base import Objective


def _sections(params: Params, names: tuple[str, ...]) -> dict:
    resolved = params.resolved()
    return {name: resolved[name] for name in names}


def train_settings(method: str, params: Params) -> dict:
    """Everything `method`'s training reads that other methods do not: the plan stage writes it
    per method, so changing anchor.lambda changes only the anchor methods' files (and stages).
    A third-party method's file also names its package and version, so upgrading it re-trains."""
    spec = registry.get(method)
    settings = registry.settings_of(spec, params)
    extra: dict = {} if settings is None else {method: settings.model_dump(mode="json", by_alias=True)}
    plugin = registry.distribution(method)
    if plugin is not None:
        extra["plugin"] = plugin
    return {"method": method, **_sections(params, spec.sections), **extra}


def target_settings(method: str, params: Params) -> dict:
    """Where `method`'s training targets come from, and the params that shape them."""
    spec = registry.get(method)
    return {"method": method, "labels": spec.labels, **_sections(params, spec.target_sections)}


def anchor_kind(method: str) -> str | None:
    """`last` or `mid` for a method that reads the stored reference states, else None."""
    return registry.get(method).anchor_kind


def reference_request(params: Params) -> dict:
    """What the reference stage stores: the anchor kinds listed (their layers' union) and its limits."""
    kinds = sorted(kind for m in params.methods if (kind := anchor_kind(m)) is not None)
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
    return registry.get(method).labels


def build_objective(method: str, params: Params, num_layers: int) -> Objective:
    """The objective for `method`; its settings are validated here, before any training."""
    return registry.objective_of(registry.get(method), registry.build(method, params, num_layers))


__all__ = [
    "anchor_kind",
    "build_objective",
    "label_source",
    "reference_layers",
    "reference_request",
    "target_settings",
    "train_settings",
]
