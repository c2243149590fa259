"""`prefshift sync`: upload runs recorded in the offline database while the server was down.

Runs land in <root>/.prefshift/offline.db when the server was unreachable at start
(with tracking.required false) or dropped mid-run. Sync copies each finished or failed
run (tags, params, full metric histories, artifacts, status and times) into the same
experiment on the server, under the server's parent run of the same pipeline run id,
then tags the offline run `prefshift.synced_to` so a second sync copies nothing. A run
that started on the server and moved offline mid-run leaves a stub there: it is marked
FAILED and tagged `prefshift.replaced_by` with the uploaded copy.
"""

from __future__ import annotations

import tempfile
from typing import Any

from prefshift.core.errors import PrefshiftError, naming
from prefshift.core.paths import Layout
from prefshift.tracking import runs as tracking

SYNCED_TAG = "prefshift.synced_to"
SOURCE_TAG = "prefshift.synced_from"
REPLACED_TAG = "prefshift.replaced_by"
LINEAGE_KEYS = ("git.commit", "git.dirty", "params.hash")


def _copy_run(src: Any, dst: Any, run: Any, experiment_id: str, parent: str) -> str:
    from mlflow.entities import Metric, Param, RunTag
    from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID, MLFLOW_RUN_NAME

    tags = {k: v for k, v in run.data.tags.items() if k not in (MLFLOW_PARENT_RUN_ID, SYNCED_TAG)}
    tags.update({MLFLOW_PARENT_RUN_ID: parent, SOURCE_TAG: run.info.run_id})
    new = dst.create_run(
        experiment_id, start_time=run.info.start_time, tags=tags, run_name=tags.get(MLFLOW_RUN_NAME)
    )
    new_id = new.info.run_id
    params = [Param(k, v) for k, v in sorted(run.data.params.items())]
    for start in range(0, len(params), 100):
        dst.log_batch(new_id, params=params[start : start + 100])
    for key in sorted(run.data.metrics):
        history = [
            Metric(m.key, m.value, m.timestamp, m.step) for m in src.get_metric_history(run.info.run_id, key)
        ]
        for start in range(0, len(history), 500):
            dst.log_batch(new_id, metrics=history[start : start + 500])
    with tempfile.TemporaryDirectory(prefix="prefshift-sync-") as scratch:
        if src.list_artifacts(run.info.run_id):
            local = src.download_artifacts(run.info.run_id, "", scratch)
            dst.log_artifacts(new_id, local)
    dst.log_batch(
        new_id, tags=[RunTag("mlflow.note.content", f"uploaded by prefshift sync from {run.info.run_id}")]
    )
    dst.set_terminated(new_id, run.info.status, end_time=run.info.end_time)
    return new_id


def sync(layout: Layout, target: str | None = None) -> dict[str, Any]:
    """Copy unsynced offline runs to `target` (default: the project's tracking URI)."""
    root = tracking.project_root(layout.root)
    db = root / ".prefshift" / tracking.OFFLINE_DB
    target = target or tracking.tracking_uri(layout)
    result: dict[str, Any] = {"source": str(db), "target": tracking.public_uri(target), "copied": []}
    if not db.exists():
        return result
    source = tracking.offline_uri(root)
    if target == source:
        raise PrefshiftError(f"sync target {target} is the offline database itself; set MLFLOW_TRACKING_URI")
    tracking.check_sqlite(target)
    tracking.check_reachable(target)
    with naming(f"offline database {db}"):  # each store's own error (damaged, locked) names it
        src = tracking.client_for(source)
        src.search_experiments(max_results=1)
    with naming(f"tracking store {tracking.public_uri(target)}"):
        dst = tracking.client_for(target)
        dst.search_experiments(max_results=1)
    with naming(f"sync from {db} to {tracking.public_uri(target)}"):
        return _copy_pending(src, dst, target, result)


def _copy_pending(src: Any, dst: Any, target: str, result: dict[str, Any]) -> dict[str, Any]:
    for experiment in src.search_experiments():
        runs = src.search_runs([experiment.experiment_id], max_results=5000)
        pending = [
            r
            for r in runs
            if r.data.tags.get(tracking.PARENT_TAG) != "true"
            and SYNCED_TAG not in r.data.tags
            and r.info.status in ("FINISHED", "FAILED", "KILLED")
        ]
        if not pending:
            continue
        experiment_id = tracking.ensure_experiment(dst, experiment.name, target)
        for run in sorted(pending, key=lambda r: (r.info.start_time, r.info.run_id)):
            pipeline_id = run.data.tags.get(tracking.PIPELINE_TAG, "unknown")
            lineage = {k: run.data.tags[k] for k in LINEAGE_KEYS if k in run.data.tags}
            parent = tracking.ensure_parent(dst, experiment_id, pipeline_id, lineage)
            new_id = _copy_run(src, dst, run, experiment_id, parent)
            src.set_tag(run.info.run_id, SYNCED_TAG, new_id)
            stub = run.data.tags.get(tracking.REMOTE_RUN_TAG)
            if stub and run.data.tags.get(tracking.REMOTE_URI_TAG) == tracking.public_uri(target):
                dst.set_tag(stub, REPLACED_TAG, new_id)
                dst.set_terminated(stub, "FAILED")
            result["copied"].append(
                {"offline_run": run.info.run_id, "run": new_id, "name": run.info.run_name}
            )
    return result
