"""Do the pairwise metrics rank models as best-of-n does? Kendall's τ with a bootstrap interval.

The question the field asks of every reward-model benchmark (RewardBench 2, PPE): does the proxy
metric predict the downstream pick? Here each trained model (a method at a seed) gives one point:
its proxy metric (ID accuracy, OOD accuracy on a target, NTS, a benchmark's official score) and
its best-of-n gain under the gold judge. τ-b (scipy.stats.kendalltau, which handles ties) is the
rank agreement; the interval resamples models with replacement, so it speaks to these models only
and its width shows how little a dozen points can say.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy import stats

MIN_MODELS = 3
"""Fewer points than this give τ ∈ {−1, 1} or nothing: no evidence either way."""


def _tau(x: np.ndarray, y: np.ndarray) -> float:
    value = stats.kendalltau(x, y).statistic
    return float("nan") if value is None else float(value)


def kendall_tau(
    proxy: Sequence[float], downstream: Sequence[float], *, draws: int, level: float, rng: np.random.Generator
) -> dict[str, Any]:
    """τ-b between two scores of the same models, a percentile bootstrap interval over models, and n.

    τ is None when there are fewer than MIN_MODELS models or either score is constant (no ranking
    to agree with); resamples whose τ is undefined (all one model, say) are left out of the interval.
    """
    x, y = np.asarray(list(proxy), dtype=float), np.asarray(list(downstream), dtype=float)
    if x.shape != y.shape:
        raise ValueError(f"proxy and downstream scores differ in length: {x.size} vs {y.size}")
    n = int(x.size)
    if n < MIN_MODELS or np.ptp(x) == 0 or np.ptp(y) == 0:
        return {"tau": None, "ci": None, "n": n}
    drawn = []
    for _ in range(draws):
        idx = rng.integers(0, n, size=n)
        value = _tau(x[idx], y[idx])
        if not np.isnan(value):
            drawn.append(value)
    tail = (1.0 - level) / 2.0 * 100.0
    ci = [float(v) for v in np.percentile(drawn, [tail, 100.0 - tail])] if drawn else None
    return {"tau": _tau(x, y), "ci": ci, "n": n}
