"""MLflow tracking against real sqlite stores (the real-server case is in test_registry.py)."""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow import MlflowClient

from mlflow_support import free_port, running_server, seed_database
from prefshift.config.params import Params
from prefshift.core.errors import PrefshiftError
from prefshift.core.paths import Layout
from prefshift.tracking import runs as tracking
from signal_support import default_stops

FAKE_TOKEN = "hf_FAKEtoken1234567890abcdef"


def _git_repo(path: Path) -> str:
    path.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
    }
    (path / "README.md").write_text("x\n")
    for args in (["init", "-q"], ["add", "README.md"], ["commit", "-q", "-m", "init"]):
        subprocess.run(["git", *args], cwd=path, check=True, env=env)
    return subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=path, capture_output=True, text=True
    ).stdout.strip()


@pytest.fixture
def project(tmp_path, tmp_path_factory, monkeypatch):
    """A git repo as the project root; no tracking env, a fake HF token in the environment."""
    root = tmp_path / "repo"
    commit = _git_repo(root)
    seed_database(tmp_path_factory, root / "mlflow.db")
    seed_database(tmp_path_factory, root / ".prefshift" / "offline.db")
    for name in ("MLFLOW_TRACKING_URI", "DVC_ROOT", "DVC_STAGE", tracking.PIPELINE_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_TOKEN", FAKE_TOKEN)
    monkeypatch.chdir(root)
    return root, commit


def _client(root: Path) -> MlflowClient:
    return MlflowClient(f"sqlite:///{root / 'mlflow.db'}")


def test_stage_runs_log_config_tags_metrics_under_one_pipeline_parent(project, monkeypatch):
    root, commit = project
    monkeypatch.setenv(tracking.PIPELINE_ENV, "pr-unit")
    params = Params()
    params.data.sources = {"x": {"hf_id": FAKE_TOKEN}}  # a secret pasted into params must still not leak
    layout = Layout(Path("."), seed=0)
    manifest = layout.split_manifest
    manifest.parent.mkdir(parents=True)
    manifest.write_text('{"version": "v1"}')

    with tracking.stage_run(params, layout, "train", "naive") as run:
        for step, loss in enumerate([0.7, 0.6, 0.5]):
            run.log_metrics({"loss": loss}, step=step)
        run.log_metrics({"id": {"acc": 61.5}, "pgr": None})
        run.set_tags({"extra": "yes"})
    with tracking.stage_run(params, layout, "evaluate", "naive") as other:
        other.log_dict({"wrg": 1.0}, "metrics.json")

    client = _client(root)
    first, second = client.get_run(run.run_id), client.get_run(other.run_id)
    parent_id = first.data.tags["mlflow.parentRunId"]
    assert parent_id == second.data.tags["mlflow.parentRunId"]
    parent = client.get_run(parent_id)
    assert parent.data.tags[tracking.PIPELINE_TAG] == "pr-unit"
    assert first.info.status == "FINISHED"

    tags = first.data.tags
    expected = {
        "git.commit": commit,
        "git.dirty": "false",
        "stage": "train",
        "method": "naive",
        "dvc.stage": "train@naive",  # as DVC names the per-method stage (every seed)
        "data.source": "syn_help_forum",
        "data.targets": "syn_help_instruct,syn_help_chat",
        "seed": "0",
        "trust_remote_code": "false",
        tracking.PIPELINE_TAG: "pr-unit",
        "data.split_manifest.sha256": hashlib.sha256(b'{"version": "v1"}').hexdigest(),
        "extra": "yes",
    }
    assert {k: tags.get(k) for k in expected} == expected
    assert first.data.params["anchor.lambda"] == "1.0"
    assert first.data.params["data.targets"] == '["syn_help_instruct", "syn_help_chat"]'
    assert first.data.metrics == {"loss": 0.5, "id.acc": 61.5}
    assert [m.step for m in client.get_metric_history(run.run_id, "loss")] == [0, 1, 2]

    config = Path(client.download_artifacts(run.run_id, "config/params.yaml", str(root / "dl"))).read_text()
    assert "lambda: 1.0" in config
    logged = [*first.data.params.values(), *first.data.tags.values(), *parent.data.tags.values(), config]
    assert not [text for text in logged if FAKE_TOKEN in text]
    assert first.data.params["data.sources.x.hf_id"] == "<redacted $HF_TOKEN>"
    assert (root / "mlartifacts").is_dir()


def test_failed_stage_marks_its_run_failed(project, monkeypatch):
    root, _ = project
    monkeypatch.setenv(tracking.PIPELINE_ENV, "pr-fail")
    with (
        pytest.raises(RuntimeError),
        tracking.stage_run(Params(), Layout(Path("."), seed=0), "teacher") as run,
    ):
        raise RuntimeError("boom")
    assert _client(root).get_run(run.run_id).info.status == "FAILED"


def test_pipeline_id_outside_dvc_follows_code_and_params(project):
    layout = Layout(Path("."), seed=0)
    base = tracking.pipeline_run_id(Params(), layout)
    assert base == tracking.pipeline_run_id(Params(), layout)
    changed = Params()
    changed.anchor.lam = 0.01
    assert tracking.pipeline_run_id(changed, layout) != base


def test_dvc_root_wins_for_the_default_database(project, monkeypatch, tmp_path):
    monkeypatch.setenv("DVC_ROOT", str(tmp_path / "original"))
    assert (
        tracking.tracking_uri(Layout(Path("."), seed=0)) == f"sqlite:///{tmp_path / 'original' / 'mlflow.db'}"
    )


def test_a_project_in_a_folder_of_its_git_repository_keeps_one_database_in_and_out_of_stages(
    monkeypatch, tmp_path
):
    """In a monorepo's `ml/` (`dvc init --subdir`), DVC runs each stage with DVC_ROOT=ml, so the
    stages logged to ml/mlflow.db, while a command outside a stage took the repository's top: a
    sweep's points logged to mono/mlflow.db, apart from the project's other runs. Both are ml's now."""
    monkeypatch.delenv("DVC_ROOT", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    ml = (tmp_path / "mono" / "ml").resolve()
    (ml / ".dvc").mkdir(parents=True)
    (ml / "src").mkdir()
    subprocess.run(["git", "init", "-q"], cwd=tmp_path / "mono", check=True)
    outside = [tracking.tracking_uri(Layout(start, seed=0)) for start in (ml, ml / "src")]
    monkeypatch.setenv("DVC_ROOT", str(ml))
    assert outside == [tracking.tracking_uri(Layout(ml, seed=0))] * 2 == [f"sqlite:///{ml / 'mlflow.db'}"] * 2


def test_unreachable_server_fails_naming_the_uri_unless_optional(project, monkeypatch):
    root, _ = project
    uri = f"http://127.0.0.1:{free_port()}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv(tracking.PIPELINE_ENV, "pr-down")
    with (
        pytest.raises(tracking.TrackingError, match=uri.replace(".", r"\.")),
        tracking.stage_run(Params(), Layout(Path("."), seed=0), "teacher"),
    ):
        pytest.fail("the stage body must not run")

    optional = Params()
    optional.tracking.required = False
    with tracking.stage_run(optional, Layout(Path("."), seed=0), "teacher") as run:
        run.log_metrics({"loss": 1.0})
    offline = MlflowClient(f"sqlite:///{root / '.prefshift' / 'offline.db'}")
    assert offline.get_run(run.run_id).data.metrics == {"loss": 1.0}


def test_input_hashes_equal_what_dvc_records(project):
    root, _ = project
    subprocess.run([sys.executable, "-m", "dvc", "init", "-q"], cwd=root, check=True)
    (root / "data").mkdir()
    (root / "data" / "a.txt").write_text("alpha\n")
    (root / "data" / "sub").mkdir()
    (root / "data" / "sub" / "b.bin").write_bytes(b"\x00\x01\r\n")
    (root / "cfg.txt").write_text("one\n")
    (root / "dvc.yaml").write_text(
        "stages:\n  work:\n    foreach: [m1]\n    do:\n      cmd: cp cfg.txt out_${item}.txt\n"
        "      deps: [data, cfg.txt]\n      outs:\n        - out_${item}.txt\n"
    )
    ours = tracking.input_hashes(Layout(root, seed=0), "work@m1")
    subprocess.run([sys.executable, "-m", "dvc", "repro", "-q"], cwd=root, check=True)
    import yaml

    lock = yaml.safe_load((root / "dvc.lock").read_text())
    recorded = {f"dvc.dep.{d['path']}": d["md5"] for d in lock["stages"]["work@m1"]["deps"]}
    assert ours == recorded
    assert ours["dvc.dep.data"].endswith(".dir")


def test_stages_of_one_dvc_repro_share_a_pipeline_id_and_the_next_repro_gets_another(project):
    import yaml

    root, _ = project
    subprocess.run([sys.executable, "-m", "dvc", "init", "-q"], cwd=root, check=True)
    write_id = (
        "from pathlib import Path; from prefshift.config.params import Params; "
        "from prefshift.core.paths import Layout; "
        "from prefshift.tracking.runs import pipeline_run_id; "
        "Path('{out}').write_text(pipeline_run_id(Params(), Layout(seed=0)))"
    )
    stages = {
        "first": {"cmd": f'{sys.executable} -c "{write_id.format(out="id_a")}"', "outs": ["id_a"]},
        "second": {
            "cmd": f'{sys.executable} -c "{write_id.format(out="id_b")}"',
            "deps": ["id_a"],
            "outs": ["id_b"],
        },
    }
    (root / "dvc.yaml").write_text(yaml.safe_dump({"stages": stages}))

    def repro(*extra: str) -> tuple[str, str]:
        subprocess.run([sys.executable, "-m", "dvc", "repro", "-q", *extra], cwd=root, check=True)
        return (root / "id_a").read_text(), (root / "id_b").read_text()

    first_a, first_b = repro()
    again_a, again_b = repro("-f")
    assert first_a == first_b
    assert again_a == again_b
    assert again_a != first_a
    assert first_a.startswith("pr-")


@pytest.mark.slow
def test_server_dropping_mid_run_loses_nothing_and_sync_uploads_the_run(project, monkeypatch, tmp_path):
    from prefshift.tracking.sync import REPLACED_TAG, sync

    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv(tracking.PIPELINE_ENV, "pr-outage")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    params = Params()
    params.tracking.required = False
    server_dir = tmp_path / "server"

    stage = tracking.stage_run(params, Layout(Path("."), seed=0), "train", "naive")
    with running_server(server_dir, port):
        run = stage.__enter__()
        remote_id = run.run_id
        run.log_metrics({"loss": 0.9}, step=0)
    run.log_metrics({"loss": 0.8}, step=1)
    stage.__exit__(None, None, None)
    assert tracking.is_offline(run.uri)

    with running_server(server_dir, port):
        result = sync(Layout(Path("."), seed=0))
        assert len(result["copied"]) == 1
        client = MlflowClient(uri)
        uploaded = client.get_run(result["copied"][0]["run"])
        history = [(m.step, m.value) for m in client.get_metric_history(uploaded.info.run_id, "loss")]
        assert history == [(0, 0.9), (1, 0.8)]
        assert uploaded.info.status == "FINISHED"
        assert uploaded.data.params["anchor.lambda"] == "1.0"
        assert [f.path for f in client.list_artifacts(uploaded.info.run_id, "config")] == [
            "config/params.yaml"
        ]
        stub = client.get_run(remote_id)
        assert stub.info.status == "FAILED"
        assert stub.data.tags[REPLACED_TAG] == uploaded.info.run_id
        assert uploaded.data.tags["mlflow.parentRunId"] == stub.data.tags["mlflow.parentRunId"]
        assert sync(Layout(Path("."), seed=0))["copied"] == []


def test_ui_serves_the_project_database_and_refuses_a_remote_server(project, monkeypatch):
    from prefshift.tracking import ui

    root, _ = project
    cmd = ui.command(Layout(Path("."), seed=0), "127.0.0.1", 5123)
    assert cmd[1:] == [
        "-m", "mlflow", "ui", "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}",
        "--host", "127.0.0.1", "--port", "5123",
    ]  # fmt: skip
    assert ui.command(Layout(Path("."), seed=0), "127.0.0.1", 5123, workers=1)[-2:] == ["--workers", "1"]
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://tracking.example:5000")
    with pytest.raises(PrefshiftError, match=r"server http://tracking\.example:5000: open it in a browser"):
        ui.command(Layout(Path("."), seed=0), "127.0.0.1", 5123)


STAGE_THAT_WAITS = """
import sys, time
from pathlib import Path
from prefshift.tracking import runs as tracking
from prefshift.config.params import Params
from prefshift.core.paths import Layout

with tracking.stage_run(Params(), Layout(Path("."), seed=0), "train", "naive") as run:
    print(run.run_id, flush=True)
    time.sleep(600)
"""


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_a_stage_stopped_by_a_signal_ends_its_run_killed_and_exits_by_it(project, signum):
    """Before, SIGTERM's default action ended the process with the run RUNNING for good."""
    root, _ = project
    child = subprocess.Popen(
        [sys.executable, "-c", STAGE_THAT_WAITS],
        cwd=root,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=default_stops,  # a test run under nohup would hand SIGHUP on ignored
    )
    try:
        run_id = child.stdout.readline().strip()  # printed once the run exists; '' if the child died
        assert run_id, child.stderr.read()
        assert _client(root).get_run(run_id).info.status == "RUNNING"
        child.send_signal(signum)
        assert child.wait(timeout=300) == 128 + signum
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    info = _client(root).get_run(run_id).info
    assert (info.status, info.end_time is not None) == ("KILLED", True)
    assert "marked KILLED" in child.stderr.read()


def test_ctrl_c_ends_the_run_killed_and_an_error_failed(project, monkeypatch):
    root, _ = project
    monkeypatch.setenv(tracking.PIPELINE_ENV, "pr-stop")
    with (
        pytest.raises(KeyboardInterrupt),
        tracking.stage_run(Params(), Layout(Path("."), seed=0), "train") as run,
    ):
        raise KeyboardInterrupt
    assert _client(root).get_run(run.run_id).info.status == "KILLED"
    with pytest.raises(OSError), tracking.stage_run(Params(), Layout(Path("."), seed=0), "train") as run:
        raise OSError("disk full")
    assert _client(root).get_run(run.run_id).info.status == "FAILED"
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the handlers are the caller's again


def test_a_copied_project_refuses_to_log_artifacts_into_the_original(project, monkeypatch, tmp_path):
    """MLflow keeps the absolute artifact path of the database's first home; before, the copy's
    runs wrote their artifacts into the original project."""
    root, _ = project
    with tracking.stage_run(Params(), Layout(Path("."), seed=0), "teacher") as run:
        run.log_text("first home", "note.txt")
    before = sorted((root / "mlartifacts").rglob("*"))
    copy = tmp_path / "elsewhere" / "copy"
    shutil.copytree(root, copy, symlinks=True)
    monkeypatch.chdir(copy)
    with (
        pytest.raises(tracking.MovedDatabaseError) as err,
        tracking.stage_run(Params(), Layout(Path("."), seed=0), "teacher"),
    ):
        pytest.fail("the stage must not start")
    message = str(err.value)
    assert f"keeps its artifacts in {root / 'mlartifacts'}, not in {copy / 'mlartifacts'}" in message
    assert "move mlflow.db and mlartifacts/ aside" in message and "tracking.experiment" in message
    assert sorted((root / "mlartifacts").rglob("*")) == before  # nothing written into the original

    changed = Params()
    changed.tracking.experiment = "copy"  # the fix the message gives: a new experiment lives here
    with tracking.stage_run(changed, Layout(Path("."), seed=0), "teacher") as run:
        run.log_text("second home", "note.txt")
    artifact_uri = MlflowClient(f"sqlite:///{copy / 'mlflow.db'}").get_run(run.run_id).info.artifact_uri
    assert tracking._local_path(artifact_uri).is_relative_to(copy / "mlartifacts")
    monkeypatch.chdir(root)
    with tracking.stage_run(Params(), Layout(Path("."), seed=0), "teacher"):  # the original still logs
        pass


def test_run_names_follow_the_dvc_stage_names(monkeypatch):
    """A run per model and seed under its DVC stage's name; a stage keyed by a target names it."""
    from prefshift.tracking.runs import dvc_stage_name, run_name

    monkeypatch.delenv("DVC_STAGE", raising=False)
    assert (
        run_name("train", "naive", 0) == "train@naive-0"
        and dvc_stage_name("train", "naive", 0) == "train@naive"
    )
    assert run_name("teacher", None, 1) == "teacher@1" and dvc_stage_name("teacher", None, 1) == "teacher@1"
    item = ("downstream_target", "naive", 2, "helpful_base")
    assert run_name(*item) == "downstream_target@helpful_base/naive-2"
    assert dvc_stage_name(*item) == "downstream_target@helpful_base"
    monkeypatch.setenv("DVC_STAGE", "downstream_target@helpful_base")  # as DVC runs it
    assert dvc_stage_name(*item) == "downstream_target@helpful_base"
