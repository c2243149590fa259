"""Ready-made params for real runs, as overlays on the embedded default.

A preset is a YAML file in this package with `description`, `params` (a partial
params tree), and optionally `extends` (partials named `_*.yaml`, applied first, in
order) and `notes` (advice copied as comments into the written params.yaml). Resolution
always starts from the embedded default, never from the current params.yaml, so a
preset means the same on every machine; `-S` overrides come last, which is how a user
points a preset at local model directories and data files without editing it.

The written file's header states what the params run (models, data, sizes, methods, the
optional stages) from the final values, overrides included: a template's prose would go
stale the moment `-S` changes a model or a dataset. So notes hold only advice that no
override can falsify, and a params file is never replaced without `--force`.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from prefshift.config.params import (
    ConfigError,
    DataConfig,
    LMSpec,
    Params,
    apply_overrides,
    dump_yaml,
    parse_params,
    read_yaml,
)
from prefshift.core.atomic import write_text

PARTIAL_PREFIX = "_"
FILE_KEYS = ("description", "extends", "notes", "params")
LOCAL_HINT = (
    "-S backbone.weak.name_or_path=DIR -S backbone.strong.name_or_path=DIR -S data.sources.NAME.path=FILE "
    "-S downstream.policy=DIR (a causal LM for best-of-n; without one it is skipped offline)"
)


@dataclass(frozen=True)
class Preset:
    name: str
    description: str
    overlay: dict[str, Any]
    notes: tuple[str, ...]
    files: tuple[str, ...]


def _available(partials: bool) -> list[str]:
    files = (ref.name for ref in resources.files(__name__).iterdir())
    stems = [f.removesuffix(".yaml") for f in files if f.endswith(".yaml")]
    return sorted(s for s in stems if s.startswith(PARTIAL_PREFIX) == partials)


def names() -> list[str]:
    """Presets a user can apply (partials excluded)."""
    return _available(partials=False)


def deep_merge(base: dict[str, Any], overlay: dict[str, Any]) -> dict[str, Any]:
    """Mappings merge key by key; anything else in `overlay` (lists, scalars, null) replaces."""
    merged = dict(base)
    for key, value in overlay.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _read(name: str, partial: bool) -> dict[str, Any]:
    if name not in _available(partial):
        kind = "partial" if partial else "preset"
        raise ConfigError(f"unknown {kind} {name!r}; available: {', '.join(_available(partial))}")
    filename = f"{name}.yaml"
    text = (resources.files(__name__) / filename).read_text(encoding="utf-8")
    data = read_yaml(text, f"presets/{filename}") or {}
    if not isinstance(data, dict):
        raise ConfigError(f"presets/{filename}: expected a mapping with keys {', '.join(FILE_KEYS)}")
    unknown = sorted(set(data) - set(FILE_KEYS))
    if unknown:
        raise ConfigError(f"presets/{filename}: unknown keys {unknown}; allowed: {', '.join(FILE_KEYS)}")
    if not isinstance(data.get("params", {}), dict):
        raise ConfigError(f"presets/{filename}: `params` must be a mapping of params.yaml sections")
    return data


def _load(name: str, chain: tuple[str, ...]) -> Preset:
    if name in chain:
        raise ConfigError(f"preset {name!r} extends itself: {' -> '.join((*chain, name))}")
    data = _read(name, partial=bool(chain))
    extends = data.get("extends", [])
    overlay: dict[str, Any] = {}
    notes: list[str] = []
    files: list[str] = []
    for parent in [extends] if isinstance(extends, str) else extends:
        base = _load(parent, (*chain, name))
        overlay = deep_merge(overlay, base.overlay)
        notes.extend(base.notes)
        files.extend(base.files)
    notes.extend(str(note) for note in data.get("notes", []))
    files.append(f"{name}.yaml")
    return Preset(
        name=name,
        description=str(data.get("description", "")),
        overlay=deep_merge(overlay, data.get("params") or {}),
        notes=tuple(notes),
        files=tuple(files),
    )


def load(name: str) -> Preset:
    """A preset with its partials merged in (not yet applied to the default)."""
    return _load(name, ())


def resolve(name: str, overrides: list[str] | None = None) -> tuple[Preset, Params]:
    """Embedded default ← preset overlay ← `section.key=value` overrides, validated."""
    preset = load(name)
    raw = deep_merge(Params().resolved(), preset.overlay)
    apply_overrides(raw, overrides or [])
    return preset, parse_params(raw, f"preset {name!r}")


def _model(spec: LMSpec) -> str:
    cut = f" cut to its first {spec.keep_layers} layer(s)" if spec.keep_layers is not None else ""
    return spec.name_or_path + (f"@{spec.revision}" if spec.revision else "") + cut


def _dataset(name: str, data: DataConfig) -> str:
    source = data.sources.get(name)
    return f"{name} ({source.path})" if source is not None and source.path else name


def _anchor_line(params: Params) -> str | None:
    if not any(m.startswith("anchor_") for m in params.methods):
        return None
    anchor, lora = params.anchor, params.student.lora.enabled
    if anchor.cache:
        route = "stored once by the reference stage and read by every anchor student (anchor.cache)"
    else:
        route = "a frozen forward each step" + (" (the base with adapters disabled)" if lora else "")
    return f"anchor: lambda {anchor.lam:g}, normalize {anchor.normalize}; reference states: {route}"


def _best_of_n_line(params: Params) -> str:
    cfg = params.downstream
    if cfg.enabled is False:
        return "best-of-n: off (downstream.enabled: false)"
    policy = cfg.policy or f"the strong base {params.backbone.strong.name_or_path}"
    line = (
        f"best-of-n: policy {policy}, {cfg.n_max} samples for each of {cfg.prompts} prompts per split, "
        f"judge {cfg.judge}"
    )
    if cfg.enabled == "auto":
        line += "; skipped with its reason if the policy cannot generate or, offline, has no local copy"
    return line


def _benchmark_line(params: Params) -> str | None:
    from prefshift.data.adapters import get_adapter

    scored = [t for t in params.data.targets if getattr(get_adapter(t, params), "benchmark", "")]
    if not scored:
        return None
    sample = (
        "; with data.caps.ood set each is a seeded sample of its pairs, so set caps.ood: null for the "
        "leaderboard's number"
        if params.data.caps.ood is not None
        else ""
    )
    return f"benchmark targets {', '.join(scored)} are also scored by their benchmark's own rule{sample}"


def describe(params: Params) -> list[str]:
    """What these params run, one line per concern, stated from their own values."""
    data = params.data
    caps = {k: "all" if v is None else v for k, v in data.caps.model_dump().items()}
    students = "LoRA adapters" if params.student.lora.enabled else "full fine-tuning"
    lines = [
        f"weak teacher: {_model(params.backbone.weak)}; strong student: {_model(params.backbone.strong)}",
        f"data ({data.category}): source {_dataset(data.source, data)}; OOD targets "
        + ", ".join(_dataset(t, data) for t in data.targets),
        f"pairs: teacher_train {caps['teacher_train']}, student_train {caps['student_train']}, "
        f"id_test {caps['id_test']}, ood {caps['ood']} per target; "
        f"encode.max_length {params.encode.max_length}",
        f"methods: {', '.join(params.methods)}; teacher {params.teacher.epochs} epoch(s), students "
        f"{params.student.epochs} epoch(s), {students}",
        _anchor_line(params),
        _best_of_n_line(params),
        f"probe: {params.probe.max_pairs} pairs per split" if params.probe.enabled else "probe: off",
        _benchmark_line(params),
    ]
    return [line for line in lines if line]


def render(name: str, overrides: list[str] | None = None) -> str:
    """The params.yaml text: a comment header saying where it came from and what it runs, then every key."""
    preset, params = resolve(name, overrides)
    command = " ".join(["prefshift preset", name, *(f"-S {item}" for item in overrides or [])])
    layers = f"presets/{', '.join(preset.files)}" + (", then the -S overrides" if overrides else "")
    header = [
        f"Generated by `{command}`:",
        f"the embedded default overlaid with {layers}. These params run:",
        *(f"- {line}" for line in describe(params)),
        *(["Notes:"] if preset.notes else []),
        *(f"- {note}" for note in preset.notes),
        f"Offline with local copies: {LOCAL_HINT}",
    ]
    comments = "".join(f"# {line}\n" for text in header for line in text.splitlines())
    return comments + dump_yaml(params.resolved())


def write(
    name: str, out: str | Path = "params.yaml", overrides: list[str] | None = None, force: bool = False
) -> Path:
    """Write the preset's params file; an existing file is replaced only with `force`."""
    out = Path(out)
    if out.is_dir():
        raise ConfigError(f"--out {out}: is a directory; name the file to write, e.g. {out / 'params.yaml'}")
    text = render(name, overrides)  # a bad preset or override fails before anything is checked on disk
    if out.exists() and not force:
        raise ConfigError(
            f"--out {out}: exists; pass --force to replace it (or name another file with --out)"
        )
    write_text(out, text, force=force)
    return out


def print_catalogue() -> None:
    table = Table("preset", "description", title="prefshift presets (apply with: prefshift preset NAME)")
    for name in names():
        table.add_row(name, load(name).description)
    Console().print(table)
