"""Linear probes: what a model's reward-position state already tells about a response.

Why: an anchor on hidden states can only stop a shortcut whose feature the representation
must first build (DESIGN §6). Whether a cue is readable, linearly, from the frozen strong
base at the token the reward head reads decides which kind it is: readable means a new head
learns it with no drift; at chance means fine-tuning has to build it.

A probe is a logistic regression on standardised states, fitted on student_train's responses
and scored on id_test's, so no test response is seen in fitting; the interval is the exact
(Clopper-Pearson) binomial one. Each synthetic cue is probed on minimal pairs: every response
once with the cue and once without (prefshift.data.synthetic.cue_minimal_pair), so only the
cue's own footprint can be read. Probing the responses as they are would not do: a cue sits on
the chosen response in 90% of source pairs, so a probe that reads the gold label, or the other
cue, "finds" it (the sign-off alone predicts the marker's side in 0.9² + 0.1² = 82% of
responses). `longer` (is it the longer response of its pair, ties dropped) is probed on the
responses as they are, so real datasets get it too.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from scipy import stats

from prefshift.core.errors import PrefshiftError
from prefshift.data.synthetic import CUES

if TYPE_CHECKING:
    from prefshift.data.encode import EncodedPair

PROBES = (*CUES, "longer")


class ProbeError(PrefshiftError):
    pass


def length_labels(items: Sequence[EncodedPair]) -> np.ndarray:
    """1 where a response is the longer of its pair, 0 the shorter, NaN a tie: chosen rows, then rejected."""
    chosen = np.array([it.chosen.response_tokens for it in items], dtype=float)
    rejected = np.array([it.rejected.response_tokens for it in items], dtype=float)
    longer = np.concatenate([chosen > rejected, rejected > chosen]).astype(float)
    longer[np.concatenate([chosen == rejected, chosen == rejected])] = np.nan
    return longer


def fit_probe(
    train_x: np.ndarray, train_y: np.ndarray, test_x: np.ndarray, test_y: np.ndarray, level: float
) -> dict[str, Any] | None:
    """Held-out accuracy of a logistic probe, its exact interval and the chance rate; None = no labels."""
    fit_rows, test_rows = ~np.isnan(train_y), ~np.isnan(test_y)
    if not fit_rows.any() or not test_rows.any():
        return None
    y_fit, y_test = train_y[fit_rows].astype(int), test_y[test_rows].astype(int)
    if len(set(y_fit)) < 2:
        raise ProbeError(f"probe labels of the fitting split are all {y_fit[0]}: nothing to separate")
    from sklearn.linear_model import LogisticRegression  # the report needs PROBES, not scikit-learn
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    probe = make_pipeline(StandardScaler(), LogisticRegression(C=1.0, max_iter=5000))
    probe.fit(train_x[fit_rows], y_fit)
    correct = int((probe.predict(test_x[test_rows]) == y_test).sum())
    n = int(test_rows.sum())
    interval = stats.binomtest(correct, n).proportion_ci(confidence_level=level, method="exact")
    chance = float(max(y_test.mean(), 1 - y_test.mean()))
    return {
        "acc": 100.0 * correct / n,
        "ci": [100.0 * interval.low, 100.0 * interval.high],
        "chance": 100.0 * chance,
        "n_fit": int(fit_rows.sum()),
        "n": n,
        "readable": bool(interval.low > chance),
    }
