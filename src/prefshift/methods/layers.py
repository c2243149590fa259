"""Which hidden states an anchor method pulls towards the reference: plain arithmetic, no torch.

Separate from the objective so the stages that only need the layer numbers (plan, targets,
probe, reference's request) start without importing torch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from prefshift.core.errors import PrefshiftError


class AnchorError(PrefshiftError, ValueError):
    """Anchor settings that cannot work with this model; raised before training starts."""


def anchor_layers(kind: str, num_layers: int, mid_fractions: Sequence[float]) -> tuple[int, ...]:
    """hidden_states indices: `last` = L (final layer output); `mid` = round(f · L), halves up."""
    if kind == "last":
        layers = (num_layers,)
    elif kind == "mid":
        layers = tuple(sorted({math.floor(f * num_layers + 0.5) for f in mid_fractions}))
    else:
        raise AnchorError(f"unknown anchor kind {kind!r} (last|mid)")
    for layer in layers:
        if not 1 <= layer <= num_layers:
            raise AnchorError(
                f"anchor layer {layer} is out of range for a model with {num_layers} layers "
                f"(anchor.mid_fractions={list(mid_fractions)})"
            )
    return layers
