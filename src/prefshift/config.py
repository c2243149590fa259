"""Typed view of params.yaml: the only place where defaults live.

Every section mirrors a DVC stage's params, so `dvc repro` tracks exactly the
keys a stage reads. Models forbid unknown keys: a typo in params.yaml must
fail loudly with the key's path, never be silently ignored.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from prefshift.errors import PrefshiftError

METHODS = ("naive", "confidence", "seam", "anchor_last", "anchor_mid", "ceiling")
CATEGORIES = ("helpful", "harmless")


class ConfigError(PrefshiftError, ValueError):
    """A params file or override that cannot be used; the message names the key."""


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, validate_assignment=True)


class DatasetSource(Strict):
    """Where one dataset's raw rows come from; `path` wins over the hub id."""

    path: str | None = Field(None, description="Local file or directory in the source's own format.")
    hf_id: str | None = Field(None, description="Override of the adapter's default Hugging Face id.")
    hf_config: str | None = Field(None, description="Dataset config / subset name on the hub.")
    revision: str | None = Field(None, description="Hub revision (commit sha or tag) for reproducibility.")
    adapter: str | None = Field(
        None,
        description="Adapter to read this entry with; `local` or a built-in name (the key becomes an alias).",
    )
    category: Literal["helpful", "harmless"] | None = Field(
        None, description="Category of a `local` dataset (built-in adapters know their own)."
    )

    @model_validator(mode="after")
    def _local_needs_path_and_category(self) -> DatasetSource:
        if self.adapter == "local" and (self.path is None or self.category is None):
            raise ValueError("a dataset with adapter: local needs both `path` and `category`")
        return self


class SplitCaps(Strict):
    """Upper bounds on split sizes (pairs); null = no cap."""

    teacher_train: int | None = Field(2000, ge=1)
    student_train: int | None = Field(2000, ge=1)
    id_test: int | None = Field(500, ge=1)
    ood: int | None = Field(500, ge=1)
    groups: int | None = Field(200, ge=1)


class DataConfig(Strict):
    category: Literal["helpful", "harmless"] = "helpful"
    source: str = "syn_help_forum"
    targets: list[str] = Field(default_factory=lambda: ["syn_help_instruct", "syn_help_chat"])
    teacher_fraction: float = Field(0.5, gt=0.0, lt=1.0)
    caps: SplitCaps = Field(default_factory=SplitCaps)
    sources: dict[str, DatasetSource] = Field(default_factory=dict)
    pku_keep_same_safety: bool = Field(
        False, description="Keep PKU-SafeRLHF pairs whose two responses share the same safety label."
    )

    @model_validator(mode="after")
    def _source_not_a_target(self) -> DataConfig:
        if self.source in self.targets:
            raise ValueError(f"data.targets must not contain the source dataset {self.source!r}")
        if len(set(self.targets)) != len(self.targets):
            raise ValueError("data.targets lists a dataset twice")
        return self


class SyntheticConfig(Strict):
    """The offline preference-shift suite of the embedded default."""

    seed: int = 0
    train_pairs: int = Field(4000, ge=10)
    test_pairs: int = Field(600, ge=10)
    shortcut_strength: float = Field(
        0.9, ge=0.0, le=1.0, description="P(shortcut cue sits on the chosen response) in the source dataset."
    )
    groups: int = Field(120, ge=0, description="Best-of-n groups per dataset (test split).")
    group_size: int = Field(4, ge=2)
    corpus_docs: int = Field(6000, ge=10, description="Unlabelled documents for backbone pretraining.")


class LMSpec(Strict):
    """A backbone: `tiny` builds a Llama-style LM from the sizes below; anything else is a hub id or path."""

    name_or_path: str = "tiny"
    revision: str | None = None
    hidden_size: int = Field(64, ge=8)
    num_layers: int = Field(1, ge=1)
    num_heads: int = Field(2, ge=1)
    intermediate_size: int = Field(128, ge=8)
    pretrain_steps: int = Field(400, ge=0)
    pretrain_lr: float = Field(3e-3, gt=0)
    pretrain_batch_size: int = Field(32, ge=1)
    pretrain_seq_len: int = Field(128, ge=8)

    @model_validator(mode="after")
    def _heads_divide_hidden(self) -> LMSpec:
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size {self.hidden_size} is not divisible by num_heads {self.num_heads}")
        return self


class BackboneConfig(Strict):
    vocab_size: int = Field(600, ge=100, description="BPE vocabulary for the embedded default's tokenizer.")
    trust_remote_code: bool = False
    weak: LMSpec = Field(default_factory=LMSpec)
    strong: LMSpec = Field(
        default_factory=lambda: LMSpec(
            hidden_size=96, num_layers=4, num_heads=4, intermediate_size=192, pretrain_steps=300
        )
    )


class EncodeConfig(Strict):
    max_length: int = Field(128, ge=8)
    min_response_tokens: int = Field(
        1, ge=1, description="Pairs whose response keeps fewer tokens after truncation are skipped, counted."
    )


class LoraConfig(Strict):
    enabled: bool = False
    r: int = Field(8, ge=1)
    alpha: int = Field(16, ge=1)
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    target_modules: list[str] | None = None


class TrainConfig(Strict):
    batch_size: int = Field(8, ge=1, description="Pairs per optimizer micro-step (per process).")
    grad_accum: int = Field(1, ge=1)
    epochs: int = Field(2, ge=1)
    lr: float = Field(5e-4, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    warmup_frac: float = Field(0.1, ge=0, lt=1)
    max_grad_norm: float = Field(1.0, gt=0)
    precision: Literal["auto", "fp32", "bf16"] = "auto"
    gradient_checkpointing: bool = False
    lora: LoraConfig = Field(default_factory=LoraConfig)
    checkpoint_every: int = Field(0, ge=0, description="Steps between resumable checkpoints; 0 = per epoch.")
    log_every: int = Field(10, ge=1)
    drift_every: int = Field(25, ge=1)
    probe_size: int = Field(16, ge=1, description="Pairs in the fixed batch used to measure drift.")


class LabelConfig(Strict):
    temperature: float = Field(1.0, gt=0)


class ConfidenceConfig(Strict):
    alpha: float = Field(0.5, ge=0, le=1)
    warmup_frac: float = Field(0.1, ge=0, le=1)


class AnchorConfig(Strict):
    lam: float = Field(1e-4, alias="lambda", ge=0, description="Weight of the anchor MSE.")
    mid_fractions: list[float] = Field(default_factory=lambda: [0.5, 0.75])
    cache: bool = Field(True, description="Cache reference hidden states instead of a second forward pass.")
    cache_max_gb: float = Field(2.0, gt=0, description="In-memory budget of the cache before it spills.")

    @field_validator("lam", mode="before")
    @classmethod
    def _finite(cls, value: Any) -> Any:
        if isinstance(value, float) and value != value:
            raise ValueError("anchor.lambda is NaN")
        return value

    @field_validator("mid_fractions")
    @classmethod
    def _fractions(cls, value: list[float]) -> list[float]:
        if not value or any(not 0 < f <= 1 for f in value):
            raise ValueError("anchor.mid_fractions needs fractions of depth in (0, 1]")
        return value


class SeamConfig(Strict):
    max_new_tokens: int = Field(48, ge=1)
    max_principles: int = Field(4, ge=1)
    keep_top_k: int = Field(2, ge=1, description="Principle nodes kept per pair, by weak confidence.")
    weighting: Literal["confidence", "entropy"] = "entropy"
    include_plain: bool = Field(True, description="Also score the pair without a principle, as one node.")
    principle_position: Literal["last_user", "system"] = Field(
        "last_user",
        description="Where the teacher reads a principle: preamble of the last user turn, or a system turn.",
    )
    principle_context: Literal["request", "conversation"] = Field(
        "request", description="What the strong LM sees: the final user turn, or the whole conversation."
    )
    generation_batch_size: int = Field(64, ge=1, description="Prompts per batched `generate` call.")
    max_context_tokens: int = Field(
        256, ge=8, description="Conversation tokens (the most recent) shown to the strong LM per prompt."
    )


class EvaluateConfig(Strict):
    batch_size: int = Field(32, ge=1)
    bootstrap: int = Field(1000, ge=10)
    ci: float = Field(0.95, gt=0.5, lt=1.0)
    ece_bins: int = Field(10, ge=2)


class DownstreamConfig(Strict):
    """Best-of-n against a gold judge (stages policy_samples, gold_judge, downstream@M)."""

    prompts: int = Field(32, ge=1, description="Prompts per split (ID test and each OOD target).")
    n_max: int = Field(8, ge=2, description="Completions per prompt; best-of-n for n = 1, 2, 4, ..., n_max.")
    policy: str | None = Field(
        None, description="Policy LM (hub id or directory); null = the strong base LM, models/base/strong."
    )
    policy_revision: str | None = Field(None, description="Hub revision of the policy LM.")
    max_new_tokens: int = Field(32, ge=1)
    temperature: float = Field(1.0, gt=0, description="Sampling temperature of the policy.")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling mass (1 = plain sampling).")
    generation_batch_size: int = Field(32, ge=1, description="Prompts per `generate` call (x n_max rows).")
    judge: str = Field(
        "ceiling",
        description="Gold judge: `ceiling` (models/students/ceiling, a proxy for human gold), or a "
        "reward-model directory or hub id.",
    )
    judge_revision: str | None = Field(None, description="Hub revision of the judge.")


class PromoteConfig(Strict):
    id_tolerance: float = Field(1.0, ge=0, description="Allowed ID accuracy drop vs the teacher (pp).")
    min_mean_aog: float = Field(0.0, description="Mean AOG must exceed this (pp).")


class TrackingConfig(Strict):
    experiment: str = "prefshift"
    registered_model: str = "prefshift-reward"
    required: bool = Field(
        True, description="Fail when the tracking server is unreachable; false = record locally, sync later."
    )


class Params(Strict):
    seed: int = 0
    seeds: list[int] = Field(default_factory=lambda: [0])
    methods: list[str] = Field(default_factory=lambda: list(METHODS))
    data: DataConfig = Field(default_factory=DataConfig)
    synthetic: SyntheticConfig = Field(default_factory=SyntheticConfig)
    backbone: BackboneConfig = Field(default_factory=BackboneConfig)
    encode: EncodeConfig = Field(default_factory=EncodeConfig)
    teacher: TrainConfig = Field(default_factory=TrainConfig)
    student: TrainConfig = Field(default_factory=TrainConfig)
    label: LabelConfig = Field(default_factory=LabelConfig)
    confidence: ConfidenceConfig = Field(default_factory=ConfidenceConfig)
    anchor: AnchorConfig = Field(default_factory=AnchorConfig)
    seam: SeamConfig = Field(default_factory=SeamConfig)
    evaluate: EvaluateConfig = Field(default_factory=EvaluateConfig)
    downstream: DownstreamConfig = Field(default_factory=DownstreamConfig)
    promote: PromoteConfig = Field(default_factory=PromoteConfig)
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)

    @field_validator("methods")
    @classmethod
    def _known_methods(cls, value: list[str]) -> list[str]:
        for name in value:
            check_method(name)
        return value

    def resolved(self) -> dict[str, Any]:
        """The full config as plain data, with params.yaml's key names (for logging)."""
        return self.model_dump(mode="json", by_alias=True)


def check_method(name: str) -> str:
    if name not in METHODS:
        raise ConfigError(f"unknown method {name!r}; valid methods: {', '.join(METHODS)}")
    return name


def _set_dotted(tree: dict[str, Any], dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    node = tree
    for key in keys[:-1]:
        child = node.setdefault(key, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override {dotted!r}: {key!r} is not a section")
        node = child
    node[keys[-1]] = value


def _format_error(source: str, err: ValidationError) -> str:
    lines = [f"{source}: invalid params"]
    for item in err.errors():
        key = ".".join(str(part) for part in item["loc"]) or "<root>"
        if item["type"] == "extra_forbidden":
            lines.append(f"  {key}: unknown key (check its spelling against params.yaml's sections)")
        else:
            lines.append(f"  {key}: {item['msg']} (got {item.get('input')!r})")
    return "\n".join(lines)


def parse_params(raw: dict[str, Any], source: str = "params") -> Params:
    try:
        return Params.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(_format_error(source, err)) from None


def load_params(path: str | Path = "params.yaml", overrides: list[str] | None = None) -> Params:
    """Read params.yaml and apply `section.key=value` overrides (values parsed as YAML)."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"{path}: params file not found (run from the project root or pass --params)")
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML: {err}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping of sections at the top level")
    apply_overrides(raw, overrides or [])
    return parse_params(raw, str(path))


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Set `section.key=value` items (values parsed as YAML) in the raw params tree, in place."""
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r}: expected section.key=value")
        key, value = item.split("=", 1)
        _set_dotted(raw, key.strip(), yaml.safe_load(value))
    return raw
