"""The metric-agreement table: Kendall's τ between each pairwise metric and the best-of-n gain, by hand."""

from __future__ import annotations

import pytest

from prefshift.pipeline.stages import report_agreement


def _doc(id_acc: float, acc: float, nts: float, teacher: dict | None = None, official: float | None = None):
    doc = {"id": {"acc": id_acc}, "targets": {"t": {"acc": acc, "nts": nts}}}
    if official is not None:
        doc["benchmarks"] = {"targets": {"t": {"score": official}}}
    return doc if teacher is None else {**doc, "teacher": teacher}


def _gains(**by_model: float) -> dict:
    return {name: {"splits": {"t": {"judge": {"gold_gain": g}}}} for name, g in by_model.items()}


def test_tau_per_metric_against_the_best_of_n_gain_by_hand():
    teacher = _doc(50.0, 45.0, 0.0, official=40.0)
    metrics = {
        "naive": _doc(60.0, 40.0, -5.0, teacher, official=55.0),
        "anchor_last": _doc(70.0, 50.0, 5.0, teacher, official=60.0),
    }
    gains = _gains(teacher=0.1, naive=0.2, anchor_last=0.3)
    rows = report_agreement.agreement_rows({0: metrics}, {0: gains}, ["t"], draws=50, level=0.95, seed=0)
    tau = {r["metric"]: r["tau"] for r in rows}
    # Gains order teacher < naive < anchor_last. ID acc (50, 60, 70) and the official score (40, 55,
    # 60) agree on all 3 model pairs: τ = 1. Target acc (45, 40, 50) reverses teacher/naive only:
    # (2 concordant − 1 discordant) / 3 = 0.333. NTS (0, −5, 5; the teacher's is 0): the same.
    assert tau == pytest.approx({"ID acc": 1.0, "t acc": 1 / 3, "t NTS": 1 / 3, "t official score": 1.0})
    assert all(r["n"] == 3 and r["split"] == "t" for r in rows)
    # A model without a best-of-n document is left out, and two models are too few for a τ.
    fewer = report_agreement.agreement_rows(
        {0: metrics}, {0: _gains(teacher=0.1, naive=0.2)}, ["t"], draws=50, level=0.95, seed=0
    )
    assert all(r["tau"] is None and r["n"] == 2 for r in fewer)
    section = report_agreement.agreement_section(rows, 8, 0.95)
    assert "at n = 8" in section and "| t | t acc | +0.33 [" in section and "| 3 |" in section


def test_every_seed_is_a_model_of_its_own():
    """Two seeds: six (seed, model) points, each seed's teacher among them. By hand, ID acc
    (50, 60, 70 | 52, 58, 66) against gains (0.1, 0.2, 0.3 | 0.15, 0.5, 0.4): of the 15 pairs four
    are discordant (s0 naive and s0 anchor_last against s1 naive, s0 anchor_last against s1
    anchor_last, s1 naive against s1 anchor_last): τ = (11 − 4) / 15 = 7/15."""
    runs = {
        seed: {"naive": _doc(naive, 40.0, 0.0, teacher), "anchor_last": _doc(anchor, 50.0, 0.0, teacher)}
        for seed, naive, anchor, teacher in (
            (0, 60.0, 70.0, _doc(50.0, 45.0, 0.0)),
            (1, 58.0, 66.0, _doc(52.0, 45.0, 0.0)),
        )
    }
    gains = {
        0: _gains(teacher=0.1, naive=0.2, anchor_last=0.3),
        1: _gains(teacher=0.15, naive=0.5, anchor_last=0.4),
    }
    rows = report_agreement.agreement_rows(runs, gains, ["t"], draws=50, level=0.95, seed=0)
    by_metric = {r["metric"]: r for r in rows}
    assert by_metric["ID acc"]["n"] == 6 and by_metric["ID acc"]["tau"] == pytest.approx(7 / 15)
