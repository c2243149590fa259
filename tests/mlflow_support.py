"""Shared by the MLflow tests: a migrated empty tracking database, built once per session.

Creating a sqlite store runs MLflow's schema migrations (several seconds on CI), so
each test copies this template to its project root instead of starting from nothing.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from mlflow import MlflowClient

_TEMPLATE: list[Path] = []


def seed_database(tmp_path_factory, target: Path) -> None:
    """Put an empty, already migrated mlflow.db at `target`."""
    if not _TEMPLATE:
        path = tmp_path_factory.mktemp("mlflow-template") / "mlflow.db"
        MlflowClient(f"sqlite:///{path}").search_experiments()
        _TEMPLATE.append(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(_TEMPLATE[0], target)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for_http(server: subprocess.Popen, url: str, timeout: float, failure: str) -> None:
    """Poll `url` until it answers; fail with `failure` when the process exits or `timeout` passes."""
    deadline = time.time() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            if server.poll() is not None or time.time() > deadline:
                raise RuntimeError(failure) from None
            time.sleep(0.5)


def stop_group(server: subprocess.Popen, grace: float = 30.0) -> None:
    """SIGTERM the server's process group, SIGKILL it if it outlives `grace` seconds.

    A server that already died is only reaped, so its own error is the one a failing test shows.
    """
    if server.poll() is not None:
        return
    os.killpg(server.pid, signal.SIGTERM)
    try:
        server.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()


@contextmanager
def running_server(tmp_path: Path, port: int, timeout: float = 90.0) -> Iterator[str]:
    """A real `mlflow server` on 127.0.0.1 in its own process group, stopped (group and all) on exit.

    Job execution is off: its background consumers are not needed and cost seconds of CPU.
    """
    uri = f"http://127.0.0.1:{port}"
    cmd = [
        sys.executable, "-m", "mlflow", "server",
        "--backend-store-uri", f"sqlite:///{tmp_path / 'server.db'}",
        "--artifacts-destination", str(tmp_path / "server-artifacts"),
        "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
    ]  # fmt: skip
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    server = subprocess.Popen(
        cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    try:
        wait_for_http(server, f"{uri}/health", timeout, f"mlflow server on {uri} did not come up")
        yield uri
    finally:
        stop_group(server)
