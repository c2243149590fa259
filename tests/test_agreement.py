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
    rows = report_agreement.agreement_rows(metrics, gains, ["t"], draws=50, level=0.95, seed=0)
    tau = {r["metric"]: r["tau"] for r in rows}
    # Gains order teacher < naive < anchor_last. ID acc (50, 60, 70) and the official score (40, 55,
    # 60) agree on all 3 model pairs: τ = 1. Target acc (45, 40, 50) reverses teacher/naive only:
    # (2 concordant − 1 discordant) / 3 = 0.333. NTS (0, −5, 5; the teacher's is 0): the same.
    assert tau == pytest.approx({"ID acc": 1.0, "t acc": 1 / 3, "t NTS": 1 / 3, "t official score": 1.0})
    assert all(r["n"] == 3 and r["split"] == "t" for r in rows)
    # A model without a best-of-n document is left out, and two models are too few for a τ.
    fewer = report_agreement.agreement_rows(
        metrics, _gains(teacher=0.1, naive=0.2), ["t"], draws=50, level=0.95, seed=0
    )
    assert all(r["tau"] is None and r["n"] == 2 for r in fewer)
    section = report_agreement.agreement_section(rows, 8, 0.95)
    assert "at n = 8" in section and "| t | t acc | +0.33 [" in section and "| 3 |" in section
