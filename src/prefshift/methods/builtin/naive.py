"""Naive weak-to-strong: Bradley-Terry on the weak teacher's soft labels q."""

from prefshift.methods.registry import Method, bradley_terry

METHOD = Method(name="naive", labels="weak", objective=bradley_terry)
