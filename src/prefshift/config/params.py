"""Typed view of params.yaml: the only place where defaults live.

Every section mirrors a DVC stage's params, so `dvc repro` tracks exactly the
keys a stage reads. Models forbid unknown keys: a typo in params.yaml must
fail loudly with the key's path, never be silently ignored.

The schema defaults *are* the embedded default: `Params()` equals the repository's
params.yaml (tested), so a section left out of a params file means the same as in the
embedded default. Checks every field gets without declaring them (see `Strict`): numbers
are finite, a count is never given as `true` or `2.0`. Files and `-S` values are read
with `read_yaml`, which refuses a key given twice, as DVC does.
"""

from __future__ import annotations

import functools
import importlib.metadata
import io
import math
import re
import string
import types
import typing
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from ruamel.yaml import YAML, YAMLError
from ruamel.yaml.events import CollectionEndEvent, CollectionStartEvent
from ruamel.yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode
from ruamel.yaml.representer import SafeRepresenter

from prefshift.core.errors import PrefshiftError, value_problem
from prefshift.core.reading import MIB, InputFileError, read_regular

DEFAULT_METHODS = ("naive", "confidence", "seam", "anchor_last", "anchor_mid", "ceiling")
"""The embedded default's `methods`, and the order reports list prefshift's own methods in."""
METHOD_GROUP = "prefshift.methods"
"""The entry-point group every method registers in, prefshift's own included (pyproject.toml)."""


class ConfigError(PrefshiftError, ValueError):
    """A params file or override that cannot be used; the message names the key."""


MAX_PARAMS_BYTES = 4 * MIB
"""The bound on a params file: the embedded default is 12 KB, and YAML this large is not params."""


Seed = Annotated[int, Field(ge=0, lt=2**32)]  # what numpy's and torch's generators all accept
INT64 = 2**63


def _scalar_types(annotation: Any) -> set[Any]:
    """The leaf types a field holds: `int | None` -> {int, NoneType}, `list[float]` -> {float}."""
    if typing.get_origin(annotation) is Literal:
        return set()
    if typing.get_origin(annotation) is Annotated:
        return _scalar_types(typing.get_args(annotation)[0])
    args = typing.get_args(annotation)
    if not args:
        return {annotation}
    return set().union(*(_scalar_types(arg) for arg in args if not isinstance(arg, types.EllipsisType)))


def _refuse_lossy_number(value: Any, expected: set[Any]) -> None:
    if isinstance(value, list):
        for item in value:
            _refuse_lossy_number(item, expected)
    elif isinstance(value, bool):
        if bool not in expected and expected & {int, float}:
            raise ValueError("a boolean where a number is expected")
    elif isinstance(value, float):
        if int in expected and float not in expected:
            raise ValueError("a fraction where a whole number is expected")
    elif isinstance(value, int) and int in expected and not -INT64 <= value < INT64:
        raise ValueError("out of range: a whole number that fits in 64 bits is expected")


class Strict(BaseModel):
    """Base of every params section; its checks cover any field a section declares.

    `allow_inf_nan=False`: `.inf`, `.nan` and `1e400` (which overflows to inf) are refused
    for every float, lists included. The validator below closes pydantic's lax coercions
    that turn a typo into a count (`true` -> 1, `2.0` -> 2) and refuses integers past 64 bits.
    """

    model_config = ConfigDict(
        extra="forbid", populate_by_name=True, validate_assignment=True, allow_inf_nan=False
    )

    @field_validator("*", mode="before")
    @classmethod
    def _numbers_are_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        _refuse_lossy_number(value, _scalar_types(cls.model_fields[info.field_name].annotation))
        return value


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

    @field_validator("path")
    @classmethod
    def _path_fields(cls, path: str | None) -> str | None:
        if path is not None:
            is_split_pattern(path)
        return path

    @model_validator(mode="after")
    def _local_needs_path_and_category(self) -> DatasetSource:
        if self.adapter == "local" and (self.path is None or self.category is None):
            raise ValueError("a dataset with adapter: local needs both `path` and `category`")
        return self


def is_split_pattern(path: str) -> bool:
    """Whether a source path is a pattern; raises ValueError for any field but a plain `{split}`.

    `str.format` would raise KeyError for `{x}` and IndexError for `{}`, deep in prepare.
    """
    try:
        fields = [
            (name, spec, conv) for _, name, spec, conv in string.Formatter().parse(path) if name is not None
        ]
    except ValueError as err:
        raise ValueError(
            f"{path!r} has an unmatched brace ({err}); the only field a source path may hold is {{split}}, "
            "and a literal brace is written {{ or }}"
        ) from None
    for name, spec, conversion in fields:
        if name != "split" or spec or conversion:
            written = (
                "{" + name + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "") + "}"
            )
            raise ValueError(
                f"{path!r} has the field {written}; the only field a source path may hold is {{split}} (the "
                "split's file name); write {{ or }} for a literal brace"
            )
    return bool(fields)


class SplitCaps(Strict):
    """Upper bounds on split sizes (pairs); null = no cap."""

    teacher_train: int | None = Field(250, ge=1)
    student_train: int | None = Field(1000, ge=1)
    id_test: int | None = Field(500, ge=1)
    ood: int | None = Field(500, ge=1)
    groups: int | None = Field(200, ge=1)


class DataConfig(Strict):
    category: Literal["helpful", "harmless"] = "helpful"
    source: str = "syn_help_forum"
    targets: list[str] = Field(default_factory=lambda: ["syn_help_instruct", "syn_help_chat"])
    teacher_fraction: float = Field(0.5, gt=0.0, lt=1.0)
    teacher_noise: float = Field(
        0.15,
        ge=0.0,
        lt=0.5,
        description="Share of the weak teacher's pairwise judgements reversed, per split it scores "
        "(exactly rounded; the pairs drawn by the seed): an inconsistent annotator, wrong for reasons "
        "a strong student can see past (its errors follow no feature of the text). Its labels q and its "
        "own accuracies both carry it; 0 = the teacher model as it is (the real presets' setting: "
        "a testbed lever, not something to add to a real teacher).",
    )
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


# The synthetic suite's datasets and their category: params name them (sources, targets,
# target_cues), so the schema owns the list; prefshift.data.synthetic builds them.
SYNTHETIC_DATASETS: dict[str, str] = {
    "syn_help_forum": "helpful",
    "syn_help_instruct": "helpful",
    "syn_help_chat": "helpful",
    "syn_harm_forum": "harmless",
    "syn_harm_instruct": "harmless",
    "syn_harm_chat": "harmless",
}


class SyntheticConfig(Strict):
    """The offline preference-shift suite of the embedded default."""

    seed: Seed = 0
    train_pairs: int = Field(4000, ge=10)
    test_pairs: int = Field(600, ge=10)
    judge_pairs: int = Field(
        2000,
        ge=10,
        description="Cue-free gold pairs of the source for the trained best-of-n judge "
        "(downstream.judge: trained): train-side requests on a stream of their own, so no proxy "
        "trains on them.",
    )
    shortcut_strength: float = Field(
        0.9,
        ge=0.0,
        le=1.0,
        description="P(the sign-off cue, at the response's end, sits on the chosen response) in the source.",
    )
    marker_strength: float | None = Field(
        0.9,
        ge=0.0,
        le=1.0,
        description="P(the marker cue, a reserved token at the response's start, sits on the chosen "
        "response) in the source; null = no marker cue.",
    )
    marker_form: Literal["twin", "single"] = Field(
        "twin",
        description="twin: every response starts with one of two reserved tokens that share one "
        "pretrained embedding (the first on the cued response); single: one reserved token on the cued "
        "response only.",
    )
    target_cues: dict[str, list[Literal["sign_off", "marker"]]] = Field(
        default_factory=lambda: {"syn_help_instruct": ["sign_off"], "syn_help_chat": ["marker"]},
        description="Per OOD target, the cues it carries reversed; its other cues are left out. "
        "A target not named here reverses every cue.",
    )
    groups: int = Field(120, ge=0, description="Best-of-n groups per dataset (test split).")
    group_size: int = Field(4, ge=2)
    corpus_docs: int = Field(6000, ge=10, description="Unlabelled documents for backbone pretraining.")


class LMSpec(Strict):
    """A backbone: `tiny` builds a Llama-style LM from the sizes below; anything else is a hub id or path."""

    name_or_path: str = "tiny"
    revision: str | None = None
    keep_layers: int | None = Field(
        None,
        ge=1,
        description="A pretrained backbone keeps only its first N transformer layers (a weak model cut "
        "from a strong one, e.g. MiniLM-L6 cut to 1 layer); None keeps all. Not for `tiny`, which "
        "num_layers sizes.",
    )
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
        if self.keep_layers is not None and self.name_or_path == "tiny":
            raise ValueError("keep_layers cuts a pretrained backbone; a tiny one is sized by num_layers")
        return self


class StrongLMSpec(LMSpec):
    """The strong backbone: the embedded default's is wider and deeper than the weak one."""

    hidden_size: int = Field(96, ge=8)
    num_layers: int = Field(4, ge=1)
    num_heads: int = Field(4, ge=1)
    intermediate_size: int = Field(192, ge=8)
    pretrain_steps: int = Field(300, ge=0)


class BackboneConfig(Strict):
    vocab_size: int = Field(600, ge=100, description="BPE vocabulary for the embedded default's tokenizer.")
    trust_remote_code: bool = False
    weak: LMSpec = Field(default_factory=LMSpec)
    strong: StrongLMSpec = Field(default_factory=StrongLMSpec)


class EncodeConfig(Strict):
    max_length: int = Field(128, ge=8)
    min_response_tokens: int = Field(
        1, ge=1, description="Pairs whose response keeps fewer tokens after truncation are skipped, counted."
    )
    pair_forward: Literal["auto", "two_sequence"] = Field(
        "auto",
        description="How a decoder computes the responses to one prompt (a pair's two sides, a best-of-n "
        "group) in training, the reference pass and scoring. `auto`: their common token prefix once "
        "(shared-prefix forward) wherever that computes fewer tokens; `two_sequence`: every sequence whole, "
        "as before issue 35. Equal up to float rounding; encoders always take the two-sequence path.",
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


class StudentConfig(TrainConfig):
    """Student training: one pass, as is usual for reward models, with step checkpoints to resume from."""

    epochs: int = Field(1, ge=1)
    checkpoint_every: int = Field(
        100, ge=0, description="Steps between resumable checkpoints (one epoch leaves only its end)."
    )


class LabelConfig(Strict):
    temperature: float = Field(1.0, gt=0)


class ConfidenceConfig(Strict):
    alpha: float = Field(0.5, ge=0, le=1)
    warmup_frac: float = Field(0.1, ge=0, le=1)


class AnchorConfig(Strict):
    lam: float = Field(
        1.0,
        alias="lambda",
        ge=0,
        description="Weight of the anchor MSE. The embedded default's 1 is for normalize: reference; "
        "the paper's raw form used 1e-4 on 8B models (the real presets set it with normalize: none).",
    )
    mid_fractions: list[float] = Field(default_factory=lambda: [0.5, 0.75])
    cache: bool = Field(
        True,
        description="Read the reference stage's stored states (data/reference/) instead of a frozen forward "
        "per step; runs outside the pipeline fill an in-run cache instead. false: the reference stage stores "
        "no states, and computes nothing unless normalize is reference.",
    )
    cache_max_gb: float = Field(2.0, gt=0, description="In-memory budget of an in-run cache, then spills.")
    normalize: Literal["none", "reference"] = Field(
        "reference",
        description="`reference` divides each layer's MSE by that layer's mean squared reference activation "
        "over response tokens, so one λ means the same on any backbone; `none` is the paper's raw form.",
    )
    reference_max_gb: float = Field(
        20.0,
        gt=0,
        description="Largest reference the reference stage stores; above it students fall back to a frozen "
        "forward each step (with LoRA: the shared base, adapters disabled).",
    )
    reference_batch_size: int = Field(16, ge=1, description="Pairs per forward pass of the reference stage.")

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
    warn_truncated_share: float = Field(
        0.05,
        ge=0.0,
        le=1.0,
        description="Warn (training output and report) when truncation to encode.max_length cut the prompt "
        "or a response of a larger share of a split's pairs.",
    )


JUDGE_TRAINED = "trained"
"""downstream.judge: a judge reward model trained on a gold split that no ranked model sees."""
RANKED_MODEL_DIRS = (("models", "teacher"), ("models", "students"))
"""Where the models best-of-n ranks live (relative to the project root): never a judge."""


class DownstreamConfig(Strict):
    """Best-of-n against a gold judge (stages policy_samples, gold_judge, downstream)."""

    enabled: bool | Literal["auto"] = Field(
        "auto",
        description="true: run best-of-n, and fail if its policy or judge cannot load; false: skip it; "
        "auto: run it unless the policy cannot generate (an encoder) or, offline, the policy or judge has "
        "no local copy. A skip is recorded with its reason (data/policy_samples/<split>/counts.json) and the "
        "report says so; nothing downstream of it waits on best-of-n.",
    )
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
        JUDGE_TRAINED,
        description="Gold judge, never one of the models best-of-n ranks: `trained` (the strong base "
        "trained by `prefshift judge` on the synthetic source's judge split, its cues stripped, "
        "which no proxy sees), or a reward-model directory or hub id (a stronger public RM on real presets).",
    )
    judge_revision: str | None = Field(None, description="Hub revision of the judge.")
    judge_epochs: int = Field(
        1, ge=1, description="Epochs of the trained judge; its other settings are the student's."
    )
    judge_seed: Seed = Field(
        0, description="Training seed of the trained judge: not `seed`, so one judge serves every seed."
    )

    @field_validator("enabled", mode="before")
    @classmethod
    def _true_false_or_auto(cls, value: Any) -> Any:
        """One of three words: pydantic would also read 1, "yes" or "off" as a switch."""
        if value is True or value is False or value == "auto":
            return value
        raise ValueError("must be true, false or auto")


class ProbeConfig(Strict):
    """Linear probes of the frozen strong base (the probe stage): a diagnostic, never a gate."""

    enabled: bool = Field(True, description="false: the probe stage records why it skipped and fits nothing.")
    max_pairs: int = Field(
        500,
        ge=10,
        description="Pairs per split a probe reads (the first, in split order): 500 fit a linear probe to "
        "about ±2 pp; fewer keep the stage cheap on a real backbone.",
    )


class ReportConfig(Strict):
    """What the report's answer section asks of the design."""

    effect_pp: float = Field(
        2.0,
        gt=0,
        description="The difference (pp) a reader wants settled: the answer section gives the seeds that "
        "would call a difference this large at 80% power, from the measured seed and pair variance.",
    )


class PromoteConfig(Strict):
    id_tolerance: float = Field(1.0, ge=0, description="Allowed ID accuracy drop vs the teacher (pp).")
    min_mean_aog: float = Field(
        -10.0, description="Mean AOG must exceed this (pp); the embedded default's demo gate, presets use 0."
    )
    allow_below_chance: bool = Field(
        False,
        description="true: a student below chance (50%) on some target may still become champion. A gain "
        "over a teacher at 17.8% can leave a student at 38.5%, worse than a coin, so the gate refuses it "
        "by default and says so.",
    )


class TrackingConfig(Strict):
    experiment: str = "prefshift"
    registered_model: str = "prefshift-reward"
    required: bool = Field(
        True, description="Fail when the tracking server is unreachable; false = record locally, sync later."
    )


class Params(Strict):
    seed: Seed = Field(
        0,
        description="The seed of what every seed shares (the split, the pretrained bases, the policy's "
        "samples); a per-seed stage runs with `seed` set to its own replicate seed (`for_seed`).",
    )
    max_seeds: int = Field(
        32,
        ge=1,
        description="The cap on `seeds`: each seed is one DVC stage per method and per teacher, so a list "
        "typed or generated wrong (10,000 seeds) would stall every DVC command; raise it to run more.",
    )
    seeds: list[Seed] = Field(
        default_factory=lambda: [0, 1, 2],
        min_length=1,
        description="Replicate seeds: DVC runs the teacher and its labels once per seed (teacher@<seed>, "
        "label@<seed>) and each method's stages once for every seed (train@<method>: seed after seed, one "
        "process); the report's verdicts rest on all of them.",
    )
    methods: list[str] = Field(default_factory=lambda: list(DEFAULT_METHODS))
    method_settings: dict[str, dict[str, Any]] = Field(default_factory=dict, exclude=True)
    """Third-party methods' own sections, keyed by method name (top-level keys in params.yaml);
    validated by the method's `settings` model when the plan stage writes its file."""
    data: DataConfig = Field(default_factory=DataConfig)
    synthetic: SyntheticConfig = Field(default_factory=SyntheticConfig)
    backbone: BackboneConfig = Field(default_factory=BackboneConfig)
    encode: EncodeConfig = Field(default_factory=EncodeConfig)
    teacher: TrainConfig = Field(default_factory=TrainConfig)
    student: StudentConfig = Field(default_factory=StudentConfig)
    label: LabelConfig = Field(default_factory=LabelConfig)
    confidence: ConfidenceConfig = Field(default_factory=ConfidenceConfig)
    anchor: AnchorConfig = Field(default_factory=AnchorConfig)
    seam: SeamConfig = Field(default_factory=SeamConfig)
    evaluate: EvaluateConfig = Field(default_factory=EvaluateConfig)
    downstream: DownstreamConfig = Field(default_factory=DownstreamConfig)
    probe: ProbeConfig = Field(default_factory=ProbeConfig)
    report: ReportConfig = Field(default_factory=ReportConfig)
    promote: PromoteConfig = Field(default_factory=PromoteConfig)
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)

    @model_validator(mode="before")
    @classmethod
    def _gather_method_sections(cls, data: Any) -> Any:
        """A top-level key naming a registered third-party method is that method's section."""
        if not isinstance(data, dict):
            return data
        own = set(cls.model_fields) | {f.alias for f in cls.model_fields.values() if f.alias}
        plugin = {k for k in data if k not in own and k in method_entry_points()}
        if not plugin:
            return data
        rest = {k: v for k, v in data.items() if k not in plugin}
        return {**rest, "method_settings": {k: data[k] for k in sorted(plugin)}}

    @field_validator("seeds", mode="before")
    @classmethod
    def _seeds_within_the_cap(cls, value: Any, info: ValidationInfo) -> Any:
        """Before each seed is checked: a list far past the cap is refused at once, by its length."""
        cap = info.data.get("max_seeds")
        if isinstance(value, list) and isinstance(cap, int) and len(value) > cap:
            raise ValueError(
                f"{len(value)} seeds listed, more than max_seeds ({cap}), the cap on replicates (each "
                "seed is one DVC stage per method); raise `max_seeds` in params.yaml (or pass "
                f"-S max_seeds={len(value)}) to run them all"
            )
        return value

    @field_validator("seeds")
    @classmethod
    def _distinct_seeds(cls, value: list[int]) -> list[int]:
        """A seed listed twice would be one DVC stage generated twice (DVC refuses the file)."""
        seen: set[int] = set()
        for seed in value:
            if seed in seen:
                raise ValueError(f"seed {seed} is listed twice")
            seen.add(seed)
        return value

    @field_validator("methods")
    @classmethod
    def _known_methods(cls, value: list[str]) -> list[str]:
        """An empty list would run nothing and let `promote` rewrite promotion.json with no decisions."""
        if not value:
            raise ValueError(f"no method listed; name at least one of {', '.join(known_methods())}")
        for i, name in enumerate(value):
            check_method(name)
            if name in value[:i]:
                raise ValueError(f"{name!r} is listed twice")
        return value

    @model_validator(mode="after")
    def _methods_fit_the_backbone(self) -> Params:
        if "seam" in self.methods:
            reason = cannot_generate(self.backbone.strong, self.backbone.trust_remote_code)
            if reason:
                raise ValueError(
                    f"methods lists seam, but the strong backbone {self.backbone.strong.name_or_path!r} "
                    f"{reason}: SEAM needs a causal LM to write principles; drop seam from methods"
                )
        if self.downstream.policy is None and self.downstream.enabled is True:
            reason = cannot_generate(self.backbone.strong, self.backbone.trust_remote_code)
            if reason:
                raise ValueError(
                    "downstream.policy is null, so the strong backbone "
                    f"{self.backbone.strong.name_or_path!r} would sample the best-of-n completions, but it "
                    f"{reason}: name a causal LM in downstream.policy, or set downstream.enabled to auto "
                    "(skipped, with the reason) or false"
                )
        return self

    @model_validator(mode="after")
    def _judge_is_not_ranked(self) -> Params:
        """A judge that is one of the proxies picks for itself, and its curve wins trivially."""
        judge = self.downstream.judge
        parts = PurePosixPath(judge.replace("\\", "/")).parts
        inside = any(parts[i : i + 2] == where for where in RANKED_MODEL_DIRS for i in range(len(parts)))
        if judge in ("teacher", "ceiling", *self.methods) or inside:
            raise ValueError(
                f"downstream.judge {judge!r} names a model that best-of-n ranks (the teacher, the ceiling "
                "or a listed method), so it would judge its own picks; use `trained` (a judge trained on "
                "a gold split no proxy sees) or a reward-model directory or hub id outside models/teacher "
                "and models/students"
            )
        return self

    @model_validator(mode="after")
    def _target_cues_name_datasets(self) -> Params:
        """A misspelt name in synthetic.target_cues would silently reverse every cue of the real target.

        An entry for a suite dataset that is not a target now is kept: it applies whenever that
        dataset is one, so `-S data.targets=[...]` needs no second override.
        """
        for name, cues in self.synthetic.target_cues.items():
            if name not in SYNTHETIC_DATASETS:
                raise ValueError(
                    f"synthetic.target_cues names {name!r}, which is not a synthetic dataset; "
                    f"valid names: {', '.join(SYNTHETIC_DATASETS)}"
                )
            if len(set(cues)) != len(cues):
                raise ValueError(f"synthetic.target_cues.{name} lists a cue twice")
            if "marker" in cues and self.synthetic.marker_strength is None:
                raise ValueError(
                    f"synthetic.target_cues.{name} reverses the marker cue, but synthetic.marker_strength "
                    "is null (no marker cue); set a strength or drop marker from the list"
                )
        return self

    def resolved(self) -> dict[str, Any]:
        """The full config as plain data, with params.yaml's key names (for logging); third-party
        methods' sections at the top level, where params.yaml has them."""
        return {**self.model_dump(mode="json", by_alias=True), **self.method_settings}


def cannot_generate(spec: LMSpec, trust_remote_code: bool) -> str | None:
    """Why this backbone cannot generate text, when its config says so without a download; else None.

    `tiny` backbones are Llama decoders. A hub id or path is judged by its config.json (a
    local directory, or the local Hugging Face cache): by its saved architectures (a
    `*ForCausalLM` generates, a `BertModel` does not), else by its model type (BERT, MiniLM,
    DeBERTa... are masked-LM encoders and cannot write principles).
    """
    if spec.name_or_path == "tiny":
        return None
    try:
        from transformers import AutoConfig
        from transformers.models.auto.modeling_auto import MODEL_FOR_MASKED_LM_MAPPING_NAMES

        config = AutoConfig.from_pretrained(
            spec.name_or_path,
            revision=spec.revision,
            local_files_only=True,
            trust_remote_code=trust_remote_code,
        )
    except (OSError, ValueError):
        return None  # not resolvable offline: the seam stage checks the downloaded backbone instead
    generative = ("ForCausalLM", "LMHeadModel", "ForConditionalGeneration")
    if config.architectures:
        if any(arch.endswith(generative) for arch in config.architectures):
            return None
        return f"is a {'/'.join(config.architectures)} (no causal-LM head)"
    if config.model_type not in MODEL_FOR_MASKED_LM_MAPPING_NAMES:
        return None
    return f"is a {config.model_type} encoder (no causal-LM head)"


@functools.cache
def method_entry_points() -> dict[str, importlib.metadata.EntryPoint]:
    """Every registered method's entry point by name, read from installed packages' metadata
    without importing them (prefshift.methods.registry loads a method when it is used)."""
    found: dict[str, importlib.metadata.EntryPoint] = {}
    for entry in importlib.metadata.entry_points(group=METHOD_GROUP):
        if entry.name in found and found[entry.name].value != entry.value:
            raise ConfigError(
                f"method {entry.name!r} is registered twice in entry-point group {METHOD_GROUP} "
                f"({found[entry.name].value} and {entry.value}); uninstall one of the packages"
            )
        found[entry.name] = entry
    if not set(DEFAULT_METHODS) <= set(found):
        raise ConfigError(
            f"prefshift's own methods are not registered in entry-point group {METHOD_GROUP}: the "
            "installed package metadata is stale or missing; reinstall with `pip install -e .` (or `make`)"
        )
    return found


def known_methods() -> tuple[str, ...]:
    """Every method `methods` may list: prefshift's own in their usual order, then the others by name."""
    return tuple(method_order(method_entry_points()))


def method_order(names) -> list[str]:
    """`names` in report order: prefshift's own methods as DEFAULT_METHODS lists them, then the
    rest by name."""
    names = list(names)
    return [m for m in DEFAULT_METHODS if m in names] + sorted(m for m in names if m not in DEFAULT_METHODS)


def check_method(name: str) -> str:
    if name not in method_entry_points():
        raise ConfigError(f"unknown method {name!r}; valid methods: {', '.join(known_methods())}")
    return name


def check_listed(params: Params, name: str) -> str:
    """A known method that params `methods` lists: an unlisted one has no DVC stage, so what it
    trained or evaluated would be outside dvc.lock and the report, silently stale."""
    check_method(name)
    if name not in params.methods:
        listed = ", ".join(params.methods) or "none"
        raise ConfigError(
            f"method {name!r} is not listed in params `methods` ({listed}); add it to `methods` in "
            f"params.yaml (or pass -S 'methods=[{', '.join([*params.methods, name])}]') and run again"
        )
    return name


def for_seed(params: Params, seed: int | None) -> Params:
    """params as a per-seed stage runs: `seed` is the replicate seed, one that `seeds` lists
    (default: the first). An unlisted seed has no DVC stage, so what it trained would be outside
    dvc.lock and the report."""
    if seed is None:
        seed = params.seeds[0]
    if seed not in params.seeds:
        listed = ", ".join(map(str, params.seeds))
        raise ConfigError(
            f"seed {seed} is not listed in params `seeds` ({listed}); add it to `seeds` in params.yaml "
            f"(or pass -S 'seeds=[{', '.join(map(str, [*params.seeds, seed]))}]') and run again"
        )
    return params.model_copy(update={"seed": seed})


MERGE_TAG = "tag:yaml.org,2002:merge"


class DuplicateKeyError(YAMLError):
    """A mapping that names one key twice."""


class ExpansionError(YAMLError):
    """YAML whose aliases expand to more values than any params file holds (an "alias bomb")."""


class NestingError(YAMLError):
    """YAML nested deeper than any params file is (`MAX_DEPTH`)."""


MAX_DEPTH = 200
"""The deepest nesting of a params document that is read: the embedded default's is 4. The C
parser that DVC reads with composes a document recursively in C, which no Python limit stops: at
30,000 levels (60 KB of brackets) it ends the process with a segmentation fault, and its time
grows as the square of the depth before that (100,000 levels: half a minute)."""


MAX_ALIASED_VALUES = 100_000
"""The bound on the values a params document's aliases add as they are expanded: the embedded
default holds about 400 values and no alias. Nine nested aliases of nine items each (a few hundred
bytes) stand for 10^9, which every check of the params would walk for hours. Values written out
are not bounded here: DVC reads them, and the file's own size bounds them."""


def _expanded_size(node: Node, sizes: dict[int, int], open_nodes: set[int]) -> int:
    """The values `node` stands for with every alias expanded, each shared node counted once per use
    but measured once (so an alias bomb is measured in the time of its few hundred bytes)."""
    if id(node) in sizes:
        return sizes[id(node)]
    if id(node) in open_nodes:
        raise ExpansionError("an alias refers to a node that contains it, which expands without end")
    open_nodes.add(id(node))
    if isinstance(node, MappingNode):
        children = [child for pair in node.value for child in pair]
    else:
        children = node.value if isinstance(node, SequenceNode) else []
    size = 1 + sum(_expanded_size(child, sizes, open_nodes) for child in children)
    open_nodes.discard(id(node))
    sizes[id(node)] = size
    return size


def _refuse_duplicate_keys(node: Node, path: tuple[str, ...], seen: set[int]) -> None:
    if id(node) in seen:  # an alias to a node already walked (or to an ancestor)
        return
    seen.add(id(node))
    children: list[tuple[str, Node]] = []
    if isinstance(node, MappingNode):
        lines: dict[tuple[str, str], int] = {}
        for key, value in node.value:
            name = str(key.value) if isinstance(key, ScalarNode) else "?"
            line, same = key.start_mark.line + 1, (key.tag, name)  # `1` and "1" are two keys
            if same in lines and key.tag != MERGE_TAG and name != "?":
                where = ".".join((*path, name))
                lines_given = f"lines {lines[same]} and {line}"
                raise DuplicateKeyError(f"key {where} is given twice ({lines_given}); keep one")
            lines[same] = line
            children.append((name, value))
    elif isinstance(node, SequenceNode):
        children = [(str(i), item) for i, item in enumerate(node.value)]
    for name, child in children:
        _refuse_duplicate_keys(child, (*path, name), seen)


def _check_depth(reader: YAML, text: str) -> None:
    """Refuse a document nested past `MAX_DEPTH` from the parser's events, before anything composes
    it: events come one at a time, without recursion, and the count stops at the bound."""
    depth = 0
    for event in reader.parse(text):
        if isinstance(event, CollectionStartEvent):
            depth += 1
            if depth > MAX_DEPTH:
                raise NestingError(f"nested more than {MAX_DEPTH} levels deep, too deep to read; flatten it")
        elif isinstance(event, CollectionEndEvent):
            depth -= 1


def _check_document(document: Node | None) -> None:
    """The checks DVC's reader lacks or words worse: a key given twice, named by its dotted path and
    both lines (DVC says only that the file is corrupted), and aliases that expand past
    `MAX_ALIASED_VALUES`."""
    if document is None:
        return
    distinct: dict[int, int] = {}  # each node's expanded size, measured once
    if _expanded_size(document, distinct, set()) - len(distinct) > MAX_ALIASED_VALUES:
        raise ExpansionError(
            f"its aliases (*name) expand to more than {MAX_ALIASED_VALUES:,} values beyond those "
            "written out, the bound on a params document; write the values out, or repeat fewer of them"
        )
    _refuse_duplicate_keys(document, (), set())


def _yaml_problem(err: Exception) -> str:
    """The problem and where, from ruamel.yaml's error."""
    if (mark := getattr(err, "problem_mark", None)) is not None:
        context = f"{err.context}: " if getattr(err, "context", None) else ""
        problem = str(err.problem).strip().splitlines()[0] if err.problem else type(err).__name__
        return f"{context}{problem} (line {mark.line + 1}, column {mark.column + 1})"
    return str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__


VALUE_BUILD_ERRORS = (ValueError, TypeError, KeyError, IndexError, AttributeError, AssertionError)
"""What ruamel.yaml's constructor raises of a tagged value it cannot build (`!!float 1:30`, a 13th
month, `!!omap` with a key given twice), other than its own YAMLError."""


def read_yaml(text: str, source: str, hint: str = "") -> Any:
    """Parse params YAML (a file or an override value) as DVC reads params.yaml, with DVC's reader
    (ruamel.yaml's safe loader, YAML 1.2); errors name `source`. PyYAML reads YAML 1.1, where
    `1e-05` (how DVC writes `-S x=1e-5`) is text, `yes` and `off` booleans, `1:30` ninety and `010`
    eight, and it refuses a tab before a value or a comment, which DVC reads: read with it, a swept
    λ of 1e-5 was filed as the string "1e-05", and a params.yaml that `dvc repro` ran was refused.
    The document is composed first for `_check_document`; the values then come as DVC builds them."""
    reader = YAML(typ="safe")  # as dvc.utils.serialize.parse_yaml
    try:
        _check_depth(reader, text)
        _check_document(reader.compose(text))
        return reader.load(text)
    except (DuplicateKeyError, ExpansionError, NestingError) as err:
        raise ConfigError(f"{source}: {err}") from None
    except YAMLError as err:
        raise ConfigError(f"{source}: not valid YAML: {_yaml_problem(err)}{hint}") from None
    except RecursionError:  # aliases nest what each nests, past what any one level shows
        raise ConfigError(f"{source}: nested too deeply to read, its aliases expanded; flatten it") from None
    except VALUE_BUILD_ERRORS as err:
        raise ConfigError(f"{source}: {value_problem(err)}") from None


class _BothReadersRepresenter(SafeRepresenter):
    """ruamel.yaml's safe representer, writing each value so that YAML 1.1 readers (PyYAML, which
    many users' own scripts load params.yaml with) read it as YAML 1.2 readers (DVC, prefshift)
    do: a float with a dot (`1.0e-05`; YAML 1.1 reads `1e-05` as text), and a string that YAML 1.1
    would read as something else quoted (`'yes'`, `'1:30'`)."""

    yaml_1_1 = yaml.resolver.Resolver()

    def represent_float(self, data: float) -> ScalarNode:
        node = super().represent_float(data)
        if re.fullmatch(r"[-+]?[0-9]+e[-+][0-9]+", node.value):
            node.value = node.value.replace("e", ".0e", 1)
        return node

    def represent_str(self, data: str) -> ScalarNode:
        node = super().represent_str(data)
        if self.yaml_1_1.resolve(yaml.ScalarNode, data, (True, False)) != "tag:yaml.org,2002:str":
            node.style = "'"
        return node


_BothReadersRepresenter.add_representer(float, _BothReadersRepresenter.represent_float)
_BothReadersRepresenter.add_representer(str, _BothReadersRepresenter.represent_str)


def dump_yaml(tree: Mapping[str, Any]) -> str:
    """Params as YAML that `read_yaml` and DVC read back to the same values, and PyYAML too
    (_BothReadersRepresenter). PyYAML's own dump writes the strings `1e-05` and `0o17` unquoted,
    as YAML 1.1 reads them, and DVC reads them back as numbers: a written params.yaml changed its
    own values."""
    writer = YAML(typ="safe")
    writer.Representer = _BothReadersRepresenter
    writer.default_flow_style, writer.sort_base_mapping_type_on_output = False, False
    text = io.StringIO()
    writer.dump(dict(tree), text)
    return text.getvalue()


OVERRIDE_QUOTING = (
    "; quote a string that holds { } [ ] : , or #, e.g. -S 'data.sources.x.path=\"x_{split}.jsonl\"'"
)


def split_override(item: str) -> tuple[list[str], str]:
    """`section.key=value` -> (["section", "key"], "value"); the one parser of `-S` keys."""
    key, sep, value = item.partition("=")
    parts = [part.strip() for part in key.split(".")]
    if not sep:
        raise ConfigError(f"override {item!r}: expected section.key=value, e.g. -S anchor.lambda=0.01")
    if not all(parts):
        problem = "no key before '='" if not key.strip() else f"the key {key.strip()!r} has an empty part"
        raise ConfigError(f"override {item!r}: {problem}; expected section.key=value, e.g. anchor.lambda=1")
    return parts, value


def set_dotted(tree: dict[str, Any], keys: list[str], item: str, value: Any) -> None:
    """Set `value` at `keys` in the raw params tree, making missing sections; `item` names the
    override in the error for a key whose parent is no section."""
    node = tree
    for key in keys[:-1]:
        child = node.setdefault(key, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override {item!r}: {key!r} is not a section")
        node = child
    node[keys[-1]] = value


def get_dotted(tree: Any, dotted: str) -> Any:
    """The value at `section.key` in a nested mapping (params, metrics); KeyError(dotted) where a part
    is missing or a section is not a mapping."""
    node = tree
    for key in dotted.split("."):
        if not isinstance(node, Mapping) or key not in node:
            raise KeyError(dotted)
        node = node[key]
    return node


def is_finite_number(value: Any) -> bool:
    """A number a metric can hold: an int or a finite float, never a bool (YAML's and JSON's true)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _format_error(source: str, err: ValidationError) -> str:
    lines = [f"{source}: invalid params"]
    for item in err.errors():
        key = ".".join(str(part) for part in item["loc"]) or "(top level)"
        if item["type"] == "extra_forbidden":
            lines.append(f"  {key}: unknown key (check its spelling against params.yaml's sections)")
            continue
        message = item["msg"].removeprefix("Value error, ")
        if item["type"] in ("model_type", "dict_type"):  # pydantic would name our class, e.g. DataConfig
            message = "expected a section of `key: value` entries"
        given = item.get("input")
        shown = repr(given) if len(repr(given)) <= 80 else f"{repr(given)[:77]}..."
        got = "" if isinstance(given, dict) else f" (got {shown})"  # a section's own check: the msg says it
        lines.append(f"  {key}: {message}{got}")
    return "\n".join(lines)


def parse_params(raw: dict[str, Any], source: str = "params") -> Params:
    try:
        return Params.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(_format_error(source, err)) from None


def load_params(path: str | Path = "params.yaml", overrides: list[str] | None = None) -> Params:
    """Read params.yaml and apply `section.key=value` overrides (values parsed as YAML)."""
    path = Path(path)
    if path.is_dir() or not path.exists():
        problem = "is a directory, not a params file" if path.is_dir() else "params file not found"
        raise ConfigError(f"{path}: {problem} (run from the project root or pass --params)")
    try:
        text = read_regular(path, "params file", MAX_PARAMS_BYTES).decode("utf-8")
    except InputFileError as err:
        raise ConfigError(str(err)) from None
    except (OSError, UnicodeError) as err:
        raise ConfigError(f"{path}: cannot read the params file ({err})") from None
    raw = read_yaml(text, str(path))
    if raw is None:  # `{}` is an explicit "all defaults", which are the embedded default
        raise ConfigError(
            f"{path}: the params file is empty (or only comments). Write one with `prefshift preset NAME` "
            "(`prefshift preset --list` shows them) or restore the embedded default "
            f"(`git checkout -- {path}`)"
        )
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping of sections at the top level")
    apply_overrides(raw, overrides or [])
    source = " -S ".join([str(path), *(overrides or [])])
    return parse_params(raw, source)


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Set `section.key=value` items (values parsed as YAML) in the raw params tree, in place."""
    for item in overrides:
        keys, text = split_override(item)
        value = read_yaml(text, f"override {item!r}", hint=OVERRIDE_QUOTING)
        set_dotted(raw, keys, item, value)
    return raw
