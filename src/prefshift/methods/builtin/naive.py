"""Naive weak-to-strong: Bradley-Terry on the weak teacher's soft labels q."""

from prefshift.methods.registry import Build, Method


def bradley_terry(build: Build):
    """Bradley-Terry on the method's soft targets, whatever their source."""
    from prefshift.methods.base import Objective

    return Objective(build.name)


METHOD = Method(name="naive", labels="weak", objective=bradley_terry)
