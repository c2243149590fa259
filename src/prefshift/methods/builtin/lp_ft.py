"""LP-FT: train the reward head on the frozen base first, then fine-tune everything from there
(Kumar et al., ICLR 2022, "Fine-Tuning can Distort Pretrained Features and Underperform
Out-of-Distribution"): a trained head sends small gradients into the features, so they distort less."""

from pydantic import BaseModel, ConfigDict, Field

from prefshift.methods.builtin.linear_probe import freeze_backbone
from prefshift.methods.registry import Build, Method, bradley_terry


class LPFTSettings(BaseModel):
    """Params section `lp_ft`: the linear-probe phase. The fine-tuning phase is `student`'s."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    probe_epochs: int = Field(
        1, ge=1, strict=True, description="Epochs of the head-only phase over the student's targets."
    )
    probe_lr: float = Field(
        1e-3,
        gt=0,
        description="Learning rate of the head-only phase. Kumar et al. fit the probe to convergence "
        "(logistic regression); a few epochs at a head-sized rate stand in for that here.",
    )


def probe_first(model, objective, build: Build) -> None:
    """The head-only phase, as a resumable run of its own; then every weight trains again."""
    freeze_backbone(model, objective, build)
    settings = build.settings
    cfg = build.params.student.model_copy(update={"epochs": settings.probe_epochs, "lr": settings.probe_lr})
    build.tools.train(model, bradley_terry(build), cfg, "probe")
    for param in model.hf.parameters():
        param.requires_grad = True


METHOD = Method(
    name="lp_ft", labels="weak", objective=bradley_terry, settings=LPFTSettings, prepare=probe_first
)
