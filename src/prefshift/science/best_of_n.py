"""Best-of-n selection against a gold judge (Gao, Schulman & Hilton 2023), as pure numpy.

A proxy reward model picks the highest-scoring of n policy samples; a gold judge scores
the pick. With N ≥ n samples per prompt we do not take "the first n": we average over
every n-subset of the N, which is unbiased for a fresh draw of n samples and has far
less variance, and is exact in closed form.

The estimator. Rank a prompt's N samples by proxy score, best first (rank 1..N). The
proxy's pick from a uniformly random n-subset S is the member of S with the smallest
rank, so the pick is the rank-i sample exactly when i ∈ S and the other n − 1 members
come from the N − i samples ranked below it:

    P(pick = i) = C(N − i, n − 1) / C(N, n),        Σ_i P(pick = i) = 1,

and E[gold of the pick] = Σ_i P(pick = i) · gold_i. n = 1 gives the mean gold score;
n = N gives the gold score of the proxy's overall favourite. Samples tied on the proxy
are broken uniformly at random, which by symmetry equals giving every member of a tied
block the block's mean gold score before weighting. The same weights applied to the
proxy's own scores give the proxy's view of its pick; gold rising less than the proxy
as n grows is over-optimisation. The x-axis of Gao et al. is the analytic KL between the
best-of-n policy and the policy itself: log n − (n − 1)/n.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from prefshift.science.metrics import MetricsError


def n_grid(n_max: int) -> list[int]:
    """1, 2, 4, … up to n_max (n_max itself is always the last point)."""
    if n_max < 1:
        raise MetricsError(f"best-of-n needs n_max ≥ 1, got {n_max}")
    grid, n = [], 1
    while n < n_max:
        grid.append(n)
        n *= 2
    return [*grid, n_max]


def kl_best_of_n(n: int) -> float:
    """KL(best-of-n policy ‖ policy) in nats, the analytic form used by Gao et al. 2023."""
    return math.log(n) - (n - 1) / n


def pick_weights(n_total: int, n: int) -> np.ndarray:
    """P(the rank-i sample is the proxy's pick from a random n-subset), i = 1..n_total."""
    if not 1 <= n <= n_total:
        raise MetricsError(f"best-of-{n} from {n_total} samples is undefined")
    total = math.comb(n_total, n)
    return np.array([math.comb(n_total - i, n - 1) / total for i in range(1, n_total + 1)])


def _tie_averaged(proxy: np.ndarray, values: np.ndarray) -> np.ndarray:
    """`values` in proxy order (best first), each proxy-tied block replaced by its mean."""
    order = np.argsort(-proxy, kind="stable")
    ranked_proxy, ranked = proxy[order], values[order].astype(float)
    _, start, counts = np.unique(-ranked_proxy, return_index=True, return_counts=True)
    for first, size in zip(start, counts, strict=True):
        if size > 1:
            ranked[first : first + size] = ranked[first : first + size].mean()
    return ranked


def expected_pick(proxy: Sequence[float], values: Sequence[float], n: int) -> float:
    """E[values of the proxy's argmax] over uniformly random n-subsets of one prompt's samples."""
    proxy, values = np.asarray(proxy, dtype=float), np.asarray(values, dtype=float)
    if proxy.shape != values.shape or proxy.ndim != 1:
        raise MetricsError(f"proxy scores {proxy.shape} and values {values.shape} must be equal 1-D arrays")
    return float(pick_weights(proxy.size, n) @ _tie_averaged(proxy, values))


def standardise(scores: np.ndarray) -> np.ndarray:
    """z-scores over all samples of a split, so gains read in the scorer's own standard deviations."""
    scores = np.asarray(scores, dtype=float)
    spread = scores.std()
    return (scores - scores.mean()) / (spread if spread > 0 else 1.0)


def curve(proxy: np.ndarray, gold: np.ndarray, grid: Sequence[int]) -> dict[str, Any]:
    """Mean over prompts (rows) of the pick's gold and proxy scores at each n, with the gold's standard error.

    `proxy` and `gold` are (prompts × samples) matrices of one split.
    """
    proxy, gold = np.asarray(proxy, dtype=float), np.asarray(gold, dtype=float)
    if proxy.shape != gold.shape or proxy.ndim != 2 or proxy.shape[0] == 0:
        raise MetricsError(f"best-of-n needs equal non-empty (prompts × samples) matrices, got {proxy.shape}")
    gold_at, proxy_at, se = [], [], []
    for n in grid:
        weights = pick_weights(proxy.shape[1], n)
        picks = np.array([weights @ _tie_averaged(p, g) for p, g in zip(proxy, gold, strict=True)])
        own = np.array([weights @ np.sort(p)[::-1] for p in proxy])
        gold_at.append(float(picks.mean()))
        proxy_at.append(float(own.mean()))
        se.append(float(picks.std(ddof=1) / math.sqrt(picks.size)) if picks.size > 1 else 0.0)
    return {
        "n": list(grid),
        "kl": [kl_best_of_n(n) for n in grid],
        "gold": gold_at,
        "gold_se": se,
        "proxy": proxy_at,
        "prompts": int(proxy.shape[0]),
    }


def gains(result: dict[str, Any]) -> dict[str, float]:
    """Gold and proxy gain from n = 1 to the largest n, and their gap (proxy − gold: over-optimisation)."""
    gold_gain = result["gold"][-1] - result["gold"][0]
    proxy_gain = result["proxy"][-1] - result["proxy"][0]
    return {"gold_gain": gold_gain, "proxy_gain": proxy_gain, "gap": proxy_gain - gold_gain}
