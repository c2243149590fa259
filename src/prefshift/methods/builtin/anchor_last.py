"""ANCHOR on the last layer: BT on q plus λ · masked MSE to the frozen start's final hidden
states (prefshift.methods.anchor); params section `anchor`."""

from prefshift.methods.registry import Build, Method


def anchor_objective(build: Build):
    """The anchor objective at this method's layers (its anchor_kind), validated before training."""
    from prefshift.methods.anchor import AnchorObjective
    from prefshift.methods.layers import anchor_layers
    from prefshift.methods.registry import get

    cfg = build.params.anchor
    layers = anchor_layers(get(build.name).anchor_kind, build.num_layers, cfg.mid_fractions)
    return AnchorObjective(build.name, layers=layers, lam=cfg.lam, normalize=cfg.normalize)


METHOD = Method(
    name="anchor_last", labels="weak", objective=anchor_objective, sections=("anchor",), anchor_kind="last"
)
