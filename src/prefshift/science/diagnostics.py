"""Diagnostics beyond the paper's offline accuracy: calibration, best-of-n, length and cue shortcuts.

Accuracy alone hides two things a reward model is used for: whether its
probabilities mean what they say (RLHF and rejection sampling read magnitudes,
not just signs) and whether it picks the best of several responses. Weak
teachers on real data also tend to learn response length, and their students
copy it; the length diagnostics make that shortcut visible per model and split.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy import stats

from prefshift.science.metrics import MetricsError, accuracy


def expected_calibration_error(delta: Sequence[float], gold: Sequence[float], bins: int) -> float:
    """ECE in pp of p = σ(Δ), folded to the predicted winner.

    The binned probability is the confidence c = max(p, 1 − p) in whichever response
    the model prefers, over `bins` equal-width bins of [0.5, 1] (c never falls below
    0.5, so bins over [0, 1] would leave half of them empty). The outcome is the gold
    probability that the preferred response is the better one: `gold` when Δ > 0,
    1 − `gold` when Δ < 0 (graded labels give soft outcomes), and 0.5 for a tie,
    where c = 0.5 too. ECE = Σ_b (n_b / N) · |mean c_b − mean outcome_b|.
    """
    delta = np.asarray(delta, dtype=float)
    gold = np.asarray(gold, dtype=float)
    if delta.size == 0:
        raise MetricsError("ECE of an empty split is undefined")
    if delta.shape != gold.shape:
        raise MetricsError("ECE needs one gold value per margin")
    p = 1.0 / (1.0 + np.exp(-delta))
    confidence = np.maximum(p, 1.0 - p)
    outcome = np.where(delta > 0, gold, np.where(delta < 0, 1.0 - gold, 0.5))
    which = np.minimum(((confidence - 0.5) * 2.0 * bins).astype(int), bins - 1)
    total = 0.0
    for b in range(bins):
        mask = which == b
        if mask.any():
            total += mask.sum() * abs(confidence[mask].mean() - outcome[mask].mean())
    return float(total / delta.size * 100.0)


def best_of_n(rewards: Sequence[Sequence[float]], gold_scores: Sequence[Sequence[float]]) -> dict[str, Any]:
    """Selection accuracy (pp): how often the reward model's top response is a gold-best one.

    A group scores |R ∩ G| / |R|, with R the responses tied for the highest reward
    and G those tied for the highest gold score: the chance that a uniform pick among
    the model's favourites is a best one. `random` is the same for a uniform pick
    among all responses (|G| / n), the floor any useful reward model must beat.
    """
    if len(rewards) != len(gold_scores):
        raise MetricsError("best-of-n needs one gold rating list per reward list")
    if not rewards:
        raise MetricsError("best-of-n over zero groups is undefined")
    hits, chance = [], []
    for i, (r, g) in enumerate(zip(rewards, gold_scores, strict=True)):
        r, g = np.asarray(r, dtype=float), np.asarray(g, dtype=float)
        if r.shape != g.shape or r.size < 2:
            raise MetricsError(f"group {i}: {r.size} rewards for {g.size} rated responses (need equal, ≥ 2)")
        top_r, top_g = r == r.max(), g == g.max()
        hits.append((top_r & top_g).sum() / top_r.sum())
        chance.append(top_g.sum() / g.size)
    return {
        "acc": float(np.mean(hits) * 100.0),
        "random": float(np.mean(chance) * 100.0),
        "n_groups": len(hits),
    }


def _subset_accuracy(delta: np.ndarray, mask: np.ndarray) -> dict[str, Any]:
    n = int(mask.sum())
    return {"acc": accuracy(delta[mask]) if n else None, "n": n}


def pearson(x: np.ndarray, y: np.ndarray) -> float | None:
    """Pearson r, or None when either side is constant (the correlation is undefined)."""
    if x.size < 2 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", stats.ConstantInputWarning)
        r = stats.pearsonr(x, y).statistic
    return None if not np.isfinite(r) else float(r)


def length_shortcut(
    delta: Sequence[float], len_chosen: Sequence[float], len_rejected: Sequence[float]
) -> dict[str, Any]:
    """Correlation of Δ with the length difference (chosen − rejected, tokens), and accuracy by length.

    A model that mostly tracks length shows |r| near 1 and a large gap between
    `chosen_longer` and `chosen_shorter` accuracy; the gold-trained ceiling shows
    how much of that correlation the data itself carries.
    """
    delta = np.asarray(delta, dtype=float)
    diff = np.asarray(len_chosen, dtype=float) - np.asarray(len_rejected, dtype=float)
    if delta.shape != diff.shape:
        raise MetricsError("length diagnostics need one length pair per margin")
    return {
        "pearson_r": pearson(delta, diff),
        "n": int(delta.size),
        "chosen_longer": _subset_accuracy(delta, diff > 0),
        "chosen_shorter": _subset_accuracy(delta, diff < 0),
        "equal_length": _subset_accuracy(delta, diff == 0),
        "share_chosen_longer": float((diff > 0).mean() * 100.0) if delta.size else None,
    }


def cue_reliance(delta: Sequence[float], sides: Sequence[str | None]) -> dict[str, Any]:
    """Accuracy when a shortcut cue sits on the chosen response and when on the rejected one.

    The cue is placed independently of the content, so a model that ignores it scores the same
    on both subsets; `gap` (on chosen − on rejected, pp) is how far the model follows the cue.
    """
    delta = np.asarray(delta, dtype=float)
    where = np.asarray([s if s is not None else "" for s in sides])
    if delta.shape != where.shape:
        raise MetricsError("cue diagnostics need one cue side per margin")
    on_chosen, on_rejected = (
        _subset_accuracy(delta, where == "chosen"),
        _subset_accuracy(delta, where == "rejected"),
    )
    both = on_chosen["acc"] is not None and on_rejected["acc"] is not None
    return {
        "on_chosen": on_chosen,
        "on_rejected": on_rejected,
        "gap": on_chosen["acc"] - on_rejected["acc"] if both else None,
    }
