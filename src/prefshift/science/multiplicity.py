"""Family-wise error control for the report's verdicts: Holm's step-down procedure.

Many verdicts (every method against naive and anchor_last on every target) at α each would,
taken together, call something by chance alone. Holm (1979) controls the probability of any
false call in the family at α, under any dependence between the tests, and is uniformly more
powerful than Bonferroni. scipy ships Benjamini-Hochberg and -Yekutieli
(`scipy.stats.false_discovery_control`), which control the false discovery rate instead, a
weaker promise than the report's "better" means; so Holm is written here.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm-adjusted p-values, in the input order: sort p ascending, multiply the i-th smallest
    (i from 0) by m − i, carry the running maximum forward, cap at 1. A hypothesis is rejected
    at family-wise level α exactly when its adjusted p is ≤ α."""
    p = np.asarray(list(p_values), dtype=float)
    if p.size == 0:
        return []
    if np.any((p < 0) | (p > 1) | np.isnan(p)):
        raise ValueError(f"p-values must lie in [0, 1], got {p.tolist()}")
    order = np.argsort(p, kind="stable")
    m = p.size
    scaled = np.minimum(1.0, (m - np.arange(m)) * p[order])
    adjusted = np.empty(m)
    adjusted[order] = np.maximum.accumulate(scaled)
    return [float(x) for x in adjusted]
