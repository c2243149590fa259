"""The paper's offline metrics (DESIGN §7), in percentage points, with paired bootstrap intervals.

Everything here is pure numpy on reward margins Δ = r(chosen) − r(rejected), so the
numbers can be checked by hand and recomputed without any model. Gains compare a
student with the teacher on the *same* pairs, so the bootstrap resamples pair
indices once per split and applies them to every model (a paired bootstrap):
the interval then reflects uncertainty of the difference, not of two unrelated means.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from prefshift.core.errors import PrefshiftError

ID_SPLIT = "id_test"
# Bounds the (draws x pairs) index matrix held at once, so large test sets stay in memory.
_CELLS_PER_CHUNK = 1_000_000


class MetricsError(PrefshiftError, ValueError):
    """Score data that cannot be compared (misaligned pairs, non-finite margins, empty splits)."""


def check_finite(tree: Any, where: str, prefix: str = "") -> None:
    """Refuse a metrics document holding NaN or infinity anywhere (dotted key in the message).

    Checked where metrics are written and where they are read: JSON readers accept NaN, and a
    NaN gain compares false with everything, so it would pass a gate or sort silently.
    """
    if isinstance(tree, Mapping):
        for key, value in tree.items():
            check_finite(value, where, f"{prefix}{key}.")
    elif isinstance(tree, (list, tuple)):
        for i, value in enumerate(tree):
            check_finite(value, where, f"{prefix}{i}.")
    elif isinstance(tree, float) and not np.isfinite(tree):
        raise MetricsError(f"{where}: {prefix[:-1] or 'value'} is {tree}, not a finite number")


def credit(delta: Sequence[float] | np.ndarray) -> np.ndarray:
    """Per-pair credit: 1 when the chosen response wins, 0.5 for a tie (Δ = 0), 0 otherwise."""
    delta = np.asarray(delta, dtype=float)
    return np.where(delta > 0, 1.0, np.where(delta == 0, 0.5, 0.0))


def accuracy(delta: Sequence[float] | np.ndarray) -> float:
    """Pairwise accuracy in pp; ties count half, as a coin flip would."""
    values = credit(delta)
    if values.size == 0:
        raise MetricsError("accuracy of an empty split is undefined")
    return accuracy_of_credit(values)


def accuracy_of_credit(values: np.ndarray) -> float:
    return float(np.asarray(values, dtype=float).mean() * 100.0)


def wrg(acc_student_id: float, acc_teacher_id: float) -> float:
    """Weak-to-strong gain in distribution."""
    return acc_student_id - acc_teacher_id


def aog(acc_student_target: float, acc_teacher_target: float) -> float:
    """Out-of-distribution gain on one target."""
    return acc_student_target - acc_teacher_target


def nts(aog_target: float, acc_student_id: float, acc_teacher_id: float) -> float:
    """AOG minus the student's in-distribution regression; an ID improvement earns no bonus."""
    return aog_target - max(0.0, acc_teacher_id - acc_student_id)


def pgr(acc_student: float, acc_teacher: float, acc_ceiling: float) -> float | None:
    """Performance gap recovered; None when the ceiling does not beat the teacher (no gap to recover)."""
    gap = acc_ceiling - acc_teacher
    if gap <= 0:
        return None
    return (acc_student - acc_teacher) / gap


def mean(values: Sequence[float]) -> float:
    if not values:
        raise MetricsError("mean over zero targets is undefined (params.data.targets is empty)")
    return float(np.mean(values))


@dataclass(frozen=True)
class SplitCredits:
    """Aligned per-pair credits of the models compared on one split."""

    student: np.ndarray
    teacher: np.ndarray
    ceiling: np.ndarray | None = None

    def __post_init__(self) -> None:
        n = self.student.shape[0]
        if n == 0:
            raise MetricsError("a split with zero pairs cannot be evaluated")
        others = [self.teacher] + ([self.ceiling] if self.ceiling is not None else [])
        if any(other.shape != (n,) for other in others):
            raise MetricsError("student, teacher and ceiling credits must cover the same pairs")


def split_seed(seed: int, split: str) -> np.random.Generator:
    """One generator per split, keyed by name, so adding a target never shifts another's draws."""
    return np.random.default_rng([seed, zlib.crc32(split.encode("utf-8"))])


def bootstrap_accuracies(
    credits: Sequence[np.ndarray], draws: int, rng: np.random.Generator
) -> list[np.ndarray]:
    """Accuracy (pp) of each model on `draws` resamples of pairs; the same indices for every model."""
    n = credits[0].shape[0]
    stacked = np.stack([np.asarray(c, dtype=float) for c in credits])
    out = np.empty((len(credits), draws))
    chunk = max(1, _CELLS_PER_CHUNK // n)
    for start in range(0, draws, chunk):
        stop = min(draws, start + chunk)
        idx = rng.integers(0, n, size=(stop - start, n))
        out[:, start:stop] = stacked[:, idx].mean(axis=2) * 100.0
    return list(out)


def interval(samples: np.ndarray, level: float) -> list[float]:
    """Percentile interval at `level` (e.g. 0.95 → 2.5th and 97.5th percentiles)."""
    tail = (1.0 - level) / 2.0 * 100.0
    low, high = np.percentile(samples, [tail, 100.0 - tail])
    return [float(low), float(high)]


def _acc_block(point: float, samples: np.ndarray, n: int, level: float) -> dict[str, Any]:
    return {"acc": point, "ci": interval(samples, level), "n": n}


def paired_metrics(
    splits: Mapping[str, SplitCredits],
    targets: Sequence[str],
    *,
    draws: int,
    level: float,
    seed: int,
) -> dict[str, Any]:
    """Accuracies, WRG, AOG, NTS and PGR with paired bootstrap intervals.

    `splits` holds ID_SPLIT and every name in `targets`. Each draw resamples every
    split independently (pairs of different splits are unrelated), and gains that
    combine splits (NTS, the means over targets) are computed within each draw, so
    their intervals carry both splits' uncertainty. PGR is a ratio, not pp, and gets
    no interval: it is undefined whenever a resample's ceiling ties the teacher.
    OOD PGR uses the accuracies averaged over targets (each target weighs the same).
    """
    if ID_SPLIT not in splits:
        raise MetricsError(f"no scores for the in-distribution split {ID_SPLIT!r}")
    if not targets:
        raise MetricsError("params.data.targets is empty: no OOD split to evaluate")
    missing = [t for t in targets if t not in splits]
    if missing:
        raise MetricsError(f"no scores for target split(s) {missing}")
    has_ceiling = all(splits[name].ceiling is not None for name in [ID_SPLIT, *targets])

    points: dict[str, dict[str, float]] = {}
    samples: dict[str, dict[str, np.ndarray]] = {}
    for name in [ID_SPLIT, *targets]:
        split = splits[name]
        models = {"student": split.student, "teacher": split.teacher}
        if has_ceiling:
            models["ceiling"] = split.ceiling
        drawn = bootstrap_accuracies(list(models.values()), draws, split_seed(seed, name))
        points[name] = {model: accuracy_of_credit(c) for model, c in models.items()}
        samples[name] = dict(zip(models, drawn, strict=True))

    s_id, t_id = points[ID_SPLIT]["student"], points[ID_SPLIT]["teacher"]
    s_id_b, t_id_b = samples[ID_SPLIT]["student"], samples[ID_SPLIT]["teacher"]
    regress_b = np.maximum(0.0, t_id_b - s_id_b)

    result: dict[str, Any] = {
        "id": _acc_block(s_id, s_id_b, splits[ID_SPLIT].student.size, level),
        "teacher": {"id": _acc_block(t_id, t_id_b, splits[ID_SPLIT].student.size, level), "targets": {}},
        "wrg": wrg(s_id, t_id),
        "targets": {},
    }
    ci: dict[str, list[float]] = {"wrg": interval(s_id_b - t_id_b, level)}
    aogs, ntss, accs, t_accs = [], [], [], []
    aog_b, nts_b, acc_b, t_acc_b = [], [], [], []
    for name in targets:
        s_k, t_k = points[name]["student"], points[name]["teacher"]
        s_k_b, t_k_b = samples[name]["student"], samples[name]["teacher"]
        n = splits[name].student.size
        gain, gain_b = aog(s_k, t_k), s_k_b - t_k_b
        score, score_b = nts(gain, s_id, t_id), gain_b - regress_b
        result["targets"][name] = {
            "acc": s_k,
            "aog": gain,
            "nts": score,
            "n": n,
            "ci": {
                "acc": interval(s_k_b, level),
                "aog": interval(gain_b, level),
                "nts": interval(score_b, level),
            },
        }
        result["teacher"]["targets"][name] = _acc_block(t_k, t_k_b, n, level)
        aogs.append(gain)
        ntss.append(score)
        accs.append(s_k)
        t_accs.append(t_k)
        aog_b.append(gain_b)
        nts_b.append(score_b)
        acc_b.append(s_k_b)
        t_acc_b.append(t_k_b)

    result["mean_aog"], result["mean_nts"], result["mean_acc_ood"] = mean(aogs), mean(ntss), mean(accs)
    result["teacher"]["mean_acc_ood"] = mean(t_accs)
    ci["mean_aog"] = interval(np.mean(aog_b, axis=0), level)
    ci["mean_nts"] = interval(np.mean(nts_b, axis=0), level)
    ci["mean_acc_ood"] = interval(np.mean(acc_b, axis=0), level)
    result["teacher"]["ci"] = {"mean_acc_ood": interval(np.mean(t_acc_b, axis=0), level)}
    result["ci"] = ci

    result["pgr_id"], result["pgr_ood"], result["ceiling"] = None, None, None
    if has_ceiling:
        c_id = points[ID_SPLIT]["ceiling"]
        c_accs = [points[name]["ceiling"] for name in targets]
        result["pgr_id"] = pgr(s_id, t_id, c_id)
        result["pgr_ood"] = pgr(mean(accs), mean(t_accs), mean(c_accs))
        result["ceiling"] = {
            "id": {"acc": c_id},
            "targets": {name: {"acc": points[name]["ceiling"]} for name in targets},
            "mean_acc_ood": mean(c_accs),
        }
        for name in targets:
            result["targets"][name]["pgr"] = pgr(
                points[name]["student"], points[name]["teacher"], points[name]["ceiling"]
            )
    else:
        for name in targets:
            result["targets"][name]["pgr"] = None
    return result


CEILING_TIES_TEACHER = "ceiling ≈ teacher"
"""Why a PGR is withheld: the ceiling's gain over the teacher has an interval that includes 0."""


def ceiling_beats_teacher(ceiling: Mapping[str, Any]) -> dict[str, Any]:
    """Where the ceiling's gain over the teacher has an interval above 0: on ID (its WRG), on the
    mean over targets (its mean AOG) and per target (its AOG). PGR divides by that gain, so where
    it may be 0 the ratio can be anything (an under-trained ceiling 2.6 pp above its teacher made
    PGR OOD read 1.4-1.6 on real data) and is withheld rather than shown."""
    return {
        "id": ceiling["ci"]["wrg"][0] > 0,
        "mean_ood": ceiling["ci"]["mean_aog"][0] > 0,
        "targets": {t: block["ci"]["aog"][0] > 0 for t, block in ceiling["targets"].items()},
    }


def with_ceiling(
    student: Mapping[str, Any], ceiling: Mapping[str, Any], *, gate: bool = True
) -> dict[str, Any]:
    """A student's metrics with PGR and the ceiling's accuracies filled in from the ceiling's own metrics.

    Each method is evaluated on its own (the pipeline has a ceiling stage only when
    `methods` lists it, so no student may wait on one); PGR joins two results, so it is
    computed where they meet. Same formulas as `paired_metrics` on the same pairs; with `gate`
    (the report's use), a PGR whose denominator's interval includes 0 is None and
    `pgr_withheld` says why (`ceiling_beats_teacher`).
    """
    out = {**student, "targets": {t: dict(v) for t, v in student["targets"].items()}}
    targets = list(out["targets"])
    c_id = ceiling["id"]["acc"]
    c_accs = [ceiling["targets"][t]["acc"] for t in targets]
    beats = ceiling_beats_teacher(ceiling) if gate else None
    out["pgr_id"] = pgr(student["id"]["acc"], student["teacher"]["id"]["acc"], c_id)
    out["pgr_ood"] = pgr(student["mean_acc_ood"], student["teacher"]["mean_acc_ood"], mean(c_accs))
    out["ceiling"] = {
        "id": {"acc": c_id},
        "targets": {t: {"acc": a} for t, a in zip(targets, c_accs, strict=True)},
        "mean_acc_ood": mean(c_accs),
    }
    for t, c_acc in zip(targets, c_accs, strict=True):
        teacher_acc = student["teacher"]["targets"][t]["acc"]
        out["targets"][t]["pgr"] = pgr(student["targets"][t]["acc"], teacher_acc, c_acc)
    if beats is not None:
        withheld = []
        for key, ok in (("pgr_id", beats["id"]), ("pgr_ood", beats["mean_ood"])):
            if not ok:
                out[key] = None
                withheld.append(key)
        for t in targets:
            if not beats["targets"].get(t, False):
                out["targets"][t]["pgr"] = None
        out["pgr_withheld"] = {key: CEILING_TIES_TEACHER for key in withheld}
    return out


def _numeric_leaves(tree: Any, prefix: str = "") -> dict[str, float | None]:
    if isinstance(tree, Mapping):
        leaves: dict[str, float | None] = {}
        for key, value in tree.items():
            leaves.update(_numeric_leaves(value, f"{prefix}{key}."))
        return leaves
    if tree is None or (isinstance(tree, (int, float)) and not isinstance(tree, bool)):
        return {prefix[:-1]: tree}
    return {}


def across_seeds(per_seed: Sequence[Mapping[str, Any]], keys: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Mean and sample std (ddof=1; None with one seed) of dotted `keys` over per-seed metric dicts.

    A key that is null in some seed (e.g. an undefined PGR) averages over the seeds
    where it is defined and reports how many those were, never a silent zero.
    """
    if not per_seed:
        raise MetricsError("no per-seed metrics to aggregate")
    leaves = [_numeric_leaves(m) for m in per_seed]
    out: dict[str, dict[str, Any]] = {}
    for key in keys:
        values = [float(v) for leaf in leaves if (v := leaf.get(key)) is not None]
        if not values:
            out[key] = {"mean": None, "std": None, "n": 0}
            continue
        std = float(np.std(values, ddof=1)) if len(values) > 1 else None
        out[key] = {"mean": float(np.mean(values)), "std": std, "n": len(values)}
    return out
