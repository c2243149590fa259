"""L2-SP: Bradley-Terry on q plus λ times the squared distance of the backbone's weights from the
start (Li et al., ICML 2018). It keeps the weights close where ANCHOR keeps the hidden states."""

from pydantic import BaseModel, ConfigDict, Field

from prefshift.methods.registry import Build, Method


class L2SPSettings(BaseModel):
    """Params section `l2_sp`."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    lam: float = Field(
        0.005,
        ge=0,
        alias="lambda",
        description="Weight of ||θ − θ₀||² over the backbone (the new head excluded). Li et al. 2018 "
        "write α/2 · ||w − w⁰||² and use α = 0.01 (or 0.1) on ImageNet-pretrained CNNs, hence "
        "0.005; the sum runs over every weight, so its scale grows with the model.",
    )


def objective(build: Build):
    from prefshift.methods.weights import L2SPObjective

    return L2SPObjective(build.name, lam=build.settings.lam)


def bind_start(model, objective, build: Build) -> None:
    """Record θ₀, the loaded start's backbone weights, before the first update."""
    from prefshift.methods.weights import require_full_weights
    from prefshift.models.reward import head_parameter_names

    require_full_weights(build.name, build.params.student.lora.enabled)
    objective.bind(model.hf, head_parameter_names(model))


METHOD = Method(name="l2_sp", labels="weak", objective=objective, settings=L2SPSettings, prepare=bind_start)
