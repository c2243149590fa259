"""`prefshift ui`: the MLflow UI on the project's tracking database, bound to localhost."""

from __future__ import annotations

import os
import subprocess
import sys

from prefshift.errors import PrefshiftError
from prefshift.paths import Layout
from prefshift.tracking import tracking_uri


def command(layout: Layout, host: str, port: int, backend: str | None = None) -> list[str]:
    uri = backend or tracking_uri(layout)
    if uri.startswith(("http://", "https://")):
        raise PrefshiftError(f"runs are tracked on the server {uri}: open it in a browser")
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
    ]


def serve(layout: Layout, host: str = "127.0.0.1", port: int = 5000, backend: str | None = None) -> int:
    """Run the UI in the foreground until Ctrl-C; returns its exit status.

    MLflow's background job runner (GenAI evaluation jobs) is switched off: we do not
    use it and it starts several worker processes.
    """
    cmd = command(layout, host, port, backend)
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    print(f"MLflow UI on http://{host}:{port} (backend {cmd[5]}); Ctrl-C stops it.", file=sys.stderr)
    try:
        return subprocess.call(cmd, env=env)
    except KeyboardInterrupt:
        return 0
