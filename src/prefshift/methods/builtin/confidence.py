"""Confidence weak-to-strong (Burns et al. 2023): q mixed with the student's hardened predictions.
The loss is in prefshift.methods.confidence; params section `confidence`."""

from prefshift.methods.registry import Build, Method


def _objective(build: Build):
    from prefshift.methods.confidence import ConfidenceObjective

    cfg = build.params.confidence
    return ConfidenceObjective(build.name, alpha=cfg.alpha, warmup_frac=cfg.warmup_frac)


METHOD = Method(name="confidence", labels="weak", objective=_objective, sections=("confidence",))
