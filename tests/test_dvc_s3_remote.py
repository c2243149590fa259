"""A team S3 remote for DVC: push from one clone, pull into another, and nothing re-runs.

A local S3-compatible server (moto in server mode) stands in for AWS, MinIO or Ceph;
DVC reaches it only through the remote's `endpointurl` and the standard AWS
credential variables, the same settings a user puts in front of a real bucket.
The pipeline is a one-stage stand-in (seconds), not the project's own.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("moto", reason="needs moto[server] (the S3 test server): pip install 'moto[server]'")
pytest.importorskip("dvc_s3", reason="needs the DVC S3 plugin: pip install dvc-s3")
boto3 = pytest.importorskip("boto3")

BUCKET = "prefshift-dvc"
STAGE = """\
import json, os
from pathlib import Path
import yaml

scale = yaml.safe_load(Path("params.yaml").read_text())["scale"]
values = [int(line) * scale for line in Path("input.txt").read_text().split()]
Path("out").mkdir(exist_ok=True)
Path("out/result.txt").write_text("".join(f"{v}\\n" for v in values))
Path("out/sum.json").write_text(json.dumps({"sum": sum(values)}))
with open(os.environ["RUNS_LOG"], "a") as log:
    log.write("run\\n")
"""
DVC_YAML = """\
stages:
  make:
    cmd: python make.py
    deps: [make.py, input.txt]
    params: [scale]
    outs: [out]
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def s3_endpoint(tmp_path: Path) -> Iterator[str]:
    """A moto S3 server on a free local port, stopped on teardown whatever the test did."""
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log = (tmp_path / "moto.log").open("w")
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            if server.poll() is not None:
                pytest.fail(
                    f"moto server exited with {server.returncode}: {(tmp_path / 'moto.log').read_text()}"
                )
            try:
                with urllib.request.urlopen(url, timeout=1):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail(f"moto server did not answer on {url} within 30 s")
                time.sleep(0.2)
        yield url
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        log.close()


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """Dummy credentials only; no user AWS/git/DVC config leaks into the test."""
    home = tmp_path / "home"
    home.mkdir()
    return {
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "HOME": str(home),
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_CONFIG_FILE": str(home / "aws-config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(home / "aws-credentials"),
        "DVC_NO_ANALYTICS": "1",
        "DVC_SITE_CACHE_DIR": str(tmp_path / "dvc-site-cache"),
        "GIT_AUTHOR_NAME": "test",
        "GIT_AUTHOR_EMAIL": "test@example.com",
        "GIT_COMMITTER_NAME": "test",
        "GIT_COMMITTER_EMAIL": "test@example.com",
        "RUNS_LOG": str(tmp_path / "runs.log"),
    }


def _run(cmd: list[str], cwd: Path, env: dict[str, str]) -> str:
    result = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, f"{' '.join(cmd)} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def _dvc(args: list[str], cwd: Path, env: dict[str, str]) -> str:
    return _run([sys.executable, "-m", "dvc", *args], cwd, env)


def _bucket_keys(endpoint: str) -> list[str]:
    s3 = boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    return sorted(item["Key"] for item in s3.list_objects_v2(Bucket=BUCKET).get("Contents", []))


def test_push_to_s3_and_pull_into_a_fresh_clone_reruns_nothing(tmp_path, s3_endpoint, env):
    boto3.client(
        "s3",
        endpoint_url=s3_endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    ).create_bucket(Bucket=BUCKET)

    origin = tmp_path / "origin"
    origin.mkdir()
    (origin / "make.py").write_text(STAGE)
    (origin / "input.txt").write_text("1\n2\n3\n")
    (origin / "params.yaml").write_text("scale: 3\n")
    (origin / "dvc.yaml").write_text(DVC_YAML)
    _run(["git", "init", "-q", "-b", "main"], origin, env)
    _dvc(["init", "-q"], origin, env)
    _dvc(["remote", "add", "-d", "team", f"s3://{BUCKET}/cache"], origin, env)
    _dvc(["remote", "modify", "team", "endpointurl", s3_endpoint], origin, env)
    _dvc(["repro", "-q"], origin, env)
    _run(["git", "add", "."], origin, env)
    _run(["git", "commit", "-q", "-m", "stage, lock, remote"], origin, env)
    assert (origin / "out" / "result.txt").read_text() == "3\n6\n9\n"
    assert json.loads((origin / "out" / "sum.json").read_text()) == {"sum": 18}
    assert "testing" not in (origin / ".dvc" / "config").read_text(), "credentials must stay out of the repo"

    _dvc(["push", "-q"], origin, env)
    keys = _bucket_keys(s3_endpoint)
    assert len(keys) == 3, keys  # the two files of out/ and its .dir manifest
    assert all(key.startswith("cache/files/md5/") for key in keys), keys

    clone = tmp_path / "clone"
    _run(["git", "clone", "-q", str(origin), str(clone)], tmp_path, env)
    assert not (clone / "out").exists()
    _dvc(["pull", "-q"], clone, env)
    for name in ("result.txt", "sum.json"):
        assert (clone / "out" / name).read_bytes() == (origin / "out" / name).read_bytes()

    assert json.loads(_dvc(["status", "--json"], clone, env)) == {}
    _dvc(["repro", "-q"], clone, env)
    assert Path(env["RUNS_LOG"]).read_text() == "run\n", "the clone re-ran a stage whose outputs it pulled"
