"""Linear probe: the frozen strong base with a reward head trained on q. It keeps everything
close by moving nothing but the head: the λ → ∞ limit of an anchor on every layer."""

from prefshift.core.errors import PrefshiftError
from prefshift.methods.registry import Build, Method, bradley_terry


class HeadOnlyError(PrefshiftError, ValueError):
    """A head-only phase asked for with LoRA adapters, which would train the adapters instead."""


def freeze_backbone(model, objective, build: Build) -> None:
    """Leave only the scalar head trainable; refused with LoRA (there is nothing for it to adapt)."""
    from prefshift.methods.weights import freeze_all_but
    from prefshift.models.reward import head_parameter_names

    if build.params.student.lora.enabled:
        raise HeadOnlyError(
            f"{build.name} trains only the reward head on a frozen base; set student.lora.enabled: false"
        )
    freeze_all_but(model.hf, head_parameter_names(model))


METHOD = Method(name="linear_probe", labels="weak", objective=bradley_terry, prepare=freeze_backbone)
