"""MLflow runs for the stages: one experiment, one run per stage, a parent run per pipeline run.

Where runs go. `MLFLOW_TRACKING_URI` wins; otherwise a sqlite file at the project
root, addressed by absolute path. The project root is `DVC_ROOT` when DVC runs the
stage (DVC sets it for every stage command and points it at the *original* repo even
for queued `dvc exp` runs, which execute in a temporary copy under .dvc/tmp/exps), else
the DVC project holding the stage's root (the folder with `.dvc/`, as DVC_ROOT would
name it: in a monorepo's `ml/`, that folder and not the repository's top), else the git
top level, else the root itself. Artifacts of the default
database go to `<root>/mlartifacts`; neither is a DVC output.

Pipeline run id. `PREFSHIFT_PIPELINE_RUN_ID` wins (CI or a driver script can group
anything). Otherwise, under DVC (`DVC_STAGE` set), the id is derived from the `dvc`
process that spawned the stage (host, pid, start time, read from /proc), so every
stage of one `dvc repro`, and of one queued experiment, shares it and the next
invocation gets a new one. Outside DVC, or where /proc is missing, it is derived from
the git commit and the resolved params: manual runs of one code+params state share a
parent. The parent run is found by its `prefshift.pipeline_run_id` tag, so no state
file is needed and several machines sharing a server agree on it.

Input hashes. Each run is tagged `dvc.dep.<path>` with the md5 DVC records for every
dep of its DVC stage (`DVC_STAGE`, or `<stage>@<method>`), computed with DVC's own
hashing when the run starts: dvc.lock only receives them after the stage ends, so reading
it would tag the previous run's inputs. Without a DVC stage, the split manifest's sha256.

Unusable databases. A sqlite URI whose file cannot be written (a read-only location, a
directory that does not exist, a path that is a directory) stops the command at once,
naming the path: MLflow itself retries opening it for about 105 s before failing.

Moved projects. MLflow stores an experiment's artifact location as an absolute path, so a
project copied or moved with its mlflow.db would keep writing artifacts into the original
directory. A stage refuses to log to such a database before any work and says how to fix it
(`check_artifact_location`).

Outages. An http(s) server that does not answer at start stops the stage before any
work, naming the URI, unless `tracking.required` is false: then the run is recorded in
`<root>/.prefshift/offline.db` (self-gitignored, not a DVC output). A server lost mid-run
never stops a stage: `StageRun` moves the run to that database and replays what it had
logged. `prefshift sync` (prefshift.tracking.sync) uploads offline runs later.

Secrets. Only the resolved params and facts computed here are logged, never the
environment; as a second guard any param or tag value containing the value of an
environment variable whose name looks secret (TOKEN, KEY, SECRET, PASSWORD...) is
replaced by a placeholder before it leaves the process.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from prefshift.config.params import Params, dump_yaml
from prefshift.core.errors import PrefshiftError, library_problem
from prefshift.core.host import compute_tags
from prefshift.core.locks import private_dir
from prefshift.core.paths import Layout
from prefshift.core.signals import Terminated, exit_code, signals_as_exceptions, stop_signal

# MLflow's usage telemetry phones home (never reachable offline) from a thread that edits
# os.environ; a user who wants it sets the variable themselves.
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

PIPELINE_ENV = "PREFSHIFT_PIPELINE_RUN_ID"
PIPELINE_TAG = "prefshift.pipeline_run_id"
PARENT_TAG = "prefshift.pipeline_parent"
SECRET_MARKERS = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "API_KEY", "ACCESS_KEY", "PRIVATE")
MAX_PARAM_CHARS = 6000
REMOTE_URI_TAG = "prefshift.remote_uri"
REMOTE_RUN_TAG = "prefshift.remote_run_id"
OFFLINE_DB = "offline.db"
ARTIFACTS_DIR = "mlartifacts"
# MLflow's client retries a dead server for minutes by default; with these a stage falls
# back to the offline database after ~10 s instead. Applied only where the user set nothing.
HTTP_DEFAULTS = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "3",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "30",
}


class TrackingError(PrefshiftError):
    """The tracking server or database cannot be used; the message names the URI."""


def project_root(start: Path) -> Path:
    """The repository that owns the default tracking database (see the module docstring)."""
    if os.environ.get("DVC_ROOT"):
        return Path(os.environ["DVC_ROOT"]).resolve()
    start = Path(start).resolve()
    if dvc_root := next((d for d in (start, *start.parents) if (d / ".dvc").is_dir()), None):
        return dvc_root
    top = _git(start, "rev-parse", "--show-toplevel")
    return Path(top).resolve() if top else start.resolve()


def default_uri(root: Path) -> str:
    return f"sqlite:///{(root / 'mlflow.db').as_posix()}"


def tracking_uri(layout: Layout) -> str:
    return os.environ.get("MLFLOW_TRACKING_URI") or default_uri(project_root(layout.root))


def offline_uri(root: Path) -> str:
    """Where runs go when the server is down and params.tracking.required is false."""
    return f"sqlite:///{(private_dir(root) / OFFLINE_DB).as_posix()}"


def is_offline(uri: str) -> bool:
    return uri.startswith("sqlite:///") and uri.endswith(f"/.prefshift/{OFFLINE_DB}")


def public_uri(uri: str) -> str:
    """The URI without user:password, safe to record."""
    parts = urllib.parse.urlsplit(uri)
    if parts.username is None and parts.password is None:
        return uri
    return urllib.parse.urlunsplit(
        parts._replace(netloc=parts.hostname + (f":{parts.port}" if parts.port else ""))
    )


def check_reachable(uri: str, timeout: float = 5.0) -> None:
    """Fail before any work when an http(s) tracking server does not answer its health check."""
    if not uri.startswith(("http://", "https://")):
        return
    try:
        with urllib.request.urlopen(f"{uri.rstrip('/')}/health", timeout=timeout) as response:
            if response.status == 200:
                return
            problem = f"HTTP {response.status}"
    except urllib.error.HTTPError as err:
        problem = f"HTTP {err.code}"
    except (urllib.error.URLError, OSError) as err:
        problem = str(getattr(err, "reason", err))
    raise TrackingError(
        f"MLflow tracking server {public_uri(uri)} is unreachable ({problem}). Start it, fix "
        "MLFLOW_TRACKING_URI, or set tracking.required: false to record locally and sync later."
    )


def sqlite_path(uri: str) -> Path | None:
    """The database file of a `sqlite:///<path>` URI (`sqlite:////abs` is absolute), else None."""
    if not uri.startswith("sqlite:///"):
        return None
    return Path(urllib.parse.unquote(uri[len("sqlite:///") :].split("?", 1)[0]))


def check_sqlite(uri: str, must_exist: bool = False) -> None:
    """Fail in a moment, naming the path, where sqlite could not open the database read-write.

    Probed by opening the file and creating a scratch file beside it (sqlite writes its
    journal there), not by permission bits, so a read-only mount or another user's
    directory is caught too. `must_exist` is for readers (pull, score, the UI check): a
    database that is not there has nothing to read, and MLflow would create an empty one.
    """
    path = sqlite_path(uri)
    if path is None:
        return
    fix = (
        "point the tracking URI (MLFLOW_TRACKING_URI, or the command's --to/--backend) at a writable "
        "sqlite file, or unset MLFLOW_TRACKING_URI for the project's mlflow.db"
    )
    if path.exists() and not path.is_file():
        raise TrackingError(f"tracking database {path} is not a file; {fix}")
    if not path.exists():
        if must_exist:
            raise TrackingError(
                f"no tracking database at {path}: run the pipeline first (`dvc repro`), or {fix}"
            )
        if not path.parent.is_dir():
            raise TrackingError(
                f"tracking database {path}: directory {path.parent} does not exist; "
                f"create it (mkdir -p {path.parent}) or {fix}"
            )
    try:
        if path.exists():
            path.open("r+b").close()
        with tempfile.TemporaryFile(dir=path.parent):
            pass
    except OSError as err:
        raise TrackingError(
            f"tracking database {path} is not writable ({err.strerror or err}); "
            f"make {path.parent} writable or {fix}"
        ) from None


def resolve_uri(params: Params, layout: Layout) -> str:
    """The URI to log to after the reachability check and the offline fallback."""
    uri = tracking_uri(layout)
    check_sqlite(uri)
    try:
        check_reachable(uri)
    except TrackingError as err:
        if params.tracking.required:
            raise
        fallback = offline_uri(project_root(layout.root))
        print(
            f"warning: {err}\nRecording to {fallback} instead (tracking.required is false); "
            "run `prefshift sync` once the server is back to upload these runs.",
            file=sys.stderr,
        )
        return fallback
    return uri


def _git(cwd: Path, *args: str) -> str | None:
    try:
        out = subprocess.run(
            ["git", *args], cwd=cwd, capture_output=True, text=True, check=True, timeout=30
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return out.strip()


def git_state(root: Path) -> dict[str, str]:
    """Commit and dirty flag; dvc.lock is pipeline bookkeeping that every stage rewrites, so it is ignored."""
    commit = _git(root, "rev-parse", "HEAD")
    status = _git(root, "status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)dvc.lock")
    return {
        "git.commit": commit or "unknown",
        "git.dirty": "unknown" if status is None else str(bool(status)).lower(),
    }


def params_hash(params: Params) -> str:
    blob = json.dumps(params.resolved(), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def proc_info(pid: int) -> tuple[int, str, list[str]] | None:
    """(parent pid, start time, argv) of a process from /proc, None where unavailable."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    return int(fields[1]), fields[19], [a.decode(errors="replace") for a in argv if a]


def _dvc_invocation() -> str | None:
    """Host, pid and start time of the `dvc` process running this stage, if any."""
    if not os.environ.get("DVC_STAGE"):
        return None
    pid = os.getppid()
    for _ in range(12):
        info = proc_info(pid)
        if info is None or pid <= 1:
            return None
        parent, started, argv = info
        if any(Path(arg).name == "dvc" for arg in argv[:3]):
            return f"{socket.gethostname()}:{pid}:{started}"
        pid = parent
    return None


def pipeline_run_id(params: Params, layout: Layout) -> str:
    """Shared by all stages of one pipeline run (see the module docstring for how)."""
    if os.environ.get(PIPELINE_ENV):
        return os.environ[PIPELINE_ENV]
    key = _dvc_invocation()
    if key is None:
        key = f"state:{git_state(layout.root)['git.commit']}:{params_hash(params)}"
    return "pr-" + hashlib.sha256(key.encode()).hexdigest()[:12]


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested mappings → dotted keys; lists stay whole (they are one param)."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat


def _environment_snapshot() -> dict[str, str]:
    """A copy of the environment; retried because MLflow's telemetry thread may edit it meanwhile."""
    for _ in range(5):
        try:
            return dict(os.environ)
        except (KeyError, RuntimeError):
            continue
    return dict(os.environ)


def _secret_values() -> dict[str, str]:
    return {
        name: value
        for name, value in _environment_snapshot().items()
        if len(value) >= 8 and any(marker in name.upper() for marker in SECRET_MARKERS)
    }


def redact(text: str) -> str:
    for name, secret in _secret_values().items():
        text = text.replace(secret, f"<redacted ${name}>")
    return text


def scrub(values: Mapping[str, Any]) -> dict[str, str]:
    """Stringify for MLflow and redact anything that carries a secret from the environment."""
    return {
        key: redact(value if isinstance(value, str) else json.dumps(value, sort_keys=True))[:MAX_PARAM_CHARS]
        for key, value in values.items()
    }


def run_name(stage: str, method: str | None, seed: int | None, item: str | None = None) -> str:
    """One run per model and seed, even where one DVC stage trains every seed of a method:
    train@naive-0, teacher@1, downstream@naive-2 (one stage scores every model of every seed);
    a stage keyed by another `item` names it first: downstream_target@helpful_base/naive-2."""
    keys = "-".join(str(k) for k in (method, seed) if k is not None)
    if item is not None:
        return f"{stage}@{item}/{keys}" if keys else f"{stage}@{item}"
    return f"{stage}@{keys}" if keys else stage


def dvc_stage_name(stage: str, method: str | None, seed: int | None = None, item: str | None = None) -> str:
    """The DVC stage this run belongs to: DVC's own name for it when DVC runs it, else the name
    dvc.yaml gives it: one stage per method for every seed (train@naive), one per seed where no
    method is involved (teacher@1), one per item where the stage is keyed by another (a target's
    downstream_target@helpful_base)."""
    if os.environ.get("DVC_STAGE"):
        return os.environ["DVC_STAGE"]
    if item is not None:
        return f"{stage}@{item}"
    return run_name(stage, method, None if method is not None else seed)


def _dvc_dep_paths(root: Path, stage_name: str) -> tuple[Path, ...] | None:
    """The stage's declared deps as DVC resolves them (foreach, vars), None if DVC cannot say.

    Cached while dvc.yaml and params.yaml (which `foreach: ${methods}` reads) stay as they are:
    a stage that logs one run per model (downstream) asks DVC once, not once per model.
    """
    stamps = tuple(_stamp(root / name) for name in ("dvc.yaml", "params.yaml"))
    return _resolved_dep_paths(root, stage_name, stamps)


def _stamp(path: Path) -> tuple[int, int] | None:
    try:
        stat = path.stat()
    except OSError:
        return None
    return stat.st_mtime_ns, stat.st_size


@functools.cache
def _resolved_dep_paths(root: Path, stage_name: str, _stamps: tuple) -> tuple[Path, ...] | None:
    """DVC's own stage loader reads dvc.yaml alone: the deps are declared there, and dvc.lock,
    which `repo.stage.collect` parses too, grows with every seed and method (3.5 of a 5.5 s
    evaluate stage went into parsing it on a two-seed project)."""
    try:
        from dvc.dvcfile import ProjectFile
        from dvc.repo import Repo

        with Repo(str(root)) as repo:
            dvcfile = ProjectFile(repo, str(root / "dvc.yaml"))
            stage = dvcfile.LOADER(dvcfile, dvcfile.contents, {})[stage_name]
            return tuple(Path(dep.fs_path) for dep in stage.deps)
    except Exception:  # no dvc.yaml, no such stage, not a DVC repo: fall back below
        return None


def dvc_md5(path: Path) -> str:
    """The md5 DVC records for a file or directory (`….dir` for directories), computed now."""
    from dvc_data.hashfile.build import build
    from dvc_data.hashfile.db import HashFileDB
    from dvc_objects.fs.local import LocalFileSystem
    from dvc_objects.fs.memory import MemoryFileSystem

    odb = HashFileDB(MemoryFileSystem(), "/prefshift-hash")
    _, _, obj = build(odb, str(path.resolve()), LocalFileSystem(), "md5", dry_run=True)
    return obj.hash_info.value


def input_hashes(layout: Layout, stage_name: str) -> dict[str, str]:
    """`dvc.dep.<path>` → DVC md5 of each dep, hashed now (dvc.lock still holds the previous run's).

    Without a DVC stage definition, the split manifest's sha256 identifies the data.
    """
    root = layout.root.resolve()
    deps = _dvc_dep_paths(root, stage_name)
    if deps is not None:
        hashes = {}
        for path in deps:
            rel = path.relative_to(root).as_posix() if path.is_relative_to(root) else path.as_posix()
            hashes[f"dvc.dep.{rel}"] = dvc_md5(path) if path.exists() else "missing"
        return hashes
    manifest = layout.split_manifest
    if manifest.exists():
        return {"data.split_manifest.sha256": hashlib.sha256(manifest.read_bytes()).hexdigest()}
    return {}


class StageRun:
    """What a stage sees: a handle on its own MLflow run that survives a tracking outage.

    Every logging call is journaled. If a call fails mid-run (server gone), the run is
    re-created in the local offline database, the journal is replayed into it, and the
    stage carries on there; `prefshift sync` uploads it later and marks the abandoned
    server-side run FAILED. Only the start-up check (see `resolve_uri`) is fatal.
    """

    def __init__(
        self,
        params: Params,
        layout: Layout,
        stage: str,
        method: str | None,
        uri: str,
        item: str | None = None,
    ):
        self.params, self.layout = params, layout
        self.run_name = run_name(stage, method, layout.seed, item)
        self.pipeline_run_id = pipeline_run_id(params, layout)
        self.tags = scrub(run_tags(params, layout, stage, method, self.pipeline_run_id, item))
        self.journal: list[tuple[str, tuple, dict]] = []
        try:
            self._start(uri, {})
        except MovedDatabaseError:
            raise  # not an outage: an offline fallback would hide it
        except Exception as err:
            if params.tracking.required or is_offline(uri):
                said = library_problem(err) or err
                raise TrackingError(f"cannot use MLflow tracking at {public_uri(uri)}: {said}") from err
            self._go_offline(err)

    def _start(self, uri: str, extra_tags: dict[str, str]) -> None:
        from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID

        client = client_for(uri)
        experiment_id = ensure_experiment(client, self.params.tracking.experiment, uri)
        lineage = scrub({**git_state(self.layout.root), "params.hash": params_hash(self.params)})
        parent = ensure_parent(client, experiment_id, self.pipeline_run_id, lineage)
        tags = {**self.tags, **extra_tags, MLFLOW_PARENT_RUN_ID: parent}
        run = client.create_run(experiment_id, run_name=self.run_name, tags=tags)
        self.client, self.uri, self.run_id = client, uri, run.info.run_id

    def _go_offline(self, err: Exception) -> None:
        remote = {
            REMOTE_URI_TAG: public_uri(getattr(self, "uri", "")),
            REMOTE_RUN_TAG: getattr(self, "run_id", ""),
        }
        fallback = offline_uri(project_root(self.layout.root))
        print(
            f"warning: MLflow tracking failed ({type(err).__name__}: {err}); continuing in {fallback}. "
            "Run `prefshift sync` once the server is back to upload this run.",
            file=sys.stderr,
        )
        self._start(fallback, scrub(remote))
        for method, args, kwargs in self.journal:
            getattr(self.client, method)(self.run_id, *args, **kwargs)

    def _call(self, method: str, *args: Any, **kwargs: Any) -> None:
        self.journal.append((method, args, kwargs))
        try:
            getattr(self.client, method)(self.run_id, *args, **kwargs)
        except Exception as err:
            if is_offline(self.uri):
                raise
            self._go_offline(err)

    def log_params(self, values: Mapping[str, Any]) -> None:
        from mlflow.entities import Param

        items = [Param(k, v) for k, v in sorted(scrub(values).items())]
        for start in range(0, len(items), 100):
            self._call("log_batch", params=items[start : start + 100])

    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        """Nested dicts are flattened with dots; None (an undefined metric such as PGR) is not logged."""
        from mlflow.entities import Metric

        stamp = int(time.time() * 1000)
        rows = [
            Metric(key, float(value), stamp, step or 0)
            for key, value in flatten(metrics).items()
            if isinstance(value, (int, float)) and not isinstance(value, bool)
        ]
        for start in range(0, len(rows), 500):
            self._call("log_batch", metrics=rows[start : start + 500])

    def log_history(self, records: list[Mapping[str, Any]], prefix: str = "") -> None:
        """Per-step series (each record holds a `step` and numbers), sent in batches, not a call per step."""
        from mlflow.entities import Metric

        stamp = int(time.time() * 1000)
        rows = [
            Metric(f"{prefix}{key}", float(value), stamp, int(record["step"]))
            for record in records
            for key, value in record.items()
            if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool)
        ]
        for start in range(0, len(rows), 500):
            self._call("log_batch", metrics=rows[start : start + 500])

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        path = Path(path)
        if path.is_dir():
            self._call("log_artifacts", str(path), artifact_path or path.name)
        else:
            self._call("log_artifact", str(path), artifact_path)

    def log_dict(self, obj: Any, name: str) -> None:
        self._call("log_dict", obj, name)

    def log_text(self, text: str, name: str) -> None:
        self._call("log_text", redact(text), name)

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        from mlflow.entities import RunTag

        self._call("log_batch", tags=[RunTag(k, v) for k, v in scrub(tags).items()])

    def finish(self, status: str) -> None:
        self._call("set_terminated", status)


def client_for(uri: str):
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=uri, registry_uri=uri)


def open_client(layout: Layout):
    """A client on the project's tracking URI for commands that must reach it (pull, score)."""
    uri = tracking_uri(layout)
    check_sqlite(uri, must_exist=True)
    check_reachable(uri)
    return client_for(uri)


class MovedDatabaseError(TrackingError):
    """A sqlite database whose experiment stores its artifacts beside another copy of it."""


def _local_path(location: str) -> Path | None:
    parts = urllib.parse.urlsplit(location)
    if parts.scheme == "file":
        return Path(urllib.parse.unquote(parts.path))
    return Path(location) if not parts.scheme and location.startswith("/") else None


def check_artifact_location(experiment: Any, uri: str) -> None:
    """Refuse an experiment whose artifacts are not in the `mlartifacts` beside its sqlite database.

    MLflow records an experiment's artifact location as an absolute path when the experiment is
    created, and every run's artifact path after it. A project copied or moved with its
    mlflow.db keeps those paths, so its runs would go on writing models and configs into the
    original directory (or fail there, once it is gone), silently. Only the layout this module
    creates (`<db dir>/mlartifacts`) is checked; other locations were chosen by someone on purpose.
    """
    database = sqlite_path(uri)
    stored = _local_path(experiment.artifact_location or "")
    if database is None or stored is None or stored.name != ARTIFACTS_DIR:
        return
    expected = database.resolve().parent / ARTIFACTS_DIR
    if stored == expected or stored.resolve() == expected:
        return
    raise MovedDatabaseError(
        f"{database}: experiment {experiment.name!r} keeps its artifacts in {stored}, not in {expected}: "
        f"this database was copied or moved from {stored.parent}, and runs logged here would write into "
        f"that directory. Start this copy's tracking afresh (move {database.name} and {ARTIFACTS_DIR}/ "
        "aside), or log to a new experiment (a new `tracking.experiment` in params.yaml)"
    )


def ensure_experiment(client: Any, name: str, uri: str) -> str:
    from mlflow.exceptions import MlflowException

    found = client.get_experiment_by_name(name)
    if found is not None:
        check_artifact_location(found, uri)
        return found.experiment_id
    location = None
    if uri.startswith("sqlite:///"):
        location = sqlite_path(uri).resolve().parent.joinpath(ARTIFACTS_DIR).as_uri()
    try:
        return client.create_experiment(name, artifact_location=location)
    except MlflowException:  # created concurrently by another stage
        return client.get_experiment_by_name(name).experiment_id


def _find_parent(client: Any, experiment_id: str, pipeline_id: str) -> list[Any]:
    runs = client.search_runs(
        [experiment_id],
        filter_string=f"tags.`{PARENT_TAG}` = 'true' and tags.`{PIPELINE_TAG}` = '{pipeline_id}'",
        max_results=50,
    )
    return sorted(runs, key=lambda r: (r.info.start_time, r.info.run_id))


def ensure_parent(client: Any, experiment_id: str, pipeline_id: str, tags: Mapping[str, str]) -> str:
    """The pipeline's parent run; a duplicate created by a racing stage is deleted, earliest wins."""
    runs = _find_parent(client, experiment_id, pipeline_id)
    if runs:
        return runs[0].info.run_id
    run = client.create_run(
        experiment_id,
        run_name=f"pipeline {pipeline_id}",
        tags={**tags, PARENT_TAG: "true", PIPELINE_TAG: pipeline_id},
    )
    client.set_terminated(run.info.run_id, "FINISHED")
    runs = _find_parent(client, experiment_id, pipeline_id)
    winner = runs[0].info.run_id if runs else run.info.run_id
    if winner != run.info.run_id:
        client.delete_run(run.info.run_id)
    return winner


def run_tags(
    params: Params, layout: Layout, stage: str, method: str | None, pipeline_id: str, item: str | None = None
) -> dict[str, str]:
    name = dvc_stage_name(stage, method, layout.seed, item)
    return {
        **git_state(layout.root),
        **input_hashes(layout, name),
        **compute_tags(),
        "stage": stage,
        "method": method or "",
        "dvc.stage": name,
        "data.source": params.data.source,
        "data.targets": ",".join(params.data.targets),
        "data.category": params.data.category,
        "seed": str(params.seed),
        "params.hash": params_hash(params),
        "trust_remote_code": str(params.backbone.trust_remote_code).lower(),
        PIPELINE_TAG: pipeline_id,
    }


def end_status(error: BaseException) -> str:
    """KILLED for a run stopped from outside (a signal, Ctrl-C), FAILED for one that went wrong."""
    stopped = any(e is not None and stop_signal(e) is not None for e in (error, error.__cause__))
    return "KILLED" if stopped else "FAILED"


@contextmanager
def stage_run(
    params: Params, layout: Layout, stage: str, method: str | None = None, item: str | None = None
) -> Iterator[StageRun]:
    """An MLflow run for one stage, child of the pipeline run; never left RUNNING. `item` is the
    DVC foreach item of a stage keyed by something other than the method (run_name).

    Logs the resolved config (as params and as `config/params.yaml`) and the lineage tags
    before the body runs, so an unreachable server fails before any training. A body that
    raises ends the run FAILED; SIGTERM, SIGHUP and Ctrl-C end it KILLED. After a signal the
    process exits with 128 + its number, as the signal's default action would have reported it
    to the caller (DVC, a shell), once the run is ended and every cleanup has run.
    """
    uri = resolve_uri(params, layout)
    if uri.startswith(("http://", "https://")):
        for name, value in HTTP_DEFAULTS.items():
            os.environ.setdefault(name, value)
    with signals_as_exceptions():
        run = StageRun(params, layout, stage, method, uri, item)
        try:
            run.log_params(flatten(params.resolved()))
            run.log_text(dump_yaml(params.resolved()), "config/params.yaml")
            yield run
        except BaseException as error:
            run.finish(end_status(error))
            if isinstance(error, Terminated):
                print(f"{run.run_name}: {error}; MLflow run {run.run_id} marked KILLED", file=sys.stderr)
                raise SystemExit(exit_code(error.signum)) from error
            raise
        run.finish("FINISHED")
