"""The one check a model directory passes before any stage trusts it.

transformers reports an empty or half-copied directory as a missing hub repository (and
offline, as "no local copy exists"), or crashes deep inside loading. Here a local
directory is checked for what every prefshift model needs — a readable config.json,
weights whose headers parse, a tokenizer — and each missing piece is named. Scoring also
needs a *trained* reward head: a causal-LM backbone loads as a sequence classifier with a
random head, which scores without complaint and means nothing. So `save_reward_model`
records `prefshift_trained_reward_head` in config.json (a plain config key: it survives
the registry, `prefshift pull` and plain Hugging Face loading and saving), and scoring
refuses a model without it.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from prefshift.core.errors import JSON_TOO_DEEP, PrefshiftError, json_problem

TRAINED_HEAD_KEY = "prefshift_trained_reward_head"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "spiece.model")
WEIGHT_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")


class ModelLoadError(PrefshiftError):
    """A backbone or reward model that cannot be found or loaded."""


def looks_local(name_or_path: str | Path) -> bool:
    """A local path, not a hub id (`org/name`): it exists, is spelled as a path, or its first part exists.

    `models/nope` is a path when ./models exists; `nope/`, `./x`, `/x`, `~/x` and
    anything with two slashes cannot be hub ids at all.
    """
    text = str(name_or_path)
    if Path(text).expanduser().exists() or text.startswith((".", "/", "~")) or text.endswith(("/", os.sep)):
        return True
    parts = text.split("/")
    return len(parts) > 2 or (len(parts) == 2 and Path(parts[0]).is_dir())


def check_source(name_or_path: str | Path) -> Path | None:
    """The validated local directory, or None for a hub id (checked when it is fetched)."""
    if not looks_local(name_or_path):
        return None
    path = Path(str(name_or_path)).expanduser()
    if not path.exists():
        raise ModelLoadError(
            f"model directory {name_or_path} does not exist (a local path, not a hub id; did its stage run?)"
        )
    check_model_dir(path)
    return path


def check_model_dir(path: Path) -> None:
    """Raise naming what is missing or unreadable: config.json, the weights, the tokenizer files."""

    def fail(problem: str) -> ModelLoadError:
        return ModelLoadError(
            f"model directory {path} {problem}; re-run the stage that wrote it, or point at a complete "
            "Hugging Face model directory"
        )

    if not path.is_dir():
        raise fail("is a file, not a directory")
    names = {p.name for p in path.iterdir()}
    if not names:
        raise fail("is empty")
    _config(path, fail)
    _weights(path, names, fail)
    if not names & set(TOKENIZER_FILES):
        raise fail(f"has no tokenizer (none of {', '.join(TOKENIZER_FILES)})")


def check_loadable(path: Path, trust_remote_code: bool = False) -> None:
    """`check_model_dir`, then config and tokenizer actually load (what `backbone` checks before copying)."""
    from transformers import AutoConfig, AutoTokenizer

    check_model_dir(path)
    for what, load in (("config", AutoConfig), ("tokenizer", AutoTokenizer)):
        try:
            load.from_pretrained(str(path), trust_remote_code=trust_remote_code)
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise ModelLoadError(
                f"model directory {path}: its {what} does not load ({type(err).__name__}: {err}); "
                "point at a complete Hugging Face model directory"
            ) from None


def _config(path: Path, fail) -> dict[str, Any]:
    config = path / "config.json"
    if not config.is_file():
        raise fail("has no config.json")
    try:
        loaded = json.loads(config.read_text(encoding="utf-8"))
    except ValueError as err:  # not JSON, not UTF-8, or a number past Python's digit limit
        raise fail(f"has an unreadable config.json ({json_problem(err)})") from None
    except RecursionError:
        raise fail(f"has a config.json that cannot be read: {JSON_TOO_DEEP}") from None
    if not isinstance(loaded, dict) or "model_type" not in loaded:
        raise fail("has a config.json without 'model_type'")
    return loaded


def _weights(path: Path, names: set[str], fail) -> None:
    """Every weight file present, and each safetensors header parses (a truncated copy fails here)."""
    from safetensors import SafetensorError, safe_open

    files = [path / n for n in ("model.safetensors", "pytorch_model.bin") if n in names]
    for index in (path / n for n in WEIGHT_INDEXES if n in names):
        try:
            shards = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
        except ValueError as err:
            raise fail(f"has an unreadable {index.name} ({json_problem(err)})") from None
        except (KeyError, AttributeError, TypeError) as err:
            raise fail(f"has an unreadable {index.name} (no weight_map of file names: {err!r:.80})") from None
        except RecursionError:
            raise fail(f"has an unreadable {index.name} ({JSON_TOO_DEEP})") from None
        missing = [s for s in shards if s not in names]
        if missing:
            raise fail(f"lacks weight shard(s) {missing} that {index.name} lists")
        files += [path / s for s in shards]
    if not files:
        raise fail("has no weights (model.safetensors, pytorch_model.bin or a sharded index)")
    if not any(file.suffix == ".safetensors" for file in files):
        _refuse_code_in_pickles(path, files)
    for file in files:
        if file.stat().st_size == 0:
            raise fail(f"has an empty {file.name}")
        if file.suffix == ".safetensors":
            try:
                with safe_open(file, framework="pt"):
                    pass
            except (SafetensorError, OSError) as err:
                raise ModelLoadError(
                    f"cannot load model {path}: its safetensors weights are corrupt or truncated "
                    f"({file.name}: {err}); re-run the stage that wrote it"
                ) from None


def code_in_pickle(what: str, err: Exception) -> ModelLoadError:
    """The refusal of weights that only a code-running unpickler loads; torch's own text (which
    suggests switching the check off) is never passed on, only the import it stumbled on."""
    needed = re.search(r"Unsupported global: GLOBAL (\S+)", str(err))
    imports = f", and loading it would import {needed[1]}" if needed else ""
    return ModelLoadError(
        f"{what} is a pickle that does not load as plain tensors{imports}; a pickle can run code while "
        "it loads. prefshift loads safetensors or weights-only checkpoints: use a copy of the model "
        "with model.safetensors"
    )


def _refuse_code_in_pickles(path: Path, files: list[Path]) -> None:
    """`.bin` weights (read only when no safetensors exist) must load weights-only, i.e. as plain tensors.

    A pickle that needs more imports can run code while loading. transformers then fails
    with torch's message, which suggests reloading with the check switched off: the unsafe
    step. Refusing here says what prefshift accepts instead.
    """
    import pickle

    import torch

    for file in files:
        try:
            try:
                torch.load(file, map_location="cpu", weights_only=True, mmap=True)
            except RuntimeError as err:
                if "mmap" not in str(err):  # a legacy (non-zip) checkpoint cannot be mapped: read it
                    raise
                torch.load(file, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as err:
            raise code_in_pickle(f"model directory {path}: {file.name}", err) from None
        except (RuntimeError, OSError, EOFError, ValueError) as err:
            first = str(err).strip().splitlines()[0][:200] if str(err).strip() else type(err).__name__
            raise ModelLoadError(
                f"model directory {path}: {file.name} is not a readable PyTorch checkpoint ({first}); "
                "re-run the stage that wrote it, or use a copy of the model with model.safetensors"
            ) from None


def mark_trained_head(config: Any) -> None:
    """Record in a model's config that its scalar head was trained by prefshift."""
    setattr(config, TRAINED_HEAD_KEY, True)


def require_trained_head(config: Any, name_or_path: str | Path) -> None:
    """Scoring with an untrained head gives arbitrary numbers: refuse it, saying what the model is."""
    if getattr(config, TRAINED_HEAD_KEY, False) is not True:
        architectures = ", ".join(getattr(config, "architectures", None) or ["unknown"])
        raise ModelLoadError(
            f"{name_or_path} has no trained reward head ({architectures}; its config.json lacks "
            f"{TRAINED_HEAD_KEY}, which prefshift records when it saves a trained reward model): it is a "
            "backbone or a model prefshift did not train, and its scores would be random. Score with a "
            "trained model: models/teacher/seed-<k>, models/students/<method>/seed-<k>, or a models:/ URI"
        )
