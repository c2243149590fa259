"""Linear probe: the frozen strong base with a reward head trained on q. It keeps everything
close by moving nothing but the head: the λ → ∞ limit of an anchor on every layer."""

from prefshift.methods.registry import Build, Method, bradley_terry


def freeze_backbone(model, objective, build: Build) -> None:
    """Leave only the scalar head trainable; refused with LoRA (it would train the adapters)."""
    from prefshift.methods.weights import freeze_all_but, require_full_weights
    from prefshift.models.reward import head_parameter_names

    require_full_weights(build.name, build.params.student.lora.enabled)
    freeze_all_but(model.hf, head_parameter_names(model))


METHOD = Method(name="linear_probe", labels="weak", objective=bradley_terry, prepare=freeze_backbone)
