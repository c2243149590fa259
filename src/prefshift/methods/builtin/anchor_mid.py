"""ANCHOR on intermediate layers (anchor.mid_fractions of the depth); otherwise as anchor_last."""

from prefshift.methods.builtin.anchor_last import anchor_objective
from prefshift.methods.registry import Method

METHOD = Method(
    name="anchor_mid", labels="weak", objective=anchor_objective, sections=("anchor",), anchor_kind="mid"
)
