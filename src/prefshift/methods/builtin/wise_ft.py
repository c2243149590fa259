"""WiSE-FT: fine-tune as naive does, then interpolate the weights back towards the start,
θ_α = (1 − α)·θ₀ + α·θ_ft (Wortsman et al., CVPR 2022, "Robust fine-tuning of zero-shot
models"). No second training run: one pass over an α grid on the CPU's copy of both.

α is chosen on ID validation data only (`registry.ID_VALIDATION`: teacher_train with its gold
labels), never on an OOD target; id_test's accuracy at every α is recorded for the report's α
curve, and read by nothing that chooses. Training reads no OOD target: it is zero-shot, its stage
does not depend on the targets, and a target added later is scored without retraining. The α
curve's OOD rows come from that scoring instead (`on_target`, run by `score-target` for each
target): the fine-tuned weights θ_ft are kept beside the saved model (`wise_ft_fine_tuned`), so
every α of the grid is rebuilt there and scored on that target alone, after α was chosen.

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


FINE_TUNED = "wise_ft_fine_tuned"
"""The fine-tuned weights θ_ft, kept beside the saved (interpolated) model for `on_target`: at the
chosen α = 0 the saved model is the start, and θ_ft could not be recovered from it."""


def _start_state(build: Build) -> dict:
    from prefshift.models.reward import load_reward_model

    start_model, _ = load_reward_model(
        build.start_dir, trust_remote_code=build.params.backbone.trust_remote_code
    )
    return {k: v.detach().cpu() for k, v in start_model.hf.state_dict().items()}


def _grid(model, build: Build, start: dict, tuned: dict, splits: tuple[str, ...]) -> dict[str, list[float]]:
    """Accuracy on each split at every α of the grid; the model is left at the last α. The head
    stays the fine-tuned one at every α (module docstring)."""
    from prefshift.methods.weights import interpolate
    from prefshift.models.reward import head_parameter_names

    keep = head_parameter_names(model)
    curve: dict[str, list[float]] = {split: [] for split in splits}
    for alpha in build.settings.alphas:
        model.hf.load_state_dict(interpolate(start, tuned, alpha, keep))
        for split in splits:
            curve[split].append(build.tools.accuracy(model, split))
    return curve


def interpolate_back(model, build: Build) -> dict:
    """Score every α on ID validation (and, for the record, on id_test); keep the chosen α, and
    θ_ft beside it for the α curve's OOD rows (`on_target`)."""
    from prefshift.methods.weights import interpolate
    from prefshift.models.reward import head_parameter_names

    tuned = {k: v.detach().cpu().clone() for k, v in model.hf.state_dict().items()}
    build.tools.keep(FINE_TUNED, tuned)
    alphas = list(build.settings.alphas)
    start = _start_state(build)
    curve = _grid(model, build, start, tuned, (ID_VALIDATION, *build.tools.heldout_splits()))
    pairs = build.tools.pair_count(ID_VALIDATION)
    chosen = choose_alpha(alphas, curve[ID_VALIDATION], pairs)
    model.hf.load_state_dict(interpolate(start, tuned, chosen, head_parameter_names(model)))
    return {
        "alphas": alphas,
        "accuracy": curve,
        "chosen_alpha": chosen,
        "chosen_on": ID_VALIDATION,
        "rule": "one standard error",
        "validation_pairs": pairs,
        "standard_error": one_standard_error(max(curve[ID_VALIDATION]), pairs),
    }


def alpha_on_target(model, build: Build) -> dict:
    """The α curve's row on the target being scored: the saved model's θ_ft and the start rebuilt
    at every α of the grid (the grid it was trained with: `alphas` is a train param)."""
    tuned = build.tools.kept(FINE_TUNED)
    curve = _grid(model, build, _start_state(build), tuned, build.tools.heldout_splits())
    return {"alphas": list(build.settings.alphas), "accuracy": curve}


METHOD = Method(
    name="wise_ft",
    labels="weak",
    objective=bradley_terry,
    settings=WiseFTSettings,
    prepare=full_weights_only,
    after_training=interpolate_back,
    on_target=alpha_on_target,
)
