"""The MLflow model registry: register students by content, set aliases, pull them back out.

A registered version is a pyfunc model whose artifacts hold the student's plain HF
directory (`artifacts/<dir name>/`), so `prefshift pull` can hand out a directory that
`AutoModelForSequenceClassification.from_pretrained` loads, and `mlflow.pyfunc` users
can score (prompt, response) rows directly.

No pickle: the pyfunc is logged as code (MLflow's models-from-code, `serving_model.py`), so
loading a version imports prefshift's installed code. Every file of the logged model (the
MLmodel, the code file, the environment files and the HF directory) is listed with its sha256
in the version's `prefshift.files` tag, read back from the store right after logging. `pull`,
`score models:/…` and the pyfunc's `load_context` (what `mlflow.pyfunc.load_model` and
`mlflow models serve` run) refuse a version whose stored files differ from that record (a
changed, missing or added file, or a link), naming the file.

Identity is the content hash of the HF directory's files (`prefshift.content_hash`
version tag): registering an unchanged model returns the existing version (one registered
as code), and `pull` refuses a download whose files no longer hash to it. The reward mean/std
the model's config.json carries (id_test, OpenRLHF's normalisation keys) are copied into
the version's tags.

Pull never deletes or replaces a user's files: it writes into a new or empty directory,
or into an earlier pull. The earlier pull's `.prefshift-pull.json` marker (left out of the
content hash) lists each file it wrote with its sha256; it counts only if that listing
hashes to a version registered here, and then only for files still unchanged, so an
edited or forged marker can make pull remove nothing. Anything else needs `--force`,
which adds the model's files and removes nothing. Files come out readable like a
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
import random
import re
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import mlflow.pyfunc
import yaml

from prefshift.core import scratch
from prefshift.core.atomic import (
    STDOUT,
    atomic_path,
    check_output,
    clear_stale,
    output_errors,
    refuse_unowned,
)
from prefshift.core.errors import PrefshiftError, naming

HASH_TAG = "prefshift.content_hash"
FILES_TAG = "prefshift.files"
SERVING_CODE = Path(__file__).with_name("serving_model.py")
DOWNLOAD_META = "registered_model_meta"
"""What MLflow writes into a models:/ download (name and version): not part of the stored model."""
LINEAGE_TAG = "prefshift_experiment"
ARTIFACT_KEY = "hf_dir"
MODEL_NAME = "reward_model"
PIP_REQUIREMENTS = ["mlflow", "torch", "transformers", "safetensors", "pandas"]
PULL_MARKER = ".prefshift-pull.json"
PULLING = "prefshift-pull-copies"
"""The name the scratch of a pull into an existing directory is made for (inside it, while copying)."""
STATS_TAGS = {"mean": "reward.mean", "std": "reward.std"}
URI_PATTERN = re.compile(r"^models:/(?P<name>[^@/]+)(?:@(?P<alias>[\w-]+)|/(?P<version>\d+))$")


class RegistryError(PrefshiftError):
    """A registry operation that must not go ahead; the message says why and what exists."""


def content_hash(model_dir: Path) -> str:
    """sha256 over (relative path, file sha256) of every file but a pull marker, in path order."""
    return listing_hash(file_hashes(model_dir))


def file_hashes(model_dir: Path) -> dict[str, str]:
    """{relative path: sha256} of every file in `model_dir` but a pull marker."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise RegistryError(f"{model_dir}: model directory not found")
    links = [p for p in model_dir.rglob("*") if p.is_symlink()]
    if links:  # MLflow refuses to store it, and its hash would be the target's, wherever that is
        raise RegistryError(
            f"{links[0]}: a link inside the model directory {model_dir}; a registered model holds its own "
            "files: replace the link with a copy of the file, or remove it"
        )
    files = (p for p in model_dir.rglob("*") if p.is_file() and p.name != PULL_MARKER)
    return {p.relative_to(model_dir).as_posix(): _sha256(p) for p in files}


def listing_hash(files: dict[str, str]) -> str:
    """The content hash of a {relative path: sha256} listing (paths ordered part by part, as Paths sort)."""
    digest = hashlib.sha256()
    for rel in sorted(files, key=PurePosixPath):
        digest.update(rel.encode())
        digest.update(b"\0")
        digest.update(files[rel].encode())
        digest.update(b"\n")
    return digest.hexdigest()


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


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


MAX_REQUEST_CHARS = 4_000_000
"""The most text (prompt and response characters, all rows together) one request to the served
model may carry; a larger request is refused with HTTP 400 before any tokenising."""


class RewardScorer(mlflow.pyfunc.PythonModel):
    """pyfunc wrapper: rows of (prompt, response) → `reward`; rows of (prompt, chosen, rejected) →
    `reward_chosen`, `reward_rejected`, `margin`. A prompt is a string or a list of chat messages.

    Rows are checked by the validator `prefshift score` and `prepare` use (`downstream.check_row`).
    A bad row, a request over MAX_REQUEST_CHARS, or a row whose response does not survive
    truncation is refused as a whole with an MlflowException(INVALID_PARAMETER_VALUE), which the
    scoring server answers with HTTP 400 and one line naming the row: never a NaN, which JSON
    does not have, and never a made-up reward.
    """

    def load_context(self, context) -> None:
        """Check the loaded files against their version's record first; then load the HF model."""
        from prefshift.config.params import parse_params
        from prefshift.engine.scoring import load_for_scoring

        check_loaded_version(_model_root(Path(context.artifacts[ARTIFACT_KEY])))
        self.params = parse_params({"encode": (context.model_config or {}).get("encode", {})}, "model_config")
        self.model, self.tokenizer = load_for_scoring(context.artifacts[ARTIFACT_KEY], self.params)

    def predict(self, context, model_input, params=None):
        from mlflow.exceptions import MlflowException
        from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE

        try:
            return self._rewards(model_input)
        except PrefshiftError as err:
            raise MlflowException(str(err), error_code=INVALID_PARAMETER_VALUE) from None

    def _rewards(self, model_input):
        import pandas as pd

        from prefshift.core.progress import lines_to
        from prefshift.engine.rows import OUTPUTS, check_row, row_kind, score_rows

        columns = set(model_input.columns)
        if not {"response", "chosen", "rejected"} & columns:
            raise RegistryError(
                f"pyfunc input has columns {sorted(map(str, columns))}; needs prompt and response, or "
                "prompt, chosen and rejected"
            )
        kind = row_kind(columns)
        rows = [
            check_row({k: _plain(v) for k, v in record.items()}, kind, f"row {i}")
            for i, record in enumerate(model_input.to_dict("records"))
        ]
        _check_request_size(rows)
        with lines_to(None):  # a request, not a stage: no progress lines in the caller's output
            result = score_rows(self.model, self.tokenizer, kind, rows, self.params)
        if result["skipped"]:
            kept = {item["row"] for item in result["rows"]}
            lost = [i for i in range(len(rows)) if i not in kept]
            raise RegistryError(
                f"row(s) {lost[:10]}: a response keeps fewer than encode.min_response_tokens="
                f"{self.params.encode.min_response_tokens} tokens after truncation to encode.max_length="
                f"{self.params.encode.max_length}, so it has no reward"
            )
        return pd.DataFrame({key: [item[key] for item in result["rows"]] for key in OUTPUTS[kind]})


def _check_request_size(rows: list[dict[str, Any]]) -> None:
    size = sum(
        len(value) if isinstance(value, str) else sum(len(m["content"]) for m in value)
        for row in rows
        for value in row.values()
    )
    if size > MAX_REQUEST_CHARS:
        raise RegistryError(
            f"the request carries {size} characters of text, more than the served model takes at once "
            f"({MAX_REQUEST_CHARS}); send fewer or shorter rows (only the first encode.max_length tokens "
            "of each are scored)"
        )


def _plain(value: Any) -> Any:
    """A cell as JSON would give it: serving hands over lists of messages as numpy arrays, and a
    missing cell as NaN (which the row check then names instead of scoring)."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, list):
        return [dict(m) if hasattr(m, "keys") else m for m in value]
    return value


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
    path = Path(model_dir) / "config.json"
    with naming(str(path)):  # a number past Python's digit limit is named by its file
        config = json.loads(path.read_text(encoding="utf-8"))
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
    existing = _versions_as_code(client, name, digest)
    if existing:
        return existing[0], False
    stats = reward_stat_tags(model_dir)  # read before anything is logged: a bad config.json logs nothing
    with _global_uris(run.uri), mlflow.start_run(run_id=run.run_id):
        info = mlflow.pyfunc.log_model(
            name=MODEL_NAME,
            python_model=str(SERVING_CODE),
            artifacts={ARTIFACT_KEY: str(model_dir)},
            pip_requirements=PIP_REQUIREMENTS,
            model_config={"encode": encode},
        )
        record = {**tags, **stats, HASH_TAG: digest, FILES_TAG: _stored_record(info)}
        created = _create_version(info.model_uri, name, record)
    canonical = _versions_as_code(client, name, digest)[0]
    if canonical.version != created.version:
        client.delete_model_version(name, created.version)
        return canonical, False
    return created, True


CREATE_TRIES = 3
"""How often a promotion asks the store for a new version before it gives up."""


def _create_version(model_uri: str, name: str, record: dict[str, str]) -> Any:
    """`mlflow.register_model`, asked again after a random pause where the store gave up creating
    the version: MLflow's SQL store takes the next version number and retries at once, three times,
    so a concurrent promotion taking each number first failed this one.
    A duplicate this leaves is resolved as any other (register keeps the lowest)."""
    from mlflow.exceptions import MlflowException

    for attempt in range(1, CREATE_TRIES):
        try:
            return mlflow.register_model(model_uri, name, tags=record)
        except MlflowException as err:
            if "Model Version creation error" not in str(err):
                raise
        time.sleep(random.uniform(0.5, 1.5) * attempt)  # apart from the process it met
    return mlflow.register_model(model_uri, name, tags=record)  # its error, if any, is the user's


def _versions_as_code(client: Any, name: str, digest: str) -> list[Any]:
    """The versions of this content that carry a record of every file: a version from before
    (a pickled pyfunc, no record) is never reused, so promoting again registers the model as code."""
    return [v for v in versions_with_hash(client, name, digest) if FILES_TAG in v.tags]


def _stored_record(info: Any) -> str:
    """The `prefshift.files` tag: every file of the logged model as the store holds it, read back."""
    with tempfile.TemporaryDirectory(prefix="prefshift-record-") as scratch:
        local = _download(info.model_uri, scratch, info.model_uri)
        return json.dumps(stored_files(local, info.model_uri), sort_keys=True, separators=(",", ":"))


def _download(source: str, scratch: str, where: str) -> Path:
    """The stored model downloaded into `scratch`; MLflow's refusal (a file outside the artifact
    folder, a link, a store it cannot read) is one line naming the file."""
    from mlflow.exceptions import MlflowException

    try:
        return Path(mlflow.artifacts.download_artifacts(artifact_uri=source, dst_path=scratch))
    except MlflowException as err:
        said = " ".join(str(err.message).replace("#", " ").split())
        raise RegistryError(f"{where}: MLflow could not download the stored model: {said}") from None


def stored_files(root: Path, where: str) -> dict[str, str]:
    """{relative path: sha256} of every file of a logged model (MLflow's download note left out).

    A link or anything but a regular file or folder is refused: a stored model holds none, and
    following one would check a file outside the model instead of the one MLflow reads.
    """
    found: dict[str, str] = {}
    for folder, dirs, files in os.walk(root):
        for entry in [*dirs, *files]:
            path = Path(folder) / entry
            rel = path.relative_to(root).as_posix()
            if path.is_symlink() or not (path.is_dir() or path.is_file()):
                raise RegistryError(
                    f"{where}: {rel} is a link or special file, which no registered model holds; "
                    "refusing to use this copy (promote the model again)"
                )
            if entry in files and rel != DOWNLOAD_META:
                found[rel] = _sha256(path)
    return found


def check_stored_files(root: Path, record: str | None, where: str) -> None:
    """Refuse the model at `root` unless its files are exactly the version's record, naming the first
    file that differs (changed, missing or added)."""
    try:
        expected = json.loads(record) if record else None
    except ValueError:
        expected = None
    if not isinstance(expected, dict) or not all(isinstance(v, str) for v in expected.values()):
        raise RegistryError(
            f"{where}: the version carries no readable {FILES_TAG} record of its files (registered by an "
            "older prefshift as a pickled pyfunc, or the tag was edited); run `prefshift promote` again to "
            "register the model as code"
        )
    actual = stored_files(root, where)
    for rel in sorted(expected.keys() | actual.keys(), key=PurePosixPath):
        if rel not in actual:
            problem = "is missing from the stored model"
        elif rel not in expected:
            problem = "was added to the stored model after registration"
        elif actual[rel] != expected[rel]:
            problem = f"was modified after registration (recorded sha256 {expected[rel][:12]}…)"
        else:
            continue
        raise RegistryError(f"{where}: {rel} {problem}; refusing to use this version (register it again)")


def _model_root(artifact: Path) -> Path:
    """The logged model's folder (the one holding MLmodel) above an artifact's path."""
    for folder in artifact.parents:
        if (folder / "MLmodel").is_file():
            return folder
    raise RegistryError(f"{artifact}: no MLmodel above this artifact; not a logged MLflow model")


def check_loaded_version(root: Path) -> None:
    """What `load_context` runs first: the files MLflow is loading are the ones their registry
    version recorded. The version is the one MLflow's models:/ download names (`registered_model_meta`);
    its record is read from the registry of this process (MLFLOW_TRACKING_URI / MLFLOW_REGISTRY_URI)."""
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    meta_path = root / DOWNLOAD_META
    try:
        meta = yaml.safe_load(meta_path.read_text(encoding="utf-8")) if meta_path.is_file() else None
    except (OSError, ValueError, yaml.YAMLError):
        meta = None
    if not isinstance(meta, dict) or not {"model_name", "model_version"} <= meta.keys():
        raise RegistryError(
            f"{root}: not loaded from the registry, so there is no version record to check its files "
            "against; load or serve it as models:/<name>@<alias> or models:/<name>/<version>"
        )
    where = f"models:/{meta['model_name']}/{meta['model_version']}"
    try:
        version = MlflowClient().get_model_version(str(meta["model_name"]), str(meta["model_version"]))
    except MlflowException as err:
        raise RegistryError(
            f"{where}: cannot read its content record from the registry ({err.message.splitlines()[0]}); "
            "set MLFLOW_TRACKING_URI to the registry the model came from"
        ) from None
    check_stored_files(root, version.tags.get(FILES_TAG), where)


def set_alias(client: Any, name: str, alias: str, version: str) -> str:
    """Point `alias` at `version` and return the version that holds it when read back."""
    client.set_registered_model_alias(name, alias, version)
    return client.get_model_version_by_alias(name, alias).version


def is_registered(client: Any, name: str) -> bool:
    from mlflow.exceptions import MlflowException

    try:
        client.get_registered_model(name)
    except MlflowException as err:
        if err.error_code == "RESOURCE_DOES_NOT_EXIST":
            return False
        raise
    return True


def drop_aliases_of(
    client: Any, name: str, methods: set[str], keep: set[str] = frozenset()
) -> list[tuple[str, str, str]]:
    """Remove every alias but `keep` that names a version registered for one of `methods`
    (its `method` tag), or that is `candidate-<method>`; return (alias, version, method) of each."""
    removed = []
    for alias, version in sorted(client.get_registered_model(name).aliases.items()):
        method = client.get_model_version(name, version).tags.get("method")
        if method not in methods:
            method = next((m for m in methods if alias == f"candidate-{m}"), None)
        if method is not None and alias not in keep:
            client.delete_registered_model_alias(name, alias)
            removed.append((alias, str(version), method))
    return removed


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
    if str(out) == STDOUT:
        raise RegistryError(
            "pull writes a directory; `-` (standard output) cannot hold one: name a directory"
        )
    out = check_output(out, directory=True, force=force).resolve()  # the last part is no link: refused above
    owned = _earlier_pull(client, out)
    _check_target(out, force, owned)
    version = resolve(client, ref)
    expected = version.tags.get(HASH_TAG)
    if not expected:
        raise RegistryError(
            f"{uri}: version {version.version} carries no {HASH_TAG} tag; not a prefshift model"
        )
    info = {"name": ref.name, "version": str(version.version), "content_hash": expected, "out": str(out)}
    source = client.get_model_version_download_uri(ref.name, version.version)
    with tempfile.TemporaryDirectory(prefix="prefshift-pull-") as scratch:
        local = _download(source, scratch, uri)
        if FILES_TAG in version.tags:  # older versions (pickled, never loaded here) have the HF hash only
            check_stored_files(local, version.tags[FILES_TAG], uri)
        hf_dir = _hf_dir_in(local)
        files = file_hashes(hf_dir)
        actual = listing_hash(files)
        if actual != expected:
            raise RegistryError(
                f"{uri}: downloaded files hash to {actual[:16]}…, registration recorded {expected[:16]}…; "
                "the stored artifact was modified, refusing to use it"
            )
        _install(hf_dir, out, {**info, "uri": uri}, files, owned, force)
    return info


def _earlier_pull(client: Any, out: Path) -> dict[str, str]:
    """{relative path: sha256} of the files in `out` that an earlier pull wrote and nobody changed since.

    The marker in `out` is only a claim: whoever can write `out` can edit it, and a list of
    names alone would let it name the user's files for deletion. So the marker lists each
    file with its sha256, and it is believed only when that listing hashes to a version
    registered here (no one can forge a listing of their own files that does), and then
    only for the files whose bytes still hash to what it lists.
    """
    marker_path = out / PULL_MARKER
    try:
        if not marker_path.is_file() or marker_path.is_symlink():
            return {}
        marker = json.loads(marker_path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return {}
    files = marker.get("files") if isinstance(marker, dict) else None
    if not isinstance(files, dict) or not all(isinstance(v, str) for v in files.values()):
        return {}
    if not isinstance(marker.get("name"), str) or listing_hash(files) != marker.get("content_hash"):
        return {}
    if not _registered(client, marker["name"], marker["content_hash"]):
        return {}
    return {rel: sha for rel, sha in files.items() if _current_hash(out, rel) == sha}


def _registered(client: Any, name: str, digest: str) -> bool:
    from mlflow.exceptions import MlflowException

    try:
        return bool(versions_with_hash(client, name, digest))
    except MlflowException:  # a name the search filter cannot even express
        return False


def _current_hash(out: Path, rel: str) -> str | None:
    """sha256 of `out/rel` if it is a regular file reached without leaving `out` or following a link."""
    parts = PurePosixPath(rel).parts
    if not parts or PurePosixPath(rel).is_absolute() or ".." in parts:
        return None
    path = out
    for part in parts:
        path = path / part
        if path.is_symlink():
            return None
    return _sha256(path) if path.is_file() else None


def _check_target(out: Path, force: bool, owned: dict[str, str]) -> None:
    if out.is_dir() and not owned and not force and any(out.iterdir()):
        raise RegistryError(
            f"{out} is not empty and holds no earlier prefshift pull that verifies ({PULL_MARKER} missing, "
            "or its file list does not hash to a version registered here); refusing to write into it. "
            "Choose a new or empty directory, or pass --force to add the model's files (same-named files "
            "are overwritten, nothing else is touched or deleted)"
        )


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


def _install(
    hf_dir: Path, out: Path, info: dict[str, str], files: dict[str, str], owned: dict[str, str], force: bool
) -> None:
    """Copy the verified files into `out`; the earlier pull's own unchanged files that this one lacks go.

    Nothing else is replaced or removed: a file in the way that the earlier pull did not write,
    or that changed since, stops the pull unless --force, which overwrites it (and still removes
    only the earlier pull's own unchanged files).
    """
    marker = {**info, "files": files}
    mask = _umask()
    if not out.exists():
        with atomic_path(out, directory=True) as tmp:
            _copy_files(hf_dir, tmp, sorted(files), mask)
            (tmp / PULL_MARKER).write_text(json.dumps(marker, indent=2, sort_keys=True) + "\n")
            os.chmod(tmp / PULL_MARKER, 0o666 & ~mask)
            os.chmod(tmp, 0o777 & ~mask)
        return
    in_the_way = sorted(rel for rel in files if rel not in owned and os.path.lexists(out / rel))
    if in_the_way and not force:
        shown = ", ".join(in_the_way[:5]) + (
            f" and {len(in_the_way) - 5} more" if len(in_the_way) > 5 else ""
        )
        raise RegistryError(
            f"{out}: {shown} would be replaced, but the earlier pull did not write them or they changed "
            "since; refusing to touch them. Move them away, or pass --force to overwrite them"
        )
    for rel in [*sorted(files), PULL_MARKER]:  # all of it before the first copy: never half a pull
        _refuse_unowned_on_the_way(out, rel, force)
    _copy_files(hf_dir, out, sorted(files), mask)
    for stale in sorted(owned.keys() - files.keys()):
        (out / stale).unlink()
    with atomic_path(out / PULL_MARKER, force=force) as tmp:
        tmp.write_text(json.dumps(marker, indent=2, sort_keys=True) + "\n")
        os.chmod(tmp, 0o666 & ~mask)


def _refuse_unowned_on_the_way(top: Path, rel: str, force: bool) -> None:
    """The output rule for `top/rel` and each folder between: a link, device or stray file is refused."""
    path = top
    for part in PurePosixPath(rel).parent.parts:
        path = path / part
        refuse_unowned(path, directory=True, force=force)
    refuse_unowned(top / rel, force=force)


def _copy_files(source: Path, target: Path, files: list[str], mask: int) -> None:
    """Every file copied into a scratch directory inside `target` first, then each renamed over its place.

    A reader never sees half a file, and a copy that fails (a full disk) leaves `target` as
    it was: the scratch is removed and nothing has been renamed yet. The renames need no space.
    The copies live in scratch that prefshift can prove it made (`prefshift.core.scratch`), never
    under names beside the files that a user's own file could hold.
    """
    clear_stale(target / PULLING)  # what a killed pull left, proven by its record
    made = scratch.create(target / PULLING, directory=True)
    try:
        copies = [made.work / str(index) for index in range(len(files))]
        for rel, copy in zip(files, copies, strict=True):
            dest = target / rel
            for parent in reversed(dest.relative_to(target).parents[:-1]):
                folder = target / parent
                if not folder.exists():
                    folder.mkdir()
                    os.chmod(folder, 0o777 & ~mask)
            with output_errors([dest]):
                shutil.copyfile(source / rel, copy)
            os.chmod(copy, 0o666 & ~mask)
        for rel, copy in zip(files, copies, strict=True):
            scratch.replace_file(copy, target / rel)
    finally:
        made.discard()


def pull_to(uri: str, out: Path, layout: Any, force: bool = False) -> dict[str, str]:
    """`prefshift pull`: the registry at the project's tracking URI (checked reachable first); an
    error of its store (a damaged or locked database) names it."""
    from prefshift.tracking import runs as tracking

    with naming(f"tracking store {tracking.public_uri(tracking.tracking_uri(layout))}"):
        return pull(tracking.open_client(layout), uri, out, force)
