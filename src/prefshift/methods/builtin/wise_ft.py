"""WiSE-FT: fine-tune as naive does, then interpolate the weights back towards the start,
θ_α = (1 − α)·θ₀ + α·θ_ft (Wortsman et al., CVPR 2022, "Robust fine-tuning of zero-shot
models"). No second training run: one pass over an α grid on the CPU's copy of both.

α is chosen on ID validation data only (`registry.ID_VALIDATION`: teacher_train with its gold
labels), never on an OOD target; id_test's accuracy at every α is recorded for the report's α
curve, and read by nothing that chooses. No OOD target is read at all: training is zero-shot, its
stage does not depend on the targets, and a target added later is scored without retraining
(so the α curve has no OOD rows; the chosen model's OOD accuracy is in its evaluation).

The rule, set before any result was read (DESIGN §11), is the one-standard-error rule: the
smallest α whose ID-validation accuracy is within one binomial standard error,
√(p(1 − p)/n) on the n validation pairs, of the best α's accuracy p. Validation accuracy is a
noisy estimate, so α's within one SE of the best are equally good as far as the data can tell,
and among them the rule takes the one closest to the start, which is what WiSE-FT is for (keep
the start's robustness while matching the fine-tuned model in distribution). The rule it
replaces (the best α, ties to the larger) chose α = 1, naive itself, on every seed of the
embedded default, because every α ≥ 0.1 tied on validation: a rule that never interpolates.

The head: θ₀ has no trained head (the student's start is the base with a freshly initialised
one), so interpolating it would mix a trained head with random weights. The head stays the
fine-tuned one at every α, and only the backbone interpolates. LP-FT's head would be the
other common start; it costs a second training run, which WiSE-FT exists to avoid.
"""

import math

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


def one_standard_error(accuracy_pp: float, pairs: int) -> float:
    """Binomial standard error (pp) of an accuracy measured on `pairs` pairs."""
    if pairs < 1:
        raise ValueError(f"a standard error needs at least one validation pair, got {pairs}")
    p = accuracy_pp / 100.0
    return math.sqrt(p * (1.0 - p) / pairs) * 100.0


def choose_alpha(alphas: list[float], validation_acc: list[float], pairs: int) -> float:
    """The one-standard-error rule: the smallest α whose validation accuracy is at least the best
    accuracy minus one binomial SE of the best (module docstring says why)."""
    best = max(validation_acc)
    floor = best - one_standard_error(best, pairs)
    return min(a for a, acc in zip(alphas, validation_acc, strict=True) if acc >= floor - 1e-9)


def full_weights_only(model, objective, build: Build) -> None:
    """Refused with LoRA before training starts, not after: the start and the fine-tuned model
    must hold the same full weights to be interpolated."""
    from prefshift.methods.weights import require_full_weights

    require_full_weights(build.name, build.params.student.lora.enabled)


def interpolate_back(model, build: Build) -> dict:
    """Score every α on ID validation (and, for the record, on id_test); keep the chosen α."""
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
    pairs = build.tools.pair_count(ID_VALIDATION)
    chosen = choose_alpha(alphas, curve[ID_VALIDATION], pairs)
    model.hf.load_state_dict(interpolate(start, tuned, chosen, keep))
    return {
        "alphas": alphas,
        "accuracy": curve,
        "chosen_alpha": chosen,
        "chosen_on": ID_VALIDATION,
        "rule": "one standard error",
        "validation_pairs": pairs,
        "standard_error": one_standard_error(max(curve[ID_VALIDATION]), pairs),
    }


METHOD = Method(
    name="wise_ft",
    labels="weak",
    objective=bradley_terry,
    settings=WiseFTSettings,
    prepare=full_weights_only,
    after_training=interpolate_back,
)
