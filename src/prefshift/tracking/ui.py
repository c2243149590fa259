"""`prefshift ui`: the MLflow UI on the project's tracking database, bound to localhost.

`check` looks at it the way a user does (headless Chromium, rendered page), so a UI
that starts but shows nothing useful fails the check.
"""

from __future__ import annotations

import errno
import html
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from prefshift.core.atomic import atomic_path
from prefshift.core.errors import PrefshiftError
from prefshift.core.paths import Layout
from prefshift.tracking.runs import PIPELINE_TAG, check_sqlite, tracking_uri

CHECKED = ("wrg", "mean_aog", "mean_nts")


def command(
    layout: Layout, host: str, port: int, backend: str | None = None, workers: int | None = None
) -> list[str]:
    """`mlflow ui` on the project's database; `workers` None keeps MLflow's default (4)."""
    uri = backend or tracking_uri(layout)
    if uri.startswith(("http://", "https://")):
        raise PrefshiftError(f"runs are tracked on the server {uri}: open it in a browser")
    check_sqlite(uri)
    return [
        sys.executable,
        "-m",
        "mlflow",
        "ui",
        "--backend-store-uri",
        uri,
        "--host",
        host,
        "--port",
        str(port),
        *(["--workers", str(workers)] if workers else []),
    ]


def check_port_free(host: str, port: int) -> None:
    """Refuse a port another process listens on, before MLflow starts.

    MLflow's server on a busy port logs the failure, keeps its front process alive for
    about 50 s and then exits 0, after we had printed a URL that shows someone else's
    service. SO_REUSEADDR makes the probe ignore connections in TIME_WAIT, as the server's
    own bind does, so only a live listener counts.
    """
    try:
        addresses = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as err:
        raise PrefshiftError(f"--host {host}: cannot resolve it ({err.strerror})") from None
    family, kind, proto, _, address = addresses[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as err:
            why = "another process listens there" if err.errno == errno.EADDRINUSE else err.strerror
            raise PrefshiftError(
                f"port {port} on {host} is not available ({why}): stop that process, or pass another "
                "--port (or --host)"
            ) from None


def serve(layout: Layout, host: str = "127.0.0.1", port: int = 5000, backend: str | None = None) -> int:
    """Run the UI in the foreground until Ctrl-C; returns its exit status.

    MLflow's background job runner (GenAI evaluation jobs) is switched off: we do not
    use it and it starts several worker processes.
    """
    cmd = command(layout, host, port, backend)
    check_port_free(host, port)
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    print(f"MLflow UI on http://{host}:{port} (backend {cmd[5]}); Ctrl-C stops it.", file=sys.stderr)
    try:
        return subprocess.call(cmd, env=env)
    except KeyboardInterrupt:
        return 0


def find_chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    raise PrefshiftError(
        "no Chromium found; install it (Debian: `apt-get install chromium`) or use scripts/check_ui.sh"
    )


def _evaluate_runs(uri: str, experiment: str) -> tuple[str, list[Any]]:
    """(experiment id, evaluate runs of the newest pipeline run that has any)."""
    from mlflow import MlflowClient

    check_sqlite(uri, must_exist=True)
    client = MlflowClient(uri, registry_uri=uri)
    found = client.get_experiment_by_name(experiment)
    if found is None:
        raise PrefshiftError(f"experiment {experiment!r} not found at {uri}; run the pipeline first")
    runs = client.search_runs(
        [found.experiment_id],
        filter_string="tags.stage = 'evaluate'",
        order_by=["attributes.start_time DESC"],
    )
    if not runs:
        raise PrefshiftError(f"experiment {experiment!r} has no evaluate runs yet; run the pipeline first")
    newest = runs[0].data.tags.get(PIPELINE_TAG)
    return found.experiment_id, [r for r in runs if r.data.tags.get(PIPELINE_TAG) == newest]


def _page_text(chromium: str, profile: Path, url: str, screenshot: Path | None = None) -> str:
    """Visible text of a page after its scripts ran, from headless Chromium.

    No background networking: on a closed network Chromium's own update and sync lookups
    otherwise fail noisily at every start. The pages of one check share a profile, so the
    UI's scripts are fetched and compiled once (a page then takes ~4 s instead of ~6 s).
    """
    base = [
        chromium,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile}",
        "--virtual-time-budget=20000",
    ]
    dom = subprocess.run(
        [*base, "--window-size=1600,2400", "--dump-dom", url], capture_output=True, text=True, timeout=180
    ).stdout
    if screenshot is not None:
        # Chromium writes where it is told, over whatever is there: it is told a scratch path, and
        # the picture replaces `screenshot` only as the one atomic write (a user's file, a link
        # or another user's file at that path is left alone, as for every output).
        with atomic_path(screenshot) as scratch_png:
            subprocess.run(
                [*base, "--window-size=1600,2600", f"--screenshot={scratch_png}", url],
                capture_output=True,
                timeout=180,
            )
    text = re.sub(r"<script.*?</script>|<style.*?</style>", " ", dom, flags=re.S)
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", text)).split())


def _shown(value: float) -> str:
    """A metric value as the MLflow UI prints it: at most 4 decimals, no trailing zeros."""
    return format(round(value, 4), "g")


def check(
    layout: Layout, experiment: str, screenshot: Path, port: int = 5099, metrics: tuple[str, ...] = CHECKED
) -> dict[str, Any]:
    """Open the UI in headless Chromium as a user would and confirm the evaluate runs show their metrics.

    Starts the UI on the project's database and opens the comparison of the newest
    pipeline run's evaluate runs (every run name must appear; its screenshot is kept),
    then each run's own page, which must list each of `metrics` with the logged value.
    The run page, not the comparison, is where the values are read: the comparison's
    metric table renders only the rows in view, and `wrg` sorts below them.
    """
    chromium = find_chromium()
    uri = tracking_uri(layout)
    experiment_id, runs = _evaluate_runs(uri, experiment)
    cmd = command(layout, "127.0.0.1", port, workers=1)  # one browser: 12 s to start instead of 19
    check_port_free("127.0.0.1", port)
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    server = subprocess.Popen(
        cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    base = f"http://127.0.0.1:{port}"
    ids = urllib.parse.quote(json.dumps([r.info.run_id for r in runs]))
    url = f"{base}/#/compare-runs?runs={ids}&experiments={urllib.parse.quote(json.dumps([experiment_id]))}"
    missing = []
    try:
        _wait_healthy(base, server)
        with tempfile.TemporaryDirectory(prefix="prefshift-chromium-") as profile:
            text = _page_text(chromium, Path(profile), url, screenshot)
            missing += [f"run {r.info.run_name}" for r in runs if r.info.run_name not in text]
            for run in runs:
                page = f"{base}/#/experiments/{experiment_id}/runs/{run.info.run_id}"
                shown = f" {_page_text(chromium, Path(profile), page)} "
                for key in metrics:
                    value = run.data.metrics.get(key)
                    if value is None or f" {key} {_shown(value)} " not in shown:
                        missing.append(f"{key} = {value} on {page}")
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
    if missing:
        raise PrefshiftError(
            f"MLflow UI does not show: {', '.join(missing)} (comparison: {url}; screenshot: {screenshot})"
        )
    return {
        "url": url,
        "runs": [r.info.run_name for r in runs],
        "metrics": list(metrics),
        "screenshot": str(screenshot),
    }


def _wait_healthy(base: str, server: subprocess.Popen, timeout: float = 180.0) -> None:
    deadline = time.time() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"{base}/health", timeout=2):
                return
        except OSError:
            if server.poll() is not None or time.time() > deadline:
                raise PrefshiftError(f"the MLflow UI did not start on {base}") from None
            time.sleep(0.5)
