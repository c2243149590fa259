"""WiSE-FT: fine-tune as naive does, then interpolate the weights back towards the start,
θ_α = (1 − α)·θ₀ + α·θ_ft (Wortsman et al., CVPR 2022, "Robust fine-tuning of zero-shot
models"). No second training run: one pass over an α grid on the CPU's copy of both.

α is chosen on ID validation data only (`registry.ID_VALIDATION`: teacher_train with its gold
labels), never on an OOD target; the accuracy of every held-out split at every α is recorded
for the report's α curve, and read by nothing that chooses.

The head: θ₀ has no trained head (the student's start is the base with a freshly initialised
one), so interpolating it would mix a trained head with random weights. The head stays the
fine-tuned one at every α, and only the backbone interpolates. LP-FT's head would be the
other common start; it costs a second training run, which WiSE-FT exists to avoid.
"""

from pydantic import BaseModel, ConfigDict, Field, field_validator

from prefshift.methods.registry import ID_VALIDATION, Build, Method, bradley_terry


class WiseFTSettings(BaseModel):
    """Params section `wise_ft`."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    alphas: list[float] = Field(
        default_factory=lambda: [round(0.1 * i, 1) for i in range(11)],
        min_length=1,
        description="α grid, each in [0, 1]: 0 is the start, 1 the fine-tuned student. Wortsman et al. "
        "sweep α in steps of 0.1 and choose it on ID validation data.",
    )

    @field_validator("alphas")
    @classmethod
    def _in_unit_interval(cls, value: list[float]) -> list[float]:
        bad = [a for a in value if not 0.0 <= a <= 1.0]
        if bad:
            raise ValueError(f"every α must lie in [0, 1], got {bad}")
        if len(set(value)) != len(value):
            raise ValueError("an α is listed twice")
        return sorted(value)


def choose_alpha(alphas: list[float], validation_acc: list[float]) -> float:
    """The α with the best ID validation accuracy; a tie goes to the larger α, the one closer to
    the model that was trained (so a flat curve keeps the fine-tuned student)."""
    best = max(validation_acc)
    return max(a for a, acc in zip(alphas, validation_acc, strict=True) if acc == best)


def full_weights_only(model, objective, build: Build) -> None:
    """Refused with LoRA before training starts, not after: the start and the fine-tuned model
    must hold the same full weights to be interpolated."""
    from prefshift.methods.weights import require_full_weights

    require_full_weights(build.name, build.params.student.lora.enabled)


def interpolate_back(model, build: Build) -> dict:
    """Score every α on ID validation (and, for the record, on each held-out split); keep the chosen α."""
    from prefshift.methods.weights import interpolate
    from prefshift.models.reward import head_parameter_names, load_reward_model

    tuned = {k: v.detach().cpu().clone() for k, v in model.hf.state_dict().items()}
    start_model, _ = load_reward_model(
        build.start_dir, trust_remote_code=build.params.backbone.trust_remote_code
    )
    start = {k: v.detach().cpu() for k, v in start_model.hf.state_dict().items()}
    del start_model
    keep = head_parameter_names(model)
    alphas = list(build.settings.alphas)
    curve: dict[str, list[float]] = {ID_VALIDATION: []}
    splits = build.tools.heldout_splits()
    for split in splits:
        curve[split] = []
    for alpha in alphas:
        model.hf.load_state_dict(interpolate(start, tuned, alpha, keep))
        for split in (ID_VALIDATION, *splits):
            curve[split].append(build.tools.accuracy(model, split))
    chosen = choose_alpha(alphas, curve[ID_VALIDATION])
    model.hf.load_state_dict(interpolate(start, tuned, chosen, keep))
    return {"alphas": alphas, "accuracy": curve, "chosen_alpha": chosen, "chosen_on": ID_VALIDATION}


METHOD = Method(
    name="wise_ft",
    labels="weak",
    objective=bradley_terry,
    settings=WiseFTSettings,
    prepare=full_weights_only,
    after_training=interpolate_back,
)
