"""Metric math against hand-computed values, and compute_metrics on constructed score frames."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from prefshift.config.params import Params
from prefshift.data.schema import Group
from prefshift.pipeline.stages.evaluate import EvaluateError, compute_metrics
from prefshift.science import diagnostics, metrics

TARGETS = ["syn_help_instruct", "syn_help_chat"]


def test_accuracy_counts_ties_as_half():
    assert metrics.credit([2.0, -1.0, 0.0, 0.5]).tolist() == [1.0, 0.0, 0.5, 1.0]
    assert metrics.accuracy([2.0, -1.0, 0.0, 0.5]) == pytest.approx(62.5)
    with pytest.raises(metrics.MetricsError):
        metrics.accuracy([])


def test_gains_and_nts_penalty_only_on_id_regression():
    assert metrics.wrg(72.0, 70.0) == pytest.approx(2.0)
    assert metrics.aog(55.0, 60.0) == pytest.approx(-5.0)
    # Student regresses ID by 2 pp: NTS = AOG - 2.
    assert metrics.nts(5.0, acc_student_id=70.0, acc_teacher_id=72.0) == pytest.approx(3.0)
    # Student improves ID: no bonus, NTS = AOG.
    assert metrics.nts(5.0, acc_student_id=75.0, acc_teacher_id=72.0) == pytest.approx(5.0)


def test_pgr_undefined_unless_ceiling_beats_teacher():
    assert metrics.pgr(75.0, 70.0, 80.0) == pytest.approx(0.5)
    assert metrics.pgr(75.0, 70.0, 70.0) is None
    assert metrics.pgr(75.0, 70.0, 65.0) is None


def _split(student, teacher, ceiling=None):
    ceiling = None if ceiling is None else np.asarray(ceiling, dtype=float)
    return metrics.SplitCredits(np.asarray(student, dtype=float), np.asarray(teacher, dtype=float), ceiling)


def test_paired_metrics_hand_computed_means_over_targets():
    splits = {
        "id_test": _split([1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]),  # s 75, t 50, c 100
        "a": _split([1, 0], [1, 1], [1, 1]),  # s 50, t 100, c 100
        "b": _split([1, 1, 1, 1], [0, 0, 0, 1], [1, 1, 0.5, 1]),  # s 100, t 25, c 87.5
    }
    out = metrics.paired_metrics(splits, ["a", "b"], draws=50, level=0.95, seed=0)
    assert out["id"]["acc"] == pytest.approx(75.0)
    assert out["teacher"]["id"]["acc"] == pytest.approx(50.0)
    assert out["wrg"] == pytest.approx(25.0)
    assert out["targets"]["a"]["aog"] == pytest.approx(-50.0)
    assert out["targets"]["a"]["nts"] == pytest.approx(-50.0)  # no ID regression: no penalty
    assert out["targets"]["b"]["aog"] == pytest.approx(75.0)
    assert out["mean_aog"] == pytest.approx(12.5)
    assert out["mean_nts"] == pytest.approx(12.5)
    assert out["mean_acc_ood"] == pytest.approx(75.0)
    assert out["pgr_id"] == pytest.approx(0.5)
    assert out["targets"]["a"]["pgr"] is None  # ceiling ties the teacher on a
    assert out["targets"]["b"]["pgr"] == pytest.approx(75.0 / 62.5)
    # OOD PGR on target-averaged accuracies: (75 - 62.5) / (93.75 - 62.5).
    assert out["pgr_ood"] == pytest.approx(0.4)


def test_pgr_joined_in_the_report_equals_pgr_computed_with_the_ceiling():
    student = {"id_test": [1, 1, 1, 0], "a": [1, 0], "b": [1, 1, 1, 1]}
    teacher = {"id_test": [1, 1, 0, 0], "a": [1, 1], "b": [0, 0, 0, 1]}
    ceiling = {"id_test": [1, 1, 1, 1], "a": [1, 1], "b": [1, 1, 0.5, 1]}

    def run(first, with_ceiling):
        splits = {k: _split(first[k], teacher[k], ceiling[k] if with_ceiling else None) for k in first}
        return metrics.paired_metrics(splits, ["a", "b"], draws=50, level=0.95, seed=0)

    joined = metrics.with_ceiling(run(student, False), run(ceiling, False), gate=False)
    together = run(student, True)
    assert joined["pgr_id"] == pytest.approx(0.5) and joined["pgr_ood"] == pytest.approx(0.4)
    assert joined["ceiling"] == together["ceiling"]
    for key in ("pgr_id", "pgr_ood"):
        assert joined[key] == pytest.approx(together[key])
    assert [joined["targets"][t]["pgr"] for t in "ab"] == [together["targets"][t]["pgr"] for t in "ab"]


def test_pgr_is_withheld_where_the_ceilings_gain_interval_includes_zero():
    student = {
        "id": {"acc": 70.0},
        "mean_acc_ood": 60.0,
        "teacher": {"id": {"acc": 60.0}, "mean_acc_ood": 50.0},
    }
    student |= {"targets": {"a": {"acc": 60.0}}}
    student["teacher"]["targets"] = {"a": {"acc": 50.0}}
    # The ceiling beats the teacher on ID (WRG 20 [5, 35]) but only by 2.6 [−1.0, 6.2] out of distribution.
    ceiling = {"id": {"acc": 80.0}, "mean_acc_ood": 52.6, "ci": {"wrg": [5.0, 35.0], "mean_aog": [-1.0, 6.2]}}
    ceiling |= {"targets": {"a": {"acc": 52.6, "ci": {"aog": [-1.0, 6.2]}}}}
    out = metrics.with_ceiling(student, ceiling)
    assert out["pgr_id"] == pytest.approx(0.5)  # (70 − 60) / (80 − 60)
    assert out["pgr_ood"] is None and out["targets"]["a"]["pgr"] is None
    assert out["pgr_withheld"] == {"pgr_ood": metrics.CEILING_TIES_TEACHER}
    ungated = metrics.with_ceiling(student, ceiling, gate=False)
    assert ungated["pgr_ood"] == pytest.approx(10.0 / 2.6)  # the number that cannot mean what it says


def test_paired_metrics_nts_penalises_id_regression():
    splits = {
        "id_test": _split([1, 0, 0, 0], [1, 1, 0, 0]),  # s 25, t 50: regression of 25
        "a": _split([1, 1], [1, 0]),  # AOG +50
        "b": _split([0, 0], [0, 0]),  # AOG 0
    }
    out = metrics.paired_metrics(splits, ["a", "b"], draws=50, level=0.95, seed=0)
    assert out["targets"]["a"]["nts"] == pytest.approx(25.0)
    assert out["targets"]["b"]["nts"] == pytest.approx(-25.0)
    assert out["mean_nts"] == pytest.approx(0.0)
    assert out["pgr_id"] is None and out["pgr_ood"] is None and out["ceiling"] is None


def _credits(n, share, rng):
    return (rng.random(n) < share).astype(float)


def test_bootstrap_interval_contains_estimate_and_shrinks_with_more_pairs():
    rng = np.random.default_rng(1)
    widths = []
    for n in (100, 2000):
        splits = {name: _split(_credits(n, 0.7, rng), _credits(n, 0.6, rng)) for name in ("id_test", "a")}
        out = metrics.paired_metrics(splits, ["a"], draws=400, level=0.95, seed=3)
        for value, ci in [
            (out["id"]["acc"], out["id"]["ci"]),
            (out["wrg"], out["ci"]["wrg"]),
            (out["targets"]["a"]["aog"], out["targets"]["a"]["ci"]["aog"]),
            (out["targets"]["a"]["nts"], out["targets"]["a"]["ci"]["nts"]),
            (out["mean_aog"], out["ci"]["mean_aog"]),
        ]:
            assert ci[0] <= value <= ci[1]
        widths.append(out["id"]["ci"][1] - out["id"]["ci"][0])
    assert widths[1] < widths[0] / 2


def test_bootstrap_is_paired_and_seeded():
    same = np.array([1, 0, 1, 1, 0, 1, 0, 1], dtype=float)
    splits = {"id_test": _split(same, same), "a": _split(same, same)}
    out = metrics.paired_metrics(splits, ["a"], draws=200, level=0.95, seed=0)
    # The same pairs resampled for both models: a zero difference has a zero-width interval.
    assert out["ci"]["wrg"] == [0.0, 0.0]
    assert out["targets"]["a"]["ci"]["aog"] == [0.0, 0.0]
    again = metrics.paired_metrics(splits, ["a"], draws=200, level=0.95, seed=0)
    assert again == out


def test_across_seeds_mean_std_and_nulls():
    runs = [{"wrg": 1.0, "pgr_id": None}, {"wrg": 3.0, "pgr_id": 0.5}]
    stats = metrics.across_seeds(runs, ["wrg", "pgr_id", "absent"])
    assert stats["wrg"] == {"mean": 2.0, "std": pytest.approx(math.sqrt(2.0)), "n": 2}
    assert stats["pgr_id"] == {"mean": 0.5, "std": None, "n": 1}
    assert stats["absent"] == {"mean": None, "std": None, "n": 0}


def test_ece_constructed_cases():
    ln3 = math.log(3.0)  # σ(ln 3) = 0.75
    # Confidence 0.75 everywhere, 3 of 4 preferred responses right: perfectly calibrated.
    assert diagnostics.expected_calibration_error([ln3, ln3, ln3, -ln3], [1, 1, 1, 1], 10) == pytest.approx(
        0.0
    )
    # Confidence 0.75, only half right: |0.75 - 0.5| = 25 pp.
    assert diagnostics.expected_calibration_error([ln3, ln3, -ln3, -ln3], [1, 1, 1, 1], 10) == pytest.approx(
        25.0
    )
    # Two bins: 2 pairs at 0.75 all right (err 0.25), 2 ties at 0.5 scoring 0.5 (err 0): 0.5·25 pp.
    assert diagnostics.expected_calibration_error([ln3, ln3, 0.0, 0.0], [1, 1, 1, 1], 10) == pytest.approx(
        12.5
    )
    # Graded gold 0.75 on pairs predicted with 0.75 confidence: calibrated.
    assert diagnostics.expected_calibration_error([ln3, ln3], [0.75, 0.75], 5) == pytest.approx(0.0)


def test_best_of_n_constructed_groups():
    rewards = [[1, 3, 2], [2, 2, 0], [0, 1, 2]]
    gold = [[0, 5, 1], [1, 5, 0], [3, 2, 1]]
    out = diagnostics.best_of_n(rewards, gold)
    # Hit, half credit (reward tie between a best and a non-best response), miss.
    assert out["acc"] == pytest.approx(50.0)
    assert out["random"] == pytest.approx(100.0 / 3)
    assert out["n_groups"] == 3
    with pytest.raises(metrics.MetricsError, match="group 0"):
        diagnostics.best_of_n([[1.0, 2.0]], [[1.0, 2.0, 3.0]])


def test_length_shortcut_correlation_and_split_accuracy():
    delta = [2.0, 1.0, -1.0, -2.0, 0.5]
    len_c = [12, 11, 9, 8, 10]
    len_r = [10, 10, 10, 10, 10]
    out = diagnostics.length_shortcut(delta, len_c, len_r)
    assert out["pearson_r"] == pytest.approx(np.corrcoef(delta, [2, 1, -1, -2, 0])[0, 1])
    assert out["chosen_longer"] == {"acc": 100.0, "n": 2}
    assert out["chosen_shorter"] == {"acc": 0.0, "n": 2}
    assert out["equal_length"] == {"acc": 100.0, "n": 1}
    assert out["share_chosen_longer"] == pytest.approx(40.0)
    assert diagnostics.length_shortcut([1.0, 2.0], [5, 5], [5, 5])["pearson_r"] is None


def test_cue_reliance_splits_accuracy_by_the_side_the_cue_is_on():
    delta = [1.0, 2.0, -1.0, 0.0, -3.0, 1.0]
    sides = ["chosen", "chosen", "chosen", "rejected", "rejected", None]
    out = diagnostics.cue_reliance(delta, sides)
    assert out["on_chosen"] == {"acc": pytest.approx(200.0 / 3), "n": 3}  # 2 of 3 right
    assert out["on_rejected"] == {"acc": 25.0, "n": 2}  # a tie (half credit) and a miss
    assert out["gap"] == pytest.approx(200.0 / 3 - 25.0)
    assert diagnostics.cue_reliance([1.0], ["chosen"])["gap"] is None  # one side never seen
    with pytest.raises(metrics.MetricsError, match="one cue side per margin"):
        diagnostics.cue_reliance([1.0, 2.0], ["chosen"])


def _frame(ids, delta, len_c=None, len_r=None):
    n = len(ids)
    return pd.DataFrame(
        {
            "pair_id": ids,
            "delta": np.asarray(delta, dtype=float),
            "gold": np.ones(n),
            "len_chosen": len_c if len_c is not None else np.full(n, 10),
            "len_rejected": len_r if len_r is not None else np.arange(n) + 5,
        }
    )


def _params(**evaluate):
    return Params.model_validate({"data": {"targets": TARGETS}, "evaluate": {"bootstrap": 100, **evaluate}})


def _frames(student_sign, teacher_sign, n=8):
    out = {}
    for split in ["id_test", *TARGETS]:
        ids = [f"{split}-{i}" for i in range(n)]
        out[split] = (
            _frame(ids, student_sign[split]),
            _frame(list(reversed(ids)), list(reversed(teacher_sign[split]))),  # another row order
        )
    return out


def test_compute_metrics_on_constructed_frames():
    s = {
        "id_test": [1, 1, 1, 1, 1, 1, -1, -1],
        "syn_help_instruct": [1] * 4 + [-1] * 4,
        "syn_help_chat": [1] * 8,
    }
    t = {
        "id_test": [1, 1, 1, 1, -1, -1, -1, -1],
        "syn_help_instruct": [1] * 6 + [-1] * 2,
        "syn_help_chat": [0] * 8,
    }
    frames = _frames(s, t)
    student = {k: v[0] for k, v in frames.items()}
    teacher = {k: v[1] for k, v in frames.items()}
    groups = [Group("g1", "syn_help_forum", "helpful", [], ["a", "b"], [1.0, 2.0])]
    group_scores = {"syn_help_forum": pd.DataFrame({"group_id": ["g1"], "rewards": [[0.0, 3.0]]})}
    out = compute_metrics(
        student, teacher, None, _params(), group_scores, {"syn_help_forum": groups}, group_scores
    )
    assert out["id"]["acc"] == pytest.approx(75.0)
    assert out["teacher"]["id"]["acc"] == pytest.approx(50.0)
    assert out["wrg"] == pytest.approx(25.0)
    assert out["targets"]["syn_help_instruct"]["aog"] == pytest.approx(-25.0)
    assert out["targets"]["syn_help_chat"]["aog"] == pytest.approx(50.0)  # teacher ties every pair
    assert out["mean_aog"] == pytest.approx(12.5)
    assert out["pgr_id"] is None
    assert out["best_of_n"]["syn_help_forum"]["acc"] == pytest.approx(100.0)
    assert out["teacher"]["best_of_n"]["syn_help_forum"]["acc"] == pytest.approx(100.0)
    assert set(out["ece"]) == {"id_test", *TARGETS}
    assert out["teacher"]["length_shortcut"]["syn_help_chat"]["pearson_r"] is None  # constant Δ
    assert out["pairs"]["id_test"] == {"compared": 8, "missing": {"student": 0, "teacher": 0}}
    assert out["cue_shortcut"] == {}  # no pair records a cue


def test_compute_metrics_reports_each_recorded_cue_per_split_and_model():
    s = {"id_test": [1, 1, 1, 1, -1, -1, -1, -1], "syn_help_instruct": [1] * 8, "syn_help_chat": [1] * 8}
    frames = _frames(s, s)
    student = {k: v[0] for k, v in frames.items()}
    teacher = {k: v[1] for k, v in frames.items()}
    # the marker on the chosen response of the first four ID pairs: exactly the ones the student gets right
    sides = {"id_test": {"marker": {f"id_test-{i}": "chosen" if i < 4 else "rejected" for i in range(8)}}}
    out = compute_metrics(student, teacher, None, _params(), sides=sides)
    block = out["cue_shortcut"]["id_test"]["marker"]
    assert block["on_chosen"] == {"acc": 100.0, "n": 4} and block["on_rejected"] == {"acc": 0.0, "n": 4}
    assert block["gap"] == pytest.approx(100.0)
    assert out["teacher"]["cue_shortcut"]["id_test"]["marker"]["gap"] == pytest.approx(100.0)
    assert set(out["cue_shortcut"]) == {"id_test"}  # targets record no cue here


def test_compute_metrics_ceiling_equal_to_student_gives_pgr_one():
    s = {
        "id_test": [1] * 6 + [-1] * 2,
        "syn_help_instruct": [1] * 5 + [-1] * 3,
        "syn_help_chat": [1] * 7 + [-1],
    }
    t = {
        "id_test": [1] * 4 + [-1] * 4,
        "syn_help_instruct": [1] * 4 + [-1] * 4,
        "syn_help_chat": [1] * 4 + [-1] * 4,
    }
    frames = _frames(s, t)
    student = {k: v[0] for k, v in frames.items()}
    teacher = {k: v[1] for k, v in frames.items()}
    out = compute_metrics(student, teacher, student, _params())
    assert out["pgr_id"] == pytest.approx(1.0)
    assert out["pgr_ood"] == pytest.approx(1.0)
    assert all(out["targets"][t]["pgr"] == pytest.approx(1.0) for t in TARGETS)


def test_compute_metrics_drops_unscored_pairs_and_counts_them():
    s = {k: [1] * 8 for k in ["id_test", *TARGETS]}
    frames = _frames(s, s)
    student = {k: v[0] for k, v in frames.items()}
    teacher = {k: v[1] for k, v in frames.items()}
    student["id_test"] = student["id_test"].iloc[:6]  # two pairs truncated away for the student
    out = compute_metrics(student, teacher, None, _params())
    assert out["pairs"]["id_test"] == {"compared": 6, "missing": {"student": 2, "teacher": 0}}
    assert out["id"]["n"] == 6


def test_compute_metrics_rejects_bad_frames():
    s = {k: [1] * 4 for k in ["id_test", *TARGETS]}
    frames = _frames(s, s, n=4)
    student = {k: v[0] for k, v in frames.items()}
    teacher = {k: v[1] for k, v in frames.items()}
    broken = dict(student, id_test=student["id_test"].assign(delta=[1.0, np.nan, 1.0, 1.0]))
    with pytest.raises(EvaluateError, match=r"row 1 .*non-finite"):
        compute_metrics(broken, teacher, None, _params())
    empty = dict(student, syn_help_chat=student["syn_help_chat"].iloc[:0])
    with pytest.raises(EvaluateError, match="syn_help_chat"):
        compute_metrics(empty, teacher, None, _params())
    stale = dict(teacher, id_test=teacher["id_test"].assign(pair_id=["x1", "x2", "x3", "x4"]))
    with pytest.raises(EvaluateError, match="share no pair"):
        compute_metrics(student, stale, None, _params())
    with pytest.raises(EvaluateError, match="no teacher scores for split 'syn_help_chat'"):
        compute_metrics(student, {k: v for k, v in teacher.items() if k != "syn_help_chat"}, None, _params())
