"""The MLflow model registry: register students by content, set aliases, pull them back out.

A registered version is a pyfunc model whose artifacts hold the student's plain HF
directory (`artifacts/<dir name>/`), so `prefshift pull` can hand out a directory that
`AutoModelForSequenceClassification.from_pretrained` loads, and `mlflow.pyfunc` users
can score (prompt, response) rows directly.

Identity is the content hash of the HF directory's files (`prefshift.content_hash`
version tag): registering an unchanged model returns the existing version, and
`pull` refuses a download whose files no longer hash to it. The reward mean/std the
model's config.json carries (id_test, OpenRLHF's normalisation keys) are copied into
the version's tags.

Pull never deletes a user's files: it writes into a new or empty directory, or into
an earlier pull (recognised by its `.prefshift-pull.json` marker, which lists the
files it wrote and is left out of the content hash); anything else needs `--force`,
which adds the model's files and touches nothing else. Files come out readable like a
normal download (0644 files, 0755 directories, less the umask).

Concurrency. Two promotions racing on one server may both create a version for the
same content; after registering, the lowest version number with that hash is the
canonical one and a process that created a higher one deletes it. An alias points to
exactly one version by construction (so there is never more than one champion); after
setting it we read it back and report who holds it, so a promotion that lost a race
says so instead of claiming an alias it no longer has.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlflow.pyfunc
import yaml

from prefshift.atomic import atomic_path
from prefshift.errors import PrefshiftError

HASH_TAG = "prefshift.content_hash"
LINEAGE_TAG = "prefshift_experiment"
ARTIFACT_KEY = "hf_dir"
MODEL_NAME = "reward_model"
PIP_REQUIREMENTS = ["mlflow", "torch", "transformers", "safetensors", "pandas"]
PULL_MARKER = ".prefshift-pull.json"
STATS_TAGS = {"mean": "reward.mean", "std": "reward.std"}
URI_PATTERN = re.compile(r"^models:/(?P<name>[^@/]+)(?:@(?P<alias>[\w-]+)|/(?P<version>\d+))$")


class RegistryError(PrefshiftError):
    """A registry operation that must not go ahead; the message says why and what exists."""


def content_hash(model_dir: Path) -> str:
    """sha256 over (relative path, file sha256) of every file but a pull marker, in path order."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise RegistryError(f"{model_dir}: model directory not found")
    digest = hashlib.sha256()
    for path in sorted(p for p in model_dir.rglob("*") if p.is_file() and p.name != PULL_MARKER):
        digest.update(path.relative_to(model_dir).as_posix().encode())
        digest.update(b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).hexdigest().encode())
        digest.update(b"\n")
    return digest.hexdigest()


@dataclass(frozen=True)
class ModelRef:
    name: str
    alias: str | None = None
    version: str | None = None


def parse_uri(uri: str) -> ModelRef:
    match = URI_PATTERN.match(uri)
    if not match:
        raise RegistryError(
            f"{uri!r} is not a registry URI; expected models:/<name>@<alias> or models:/<name>/<n>"
        )
    return ModelRef(match["name"], match["alias"], match["version"])


class RewardScorer(mlflow.pyfunc.PythonModel):
    """pyfunc wrapper: rows of (prompt, response) → `reward`; rows of (prompt, chosen, rejected) →
    `reward_chosen`, `reward_rejected`, `margin`. A prompt is a string or a list of chat messages.

    A row whose response does not survive truncation gets NaN, never a made-up reward.
    """

    def load_context(self, context) -> None:
        from prefshift.config import parse_params
        from prefshift.scoring import load_for_scoring

        self.params = parse_params({"encode": (context.model_config or {}).get("encode", {})}, "model_config")
        self.model, self.tokenizer = load_for_scoring(context.artifacts[ARTIFACT_KEY], self.params)

    def predict(self, context, model_input, params=None):
        import pandas as pd

        from prefshift.downstream import as_messages, score_rows
        from prefshift.progress import lines_to

        columns = set(model_input.columns)
        if {"chosen", "rejected"} <= columns:
            kind, sides = "pairs", ("chosen", "rejected")
            outputs: tuple[str, ...] = ("reward_chosen", "reward_rejected", "margin")
        elif "response" in columns:
            kind, sides, outputs = "responses", ("response",), ("reward",)
        else:
            raise RegistryError(
                f"pyfunc input has columns {sorted(columns)}; needs prompt and response, or prompt, chosen "
                "and rejected"
            )
        if "prompt" not in columns:
            raise RegistryError("pyfunc input lacks the 'prompt' column")
        records = model_input.to_dict("records")
        rows = [
            {"prompt": as_messages(_plain(r["prompt"]), f"row {i}"), **{s: r[s] for s in sides}}
            for i, r in enumerate(records)
        ]
        with lines_to(None):  # a request, not a stage: no progress lines in the caller's output
            scored = score_rows(self.model, self.tokenizer, kind, rows, self.params)["rows"]
        values = {key: [float("nan")] * len(rows) for key in outputs}
        for item in scored:
            for key in outputs:
                values[key][item["row"]] = item[key]
        return pd.DataFrame(values)


def _plain(prompt: Any) -> Any:
    """A prompt as JSON would give it: serving hands over lists of messages as numpy arrays."""
    if hasattr(prompt, "tolist"):
        prompt = prompt.tolist()
    if isinstance(prompt, list):
        return [dict(m) if hasattr(m, "keys") else m for m in prompt]
    return prompt


def ensure_registered_model(client: Any, name: str, experiment: str) -> None:
    """Create the registered model with our lineage tag, or refuse one that belongs elsewhere."""
    from mlflow.exceptions import MlflowException

    try:
        client.create_registered_model(name, tags={LINEAGE_TAG: experiment})
        return
    except MlflowException as err:
        if err.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
    found = client.get_registered_model(name).tags.get(LINEAGE_TAG)
    if found != experiment:
        origin = f"experiment {found!r}" if found else "no prefshift lineage tag"
        raise RegistryError(
            f"registered model {name!r} already exists with {origin} (tag {LINEAGE_TAG}); this pipeline "
            f"logs to experiment {experiment!r}. Refusing to mix lineages: set tracking.registered_model "
            "to another name."
        )


def reward_stat_tags(model_dir: Path) -> dict[str, str]:
    """`reward.mean`/`reward.std` tags from config.json (absent in a model saved without them)."""
    config = json.loads((Path(model_dir) / "config.json").read_text(encoding="utf-8"))
    return {tag: repr(float(config[key])) for key, tag in STATS_TAGS.items() if key in config}


def versions_with_hash(client: Any, name: str, digest: str) -> list[Any]:
    found = [v for v in client.search_model_versions(f"name='{name}'") if v.tags.get(HASH_TAG) == digest]
    return sorted(found, key=lambda v: int(v.version))


URI_VARIABLES = ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI")


@contextmanager
def _global_uris(uri: str) -> Iterator[None]:
    """mlflow's fluent `log_model`/`register_model` read process-wide URIs; set them for the call only.

    Left set (mlflow keeps them in module globals and exports them to the environment), they
    would send every later client in the process that names no registry URI (a notebook,
    another project's promote in the same test session) to this project's registry. mlflow has
    no public way to unset them, hence the two private globals (mlflow is pinned below 4).
    """
    from mlflow.tracking._model_registry import utils as registry_state
    from mlflow.tracking._tracking_service import utils as tracking_state

    saved = (tracking_state._tracking_uri, registry_state._registry_uri)
    saved_env = {name: os.environ.get(name) for name in URI_VARIABLES}
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    try:
        yield
    finally:
        tracking_state._tracking_uri, registry_state._registry_uri = saved
        for name, value in saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def register(
    run: Any, name: str, model_dir: Path, tags: dict[str, str], encode: dict[str, Any]
) -> tuple[Any, bool]:
    """(model version, created?) for a student dir, logged under `run` (a tracking.StageRun).

    An unchanged model returns its existing version and logs nothing.
    """
    client = run.client
    digest = content_hash(model_dir)
    existing = versions_with_hash(client, name, digest)
    if existing:
        return existing[0], False
    with _global_uris(run.uri), mlflow.start_run(run_id=run.run_id):
        info = mlflow.pyfunc.log_model(
            name=MODEL_NAME,
            python_model=RewardScorer(),
            artifacts={ARTIFACT_KEY: str(model_dir)},
            pip_requirements=PIP_REQUIREMENTS,
            model_config={"encode": encode},
        )
        created = mlflow.register_model(
            info.model_uri, name, tags={**tags, **reward_stat_tags(model_dir), HASH_TAG: digest}
        )
    canonical = versions_with_hash(client, name, digest)[0]
    if canonical.version != created.version:
        client.delete_model_version(name, created.version)
        return canonical, False
    return created, True


def set_alias(client: Any, name: str, alias: str, version: str) -> str:
    """Point `alias` at `version` and return the version that holds it when read back."""
    client.set_registered_model_alias(name, alias, version)
    return client.get_model_version_by_alias(name, alias).version


def drop_alias(client: Any, name: str, alias: str) -> None:
    if alias in client.get_registered_model(name).aliases:
        client.delete_registered_model_alias(name, alias)


def resolve(client: Any, ref: ModelRef) -> Any:
    """The model version a URI names; a missing alias lists the ones that exist."""
    from mlflow.exceptions import MlflowException

    try:
        model = client.get_registered_model(ref.name)
    except MlflowException:
        raise RegistryError(f"no registered model named {ref.name!r}") from None
    if ref.version is not None:
        try:
            return client.get_model_version(ref.name, ref.version)
        except MlflowException:
            raise RegistryError(f"model {ref.name!r} has no version {ref.version}") from None
    if ref.alias not in model.aliases:
        listed = ", ".join(f"{a} (v{v})" for a, v in sorted(model.aliases.items())) or "none"
        raise RegistryError(f"model {ref.name!r} has no alias {ref.alias!r}; existing aliases: {listed}")
    return client.get_model_version(ref.name, model.aliases[ref.alias])


def _hf_dir_in(download: Path) -> Path:
    mlmodel = yaml.safe_load((download / "MLmodel").read_text(encoding="utf-8"))
    relative = mlmodel["flavors"]["python_function"]["artifacts"][ARTIFACT_KEY]["path"]
    return download / relative


def pull(client: Any, uri: str, out: Path, force: bool = False) -> dict[str, str]:
    """Write the registered HF directory to `out` after checking its content hash; returns what was pulled."""
    ref = parse_uri(uri)
    out = Path(out).expanduser().resolve()
    _check_target(out, force)
    version = resolve(client, ref)
    expected = version.tags.get(HASH_TAG)
    if not expected:
        raise RegistryError(
            f"{uri}: version {version.version} carries no {HASH_TAG} tag; not a prefshift model"
        )
    info = {"name": ref.name, "version": str(version.version), "content_hash": expected, "out": str(out)}
    source = client.get_model_version_download_uri(ref.name, version.version)
    with tempfile.TemporaryDirectory(prefix="prefshift-pull-") as scratch:
        local = Path(mlflow.artifacts.download_artifacts(artifact_uri=source, dst_path=scratch))
        hf_dir = _hf_dir_in(local)
        actual = content_hash(hf_dir)
        if actual != expected:
            raise RegistryError(
                f"{uri}: downloaded files hash to {actual[:16]}…, registration recorded {expected[:16]}…; "
                "the stored artifact was modified, refusing to use it"
            )
        _install(hf_dir, out, {**info, "uri": uri})
    return info


def _earlier_pull(out: Path) -> dict[str, Any] | None:
    try:
        marker = json.loads((out / PULL_MARKER).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    return marker if isinstance(marker, dict) and isinstance(marker.get("files"), list) else None


def _check_target(out: Path, force: bool) -> None:
    if out.exists() and not out.is_dir():
        raise RegistryError(f"{out} exists and is not a directory; choose another --out")
    if out.is_dir() and any(out.iterdir()) and _earlier_pull(out) is None and not force:
        raise RegistryError(
            f"{out} is not empty and holds no earlier prefshift pull ({PULL_MARKER} missing); refusing to "
            "write into it. Choose a new or empty directory, or pass --force to add the model's files "
            "(same-named files are overwritten, nothing else is touched or deleted)"
        )


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


def _install(hf_dir: Path, out: Path, info: dict[str, str]) -> None:
    """Copy the verified files into `out`; an earlier pull's files that this one lacks are removed."""
    files = sorted(p.relative_to(hf_dir).as_posix() for p in hf_dir.rglob("*") if p.is_file())
    marker = {**info, "files": files}
    mask = _umask()
    if not out.exists():
        with atomic_path(out, directory=True) as tmp:
            _copy_files(hf_dir, tmp, files, mask)
            (tmp / PULL_MARKER).write_text(json.dumps(marker, indent=2, sort_keys=True) + "\n")
            os.chmod(tmp / PULL_MARKER, 0o666 & ~mask)
            os.chmod(tmp, 0o777 & ~mask)
        return
    earlier = _earlier_pull(out)
    _copy_files(hf_dir, out, files, mask)
    for stale in sorted(set(earlier["files"] if earlier else ()) - set(files)):
        path = (out / stale).resolve()
        if path.is_relative_to(out) and path.is_file():
            path.unlink()
    with atomic_path(out / PULL_MARKER) as tmp:
        tmp.write_text(json.dumps(marker, indent=2, sort_keys=True) + "\n")
        os.chmod(tmp, 0o666 & ~mask)


def _copy_files(source: Path, target: Path, files: list[str], mask: int) -> None:
    """Each file copied beside its destination and renamed over it: a reader never sees half a file."""
    for rel in files:
        dest = target / rel
        for parent in reversed(dest.relative_to(target).parents[:-1]):
            folder = target / parent
            if not folder.exists():
                folder.mkdir()
                os.chmod(folder, 0o777 & ~mask)
        partial = dest.with_name(f".{dest.name}.partial")
        shutil.copyfile(source / rel, partial)
        os.chmod(partial, 0o666 & ~mask)
        os.replace(partial, dest)


def pull_to(uri: str, out: Path, layout: Any, force: bool = False) -> dict[str, str]:
    """`prefshift pull`: the registry at the project's tracking URI (checked reachable first)."""
    from prefshift import tracking

    return pull(tracking.open_client(layout), uri, out, force)
