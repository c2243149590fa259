"""What a sweep point's overrides mean for a report: an ablation, or a seed replicate.

The report reads filed sweep records and the sweep files them, so this reading lives apart
from both: neither has to import the other to agree on it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

SELECTION_KEYS = frozenset({"methods"})
"""Keys that choose which students run and change none of them (per-method stages never read one
another), so `-S seed=1,2 -S methods=[naive,anchor_last]` is a cheap seed replicate of two methods."""


def ablation_keys(sweep: Mapping[str, Any]) -> set[str]:
    """The keys a sweep point varies that change a student's result: all but seed and selection keys."""
    return set(sweep) - {"seed"} - SELECTION_KEYS


def replicate_seed(sweep: Mapping[str, Any]) -> int | None:
    """The seed of a point that differs from the main run in seed alone (selection aside); else None."""
    return sweep["seed"] if "seed" in sweep and not ablation_keys(sweep) else None
