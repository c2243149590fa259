"""GRM: the reward loss plus SFT on the chosen responses through the language-model head, so the
hidden states stay ones the base LM can read (Yang et al., NeurIPS 2024). Decoders only.

The LM head is the start's, frozen. The authors' full fine-tuning trains it with everything else;
frozen, the regulariser can only be met by the backbone's hidden states, which is what GRM
regularises, and a tied head cannot drift along with the student's input embeddings.
"""

from pydantic import BaseModel, ConfigDict, Field

from prefshift.core.errors import PrefshiftError
from prefshift.methods.registry import Build, Method


class GRMError(PrefshiftError, ValueError):
    """GRM asked of a model without a causal-LM head."""


class GRMSettings(BaseModel):
    """Params section `grm`."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    weight: float = Field(
        0.01, ge=0, le=1, description="w in (1 − w)·reward loss + w·regulariser; the authors' default 0.01."
    )
    beta: float = Field(
        0.1, gt=0, description="β in −log σ(β · log p(chosen response)); the authors' default 0.1."
    )


def objective(build: Build):
    from prefshift.methods.grm import GRMObjective

    settings = build.settings
    return GRMObjective(build.name, layers=(build.num_layers,), weight=settings.weight, beta=settings.beta)


def attach_lm_head(model, objective, build: Build) -> None:
    """Copy the start's LM head (read from the base causal LM) into the objective; refuse encoders."""
    from transformers import AutoModelForCausalLM

    from prefshift.models.reward import is_decoder_head

    if not is_decoder_head(model.hf):
        raise GRMError(
            f"{build.name} needs a decoder (a causal LM) as the strong backbone; {build.start_dir} is not one"
        )
    trust = build.params.backbone.trust_remote_code
    base = AutoModelForCausalLM.from_pretrained(
        build.start_dir, trust_remote_code=trust, local_files_only=True
    )
    objective.lm_head = base.get_output_embeddings().weight.detach().clone()
    del base


METHOD = Method(name="grm", labels="weak", objective=objective, settings=GRMSettings, prepare=attach_lm_head)
