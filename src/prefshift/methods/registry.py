"""The method registry: every training method, built-in or a researcher's own, declared once.

A method is one module that exposes a `Method`: its name, what it trains on, the params it
reads, how to build its objective and any step after training. prefshift's own methods and
third-party ones register the same way, through the Python entry-point group
`prefshift.methods` (see pyproject.toml): `my_method = "my_package.my_method:METHOD"`.
Plan, targets, train, the reference stage, report, promote, sweep and the params schema
all read this registry, so adding a method touches no prefshift file.

A third-party method's own params live in a top-level section named after the method,
validated by its `settings` model; built-in methods read the sections params.yaml already has.

The contract is checked where a method is registered (`_load`), before any stage uses it: its
name is one safe path component (it names folders under data/, models/ and reports/), `labels`
is one of the known sources, `settings` is a pydantic model, the hooks are callables. A
plug-in's objective factory and hooks run through `call_hook`: whatever they raise becomes one
line naming the method, its package and the hook, so the CLI's boundary prints it (exit 2).
"""

from __future__ import annotations

import functools
import importlib.metadata
import re
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, get_args

from pydantic import BaseModel, ValidationError

from prefshift.config.params import ConfigError, Params, check_method, method_entry_points

if TYPE_CHECKING:
    from prefshift.config.params import TrainConfig
    from prefshift.methods.base import Objective
    from prefshift.models.reward import RewardModel

LabelSource = Literal["gold", "weak", "seam"]
SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
"""A method name: one path component that is never hidden, `..`, an option (`-x`) or a DVC
foreach key with dots, at most 64 characters."""
ANCHOR_KINDS = (None, "last", "mid")


class MethodError(ConfigError):
    """A registered method that cannot be loaded or is declared wrongly; the message names it."""


ID_VALIDATION = "id_validation"
"""The split a method may tune on: teacher_train with its gold labels. It is the source
distribution, the student never trains on it, it is disjoint from id_test, and its labels are
the ones the weak-to-strong setting already grants (the teacher learnt from them)."""


class Tools(Protocol):
    """What the stage side lends a method's hooks. Methods sit below the engine and the pipeline
    and may not import them, so training and scoring come in through this."""

    def train(self, model: RewardModel, objective: Objective, cfg: TrainConfig, phase: str) -> dict:
        """Run the training loop on the method's targets with `cfg`, as a resumable run of its
        own (`phase` names its checkpoint); returns its log."""

    def accuracy(self, model: RewardModel, split: str) -> float:
        """Pairwise accuracy (%) of `model` on ID_VALIDATION, id_test or an OOD target."""

    def pair_count(self, split: str) -> int:
        """How many pairs `split` holds (ID_VALIDATION: the validation pairs), e.g. for a binomial SE."""

    def heldout_splits(self) -> tuple[str, ...]:
        """The splits to record (never to choose on): id_test while training (no OOD target:
        training is zero-shot and never reads one); the one target being scored in `on_target`."""

    def keep(self, name: str, state: dict) -> None:
        """Save tensors beside the trained model (`<name>.safetensors` in its directory), for a
        later stage that scores it (`on_target`); while training only."""

    def kept(self, name: str) -> dict:
        """The tensors `keep` saved beside the model being scored; in `on_target` only."""


@dataclass(frozen=True)
class Build:
    """What a method's hooks are given: its name, the whole params, its own validated settings
    (None for a method without a section), the model's layer count, the starting checkpoint and,
    inside a stage, the stage's tools."""

    name: str
    params: Params
    settings: BaseModel | None
    num_layers: int
    start_dir: Path | None = None
    tools: Tools | None = None


@dataclass(frozen=True)
class Method:
    """One training method, as the pipeline sees it."""

    name: str
    """What `methods` in params.yaml and `--method` call it; also its DVC stage suffix."""
    labels: LabelSource
    """What it trains on: gold labels, the weak teacher's soft labels q, or SEAM's labels."""
    objective: Callable[[Build], Objective]
    """Builds its training objective (a `prefshift.methods.base.Objective`); import torch inside."""
    settings: type[BaseModel] | None = None
    """The method's own params section, a pydantic model (a description per field), read from
    the top-level params key named after the method (new built-in methods use it too)."""
    sections: tuple[str, ...] = ()
    """Built-in params sections its training reads beyond the shared ones (seed, encode, student)."""
    target_sections: tuple[str, ...] = ()
    """Params sections that shape its targets beyond the teacher's labels (SEAM writes its own)."""
    anchor_kind: str | None = None
    """`last` or `mid` for a method that reads the reference stage's stored states."""
    prepare: Callable[[RewardModel, Objective, Build], None] | None = None
    """A step on the loaded start before training: freeze parts, train a head first, bind the
    objective to the start's weights."""
    after_training: Callable[[RewardModel, Build], dict | None] | None = None
    """A step on the trained model before it is saved and scored (weight averaging...); what it
    returns is kept in the training log."""
    on_target: Callable[[RewardModel, Build], dict] | None = None
    """What the method records on a target when its saved model is scored there (`score-target`),
    beside the scores (WiSE-FT: accuracy at every α of its grid). Training reads no target, so a
    record that spans targets (an α curve's OOD rows) is made here, one target at a time."""


def bradley_terry(build: Build) -> Objective:
    """Bradley-Terry on the method's soft targets, whatever their source: the teacher's, the
    ceiling's, naive's and SEAM's objective."""
    from prefshift.methods.base import Objective

    return Objective(build.name)


TEACHER = Method(name="teacher", labels="gold", objective=bradley_terry)
"""The weak teacher: trained by `prefshift teacher` on gold labels, never listed in `methods`."""


def _load(entry: importlib.metadata.EntryPoint) -> Method:
    package = _package_of(entry) or "an unknown package"
    where = f"entry point {entry.name} = {entry.value!r} of {package} (group prefshift.methods)"
    try:
        method = entry.load()
    except Exception as err:  # a plug-in's import error can be of any type
        raise MethodError(f"{where}: cannot be loaded ({_raised(err)})") from None
    if not isinstance(method, Method):
        raise MethodError(f"{where}: is a {type(method).__name__}, not a prefshift.methods.registry.Method")
    if method.name != entry.name:
        raise MethodError(f"{where}: declares name {method.name!r}; the entry point and Method must agree")
    problem = contract_problem(method)
    if problem:
        raise MethodError(f"{where}: {problem}")
    return method


def contract_problem(method: Method) -> str | None:
    """What in `method`'s declaration breaks the contract the stages rely on, or None."""
    if not isinstance(method.name, str) or not SAFE_NAME.fullmatch(method.name):
        return (
            f"name {method.name!r} is not one safe path component (letters, digits, '_' and '-', starting "
            "with a letter or digit, at most 64): it names the method's folders under data/, models/ and "
            "reports/"
        )
    if method.labels not in get_args(LabelSource):
        return f"labels {method.labels!r} is not one of {', '.join(get_args(LabelSource))}"
    if method.settings is not None and not (
        isinstance(method.settings, type) and issubclass(method.settings, BaseModel)
    ):
        return (
            f"settings {method.settings!r:.80} is not a pydantic model class (a BaseModel subclass) or None"
        )
    if not callable(method.objective):
        return f"objective {method.objective!r:.80} is not a callable that builds an Objective"
    for hook in ("prepare", "after_training", "on_target"):
        if getattr(method, hook) is not None and not callable(getattr(method, hook)):
            return f"{hook} {getattr(method, hook)!r:.80} is not a callable or None"
    if method.anchor_kind not in ANCHOR_KINDS:
        return f"anchor_kind {method.anchor_kind!r} is not one of last, mid or None"
    for field_name in ("sections", "target_sections"):
        value = getattr(method, field_name)
        if not isinstance(value, tuple) or not all(isinstance(v, str) for v in value):
            return f"{field_name} {value!r:.80} is not a tuple of params section names"
    return None


def _package_of(entry: importlib.metadata.EntryPoint) -> str | None:
    dist = entry.dist
    return None if dist is None else f"{dist.name} {dist.version}"


def _raised(err: BaseException) -> str:
    """`Type: message (at file:line in function)`: where a plug-in's code failed, in one line."""
    frames = [f for f in traceback.extract_tb(err.__traceback__) if not f.filename.startswith("<frozen")]
    at = f" (at {Path(frames[-1].filename).name}:{frames[-1].lineno} in {frames[-1].name})" if frames else ""
    said = " ".join(str(err).split())[:300]
    return f"{type(err).__name__}: {said}{at}"


def call_hook(method: Method, hook: str, function: Callable[..., Any], *args: Any) -> Any:
    """Run a method's objective factory or hook. A third-party method's failure becomes one
    MethodError naming the method, its package and the hook; prefshift's own methods' failures
    keep their tracebacks (a bug in prefshift, not in an input)."""
    package = distribution(method.name)
    try:
        result = function(*args)
    except Exception as err:
        if package is None:
            raise
        raise MethodError(
            f"method {method.name} (package {package}): its {hook} failed: {_raised(err)}"
        ) from None
    return result


def objective_of(method: Method, built: Build) -> Objective:
    """The method's training objective from its factory, checked to be an Objective."""
    from prefshift.methods.base import Objective

    objective = call_hook(method, "objective factory", method.objective, built)
    if not isinstance(objective, Objective):
        package = distribution(method.name) or "prefshift"
        raise MethodError(
            f"method {method.name} (package {package}): its objective factory returned a "
            f"{type(objective).__name__}, not a prefshift.methods.base.Objective"
        )
    return objective


@functools.cache
def _loaded(name: str) -> Method:
    if name == "teacher":
        return TEACHER
    return _load(method_entry_points()[name])


def get(name: str) -> Method:
    """The registered method `name` (or the teacher's), loading its module on first use."""
    if name != "teacher":
        check_method(name)
    return _loaded(name)


def distribution(name: str) -> str | None:
    """'package version' of a third-party method, None for prefshift's own (and the teacher)."""
    entry = method_entry_points().get(name)
    if entry is None or entry.dist is None or entry.dist.name == "prefshift":
        return None
    return _package_of(entry)


def settings_of(method: Method, params: Params) -> BaseModel | None:
    """A third-party method's settings, validated; errors name the params key."""
    raw: Any = params.method_settings.get(method.name)
    if method.settings is None:
        if raw is not None:
            raise ConfigError(f"params section {method.name}: {method.name} takes no settings; remove it")
        return None
    package = distribution(method.name)
    try:
        return method.settings.model_validate(raw or {})
    except ValidationError as err:
        first = err.errors()[0]
        key = ".".join(str(p) for p in (method.name, *first["loc"]))
        owner = f" (settings of method {method.name}, package {package})" if package else ""
        raise ConfigError(f"params key {key}: {first['msg']}{owner}") from None
    except Exception as err:  # a plug-in's own validator raised something else
        if package is None:
            raise
        raise MethodError(
            f"method {method.name} (package {package}): its settings model failed on params section "
            f"{method.name}: {_raised(err)}"
        ) from None


def build(
    name: str, params: Params, num_layers: int, start_dir: Path | None = None, tools: Tools | None = None
) -> Build:
    """The hooks' argument for `name` under `params`."""
    return Build(name, params, settings_of(get(name), params), num_layers, start_dir, tools)
