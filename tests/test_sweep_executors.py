"""One set of tests for every executor: `local` (a pool), `local-gpus` (a fake device list: no GPU
here) and `slurm` (a real one-node cluster). The pipeline is a trivial two-stage DVC project
(seconds per point); the sweep's code path, git, DVC, SLURM, tmux, pipes and signals are real.

Each test runs a two-point grid whose second point holds mid-run, stops the sweep with SIGINT
(through a pipe whose reader has gone, or Ctrl-C in a tmux terminal), checks that nothing it
started is left and that the record says what it stopped, then resumes it: only the stopped
point reruns, and `dvc exp show` then carries both points. SIGTERM with the output in a file, and a
closed terminal (SIGHUP), are tried on the local executor: after the signal, every stop takes one path."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import sys
import time
from contextlib import ExitStack
from pathlib import Path

import pytest
import yaml

from e2e_project import REPO
from prefshift.core.host import core_share
from slurm_support import why_not
from sweep_support import (
    BIN,
    EVALUATE,
    a_project,
    first_done_second_running,
    in_group,
    in_sweep_env,
    is_alive,
    on_a_cluster,
    run_cli,
    run_ok,
    start_prefshift,
    through_pipe,
    through_tmux,
    toy_project,
    trace_records,
    wait_until,
    waits_or_runs,
)

EXECUTORS = {
    "local": ["--jobs", "2"],
    "local-gpus": ["--executor", "local-gpus", "--gpus", "0,1"],
    "slurm": ["--executor", "slurm", "--time", "10:00"],
}
RESUMED_WITH = {"local": ["--jobs", "1"], "local-gpus": ["--gpus", "0"], "slurm": ["--time", "20:00"]}
"""What each executor's resume asks anew: fewer slots, another device (point 1 ran on 1), more time."""


@pytest.mark.slow
@pytest.mark.parametrize("via", ["pipe", "tmux"])
@pytest.mark.parametrize("executor", list(EXECUTORS))
def test_a_stopped_sweep_leaves_no_process_and_resume_finishes_only_what_stopped(
    tmp_path, monkeypatch, executor, via
):
    from prefshift.pipeline.sweep.record import load
    from prefshift.pipeline.sweep.run import point_states

    cluster = executor == "slurm"
    if cluster and (reason := why_not()):
        pytest.skip(reason)
    if via == "tmux" and shutil.which("tmux") is None:
        pytest.skip("tmux not installed (apt-get install tmux)")
    env = in_sweep_env(monkeypatch)
    with ExitStack() as stack:
        root, trace = toy_project(tmp_path, env, remotes=cluster)
        if cluster:
            uri = on_a_cluster(stack, tmp_path, env, monkeypatch)
        scratch = tmp_path / "scratch"
        command = [str(BIN / "prefshift"), "sweep", "-S", "anchor.lambda=0.5,2", "--methods", "anchor_last"]
        command += ["--no-report", "--scratch", str(scratch), *EXECUTORS[executor]]
        if cluster:  # a user's template and environment that rename the job, move its logs, widen its
            # array: sbatch's command line, where the sweep's own options go, wins over them all
            template = tmp_path / "extra.sh"
            lines = ["--job-name=mine", f"--output={tmp_path}/elsewhere-%a.log", "--array=0-7"]
            template.write_text("".join(f"#SBATCH {line}\n" for line in lines))
            command += ["--sbatch-template", str(template)]
            env["SBATCH_JOB_NAME"] = "theirs"
            for tool in ("SQUEUE", "SCANCEL"):  # a user's filters: they hid the tasks from squeue
                env[f"{tool}_PARTITION"] = "elsewhere"
        (trace / "hold-2").write_text("")  # point 1 (lambda 2) holds mid-run until the sweep is stopped
        if via == "pipe":
            stop, status = through_pipe(command, root, env)
        else:
            stop, status = through_tmux(command, root, env, tmp_path)

        wait_until(first_done_second_running(scratch, trace, status), "point 0 done, point 1 running", 600)
        record = load(scratch, next(scratch.glob("*/sweep.json")).parent.name)
        refused = run_cli(
            "sweep", "resume", record.id, "--scratch", str(scratch), "--root", str(root), code=2
        )
        assert f"sweep {record.id} is being run by process" in refused.stderr, "a second driver is refused"
        task_pid = record.read_state(1)["pid"]
        (stage,) = [t for t in trace_records(trace, "start") if t["lambda"] == 2]
        assert stop() == 128 + signal.SIGINT

        assert not is_alive(stage["pid"]) and not is_alive(task_pid), "the stage and its task are gone"
        if not cluster:
            assert in_group(task_pid) == [], "nothing of the task's process group is left"
        record = load(scratch, record.id)
        assert record.data["stops"][-1]["signal"] == "SIGINT" and record.data["stops"][-1]["points"] == [1]
        assert point_states(record) == {0: "success", 1: "stopped"}
        status_lines = run_cli(
            "sweep", "status", record.id, "--scratch", str(scratch), "--root", str(root)
        ).stdout
        assert "stopped by SIGINT" in status_lines and "1  sweep-anchor.lambda-2  stopped" in status_lines

        (trace / "hold-2").unlink()
        # from another folder: the experiments still go to the project the sweep ran from
        where = ["--scratch", str(scratch), "--root", str(tmp_path)]
        resumed = run_cli("sweep", "resume", record.id, *RESUMED_WITH[executor], *where)
        assert "rerunning point 1 (sweep-anchor.lambda-2, stopped)" in resumed.stderr
        if cluster:
            from mlflow import MlflowClient

            client = MlflowClient(uri)
            runs = client.search_runs([client.get_experiment_by_name("cluster-sweep").experiment_id])
            assert sorted(
                (r.data.params["lambda"], r.info.status) for r in runs if r.info.status == "FINISHED"
            ) == [
                ("0.5", "FINISHED"),
                ("2", "FINISHED"),
            ]

    starts = trace_records(trace, "start")
    assert sorted(t["lambda"] for t in starts) == [0.5, 2, 2], "point 0 never reran"
    last = max((t for t in starts if t["lambda"] == 2), key=lambda t: t["start"])
    assert last["resumed"], "the resumed point found its checkpoint in its clone"
    if executor == "local":
        assert f"sweep {record.id}: 1 point(s) at a time" in resumed.stderr, "the resume took --jobs 1"
    elif executor == "local-gpus":
        assert last["devices"] == "0", "the resume ran the point with --gpus 0"
    else:
        assert "--time=20:00" in (record.folder / "job-2.sbatch").read_text()
        assert "dvc exp pull of 2 experiment(s)" in resumed.stderr
        assert "No experiments to pull" not in resumed.stderr, "DVC's word of refs it had already"
    assert (trace / "prepare-runs").read_text() == "prepare\n", "the tasks restored prepare's output"
    first_two = sorted(starts, key=lambda t: t["start"])[:2]  # ran at once (slurm: one after the other)
    if executor == "local-gpus":
        assert sorted(t["devices"] for t in first_two) == ["0", "1"], "one device each"
    if not cluster:  # two slots: each task gets half the cores for torch's threads (OMP_NUM_THREADS)
        assert [t["threads"] for t in first_two] == [str(core_share(2))] * 2
    show = json.loads(run_ok(["dvc", "exp", "show", "--json"], root, env))
    rows = {
        exp["name"]: exp["revs"][0]["data"]["metrics"]["reports/metrics.json"]["data"]["anchor_last"]["wrg"]
        for baseline in show
        for exp in baseline.get("experiments") or []
    }
    assert rows == {"sweep-anchor.lambda-0.5": 1.0, "sweep-anchor.lambda-2": 4.0}
    filed = json.loads(
        (root / "reports" / "sweeps" / "anchor_last__anchor.lambda=2__seed=0.json").read_text()
    )
    assert filed["wrg"] == 4.0 and filed["sweep"] == {"anchor.lambda": 2, "seed": 0}
    assert sorted(p.name for p in record.log(0).parent.iterdir()) == ["0.log", "1.log"]
    assert not list(tmp_path.glob("elsewhere-*")), "the template's --output and --array did not win"


@pytest.mark.slow
@pytest.mark.parametrize(
    "by", ["SIGTERM", "SIGHUP"], ids=["SIGTERM-output-in-a-file", "SIGHUP-closed-terminal"]
)
def test_sigterm_or_a_closed_terminal_stops_a_sweep_as_ctrl_c_does(tmp_path, monkeypatch, by):
    """The other stops the sweep names (run.py): SIGTERM (a scheduler's, `kill`, `timeout`) with its
    output going into a file, and the terminal it runs in closed under it (SIGHUP, its output then
    going nowhere). Each ends the running task's process group, records the stop under the
    signal's name, and leaves a sweep that resumes. On one executor: what follows the signal is
    the path SIGINT takes on every executor, above."""
    from prefshift.pipeline.sweep.record import load
    from prefshift.pipeline.sweep.run import point_states

    if by == "SIGHUP" and shutil.which("tmux") is None:
        pytest.skip("tmux not installed (apt-get install tmux)")
    env = in_sweep_env(monkeypatch)
    root, trace = toy_project(tmp_path, env, remotes=False)
    scratch = tmp_path / "scratch"
    args = ["sweep", "-S", "anchor.lambda=0.5,2", "--methods", "anchor_last", "--no-report"]
    args += ["--scratch", str(scratch), *EXECUTORS["local"]]
    (trace / "hold-2").write_text("")
    if by == "SIGTERM":
        sweep = start_prefshift(root, env, tmp_path / "sweep.log", *args)
        status = sweep.poll
    else:
        close, status = through_tmux([str(BIN / "prefshift"), *args], root, env, tmp_path, close=True)
    wait_until(first_done_second_running(scratch, trace, status), "point 0 done, point 1 running", 600)
    record = load(scratch, next(scratch.glob("*/sweep.json")).parent.name)
    task_pid = record.read_state(1)["pid"]
    (stage,) = [t for t in trace_records(trace, "start") if t["lambda"] == 2]
    if by == "SIGTERM":
        sweep.send_signal(signal.SIGTERM)
        assert sweep.wait(timeout=300) == 128 + signal.SIGTERM
        said = (tmp_path / "sweep.log").read_text()
        assert f"sweep {record.id}: stopped by SIGTERM; `prefshift sweep resume {record.id}`" in said
    else:
        close()

    assert not is_alive(stage["pid"]) and not is_alive(task_pid), "the stage and its task are gone"
    assert in_group(task_pid) == [], "nothing of the task's process group is left"
    record = load(scratch, record.id)
    assert record.data["stops"][-1]["signal"] == by and record.data["stops"][-1]["points"] == [1]
    assert point_states(record) == {0: "success", 1: "stopped"}
    (trace / "hold-2").unlink()
    resumed = run_cli("sweep", "resume", record.id, "--scratch", str(scratch), "--root", str(root))
    assert "rerunning point 1 (sweep-anchor.lambda-2, stopped)" in resumed.stderr
    assert sorted(t["lambda"] for t in trace_records(trace, "start")) == [0.5, 2, 2], "point 0 never reran"


@pytest.mark.slow
def test_a_local_sweep_refuses_an_uncommitted_workspace_as_slurm_does_and_names_a_failed_point(
    tmp_path, monkeypatch
):
    """A fresh clone after `dvc repro`: dvc.lock and the metrics untracked, and here a source file
    changed too. Each point clones the baseline commit on one machine as on a cluster, so the
    sweep refuses before anything runs and prints the command that commits it all. Once that ran,
    the points start from the commit (the shared stage is restored, the changed source is used); a
    failed point is named with why and its log. A later sweep of a finished point reuses its
    experiment instead of running it (test_sweep.py tries what else an experiment ref may hold)."""
    env = in_sweep_env(monkeypatch)
    root, trace = toy_project(tmp_path, env, remotes=False, committed=False)
    (root / "evaluate.py").write_text(EVALUATE.replace("2.0 * lam", "3.0 * lam"))  # not committed
    sweep = ["sweep", "--methods", "anchor_last", "--no-report", "--root", str(root)]
    refused = run_cli(*sweep, "-S", "anchor.lambda=0.5,13", code=2).stderr
    missing = "dvc.lock evaluate.py reports/metrics.json reports/metrics/anchor_last/seed-0.json"
    assert f"not committed: {missing.replace(' ', ', ')};" in refused
    command = f'git add {missing} && git commit -m "Baseline results for the sweep"'
    assert command in refused
    assert not (root / ".prefshift" / "sweeps").exists() and not trace_records(trace, "start")

    run_ok(["bash", "-c", command], root, env)
    failed = run_cli(*sweep, "-S", "anchor.lambda=0.5,13", code=2).stderr
    assert (
        "1 point(s) without a result" in failed
        and "1  sweep-anchor.lambda-13  failed  (failed during run:" in failed
    )
    log = Path(failed.split("log: ")[1].split()[0])
    assert "evaluate.py: no result for lambda 13" in log.read_text()

    again = run_cli(*sweep, "-S", "anchor.lambda=0.5").stderr
    filed = json.loads(
        (root / "reports" / "sweeps" / "anchor_last__anchor.lambda=0.5__seed=0.json").read_text()
    )
    assert filed["wrg"] == 1.5, "the committed evaluate.py ran"
    assert (trace / "prepare-runs").read_text() == "prepare\n", "prepare's output was restored"
    assert [t["lambda"] for t in trace_records(trace, "start")] == [0.5], "the finished point was reused"
    assert "experiment sweep-anchor.lambda-0.5 is on this baseline already" in again
    assert "dvc exp run" not in again  # the task's log, printed when it ends
    names = run_ok(["dvc", "exp", "list", "--name-only"], root, env).split()
    assert sorted(names) == ["sweep-anchor.lambda-0.5"]  # one experiment, not two
    assert run_ok(["git", "status", "--porcelain", "--untracked-files=no"], root, env) == ""


DIRECTORY_METRICS = """\
import json, pathlib, yaml
params = yaml.safe_load(open("params.yaml"))
headline = {"wrg": 2.0 * params["anchor"]["lambda"], "mean_aog": 0.5, "mean_nts": -0.5}
for method in ("anchor_last", "anchor_mid"):
    folder = pathlib.Path("reports/metrics") / method
    folder.mkdir(parents=True, exist_ok=True)
    for seed in params["seeds"]:
        (folder / f"seed-{seed}.json").write_text(json.dumps({"method": method, **headline}))
summary = {m: headline for m in ("anchor_last", "anchor_mid")}
pathlib.Path("reports/metrics.json").write_text(json.dumps(summary))
"""


@pytest.mark.slow
def test_a_project_whose_path_holds_a_space_a_hash_and_a_comma_shares_its_dvc_cache_as_it_links(
    tmp_path, monkeypatch
):
    """The clones' config.local got the project's cache path bare: after a space it was relative
    (every point recomputed the shared stages), after `#` cut short (DVC cached outside the project)
    and with `,` a list (every point failed). It also got nothing else of the project's own
    config.local: set to `cache.type hardlink`, each clone copied every output it restored."""
    env = in_sweep_env(monkeypatch)
    (odd := tmp_path / "my work#2,final").mkdir()
    root, trace = toy_project(odd, env, remotes=False)
    run_ok(["dvc", "config", "--local", "cache.type", "hardlink"], root, env)
    run_cli(
        "sweep", "-S", "anchor.lambda=0.5", "--methods", "anchor_last", "--no-report", "--root", str(root)
    )
    assert (trace / "prepare-runs").read_text() == "prepare\n", "prepare's output came from the cache"
    assert trace_records(trace, "start")[0]["links"] > 1, "the clone linked prepare's output, not a copy"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["my work#2,final"], "no cache outside it"
    filed = json.loads(
        (root / "reports" / "sweeps" / "anchor_last__anchor.lambda=0.5__seed=0.json").read_text()
    )
    assert filed["wrg"] == 1.0


@pytest.mark.slow
@pytest.mark.parametrize("executor", ["local", "slurm"])
def test_a_project_in_a_folder_of_its_git_repository_is_swept_filed_and_reused(
    tmp_path, monkeypatch, executor
):
    """A DVC project in a folder of a monorepo (`dvc init --subdir`): every point failed at its clone
    (`git clone` of a folder inside a repository: "does not exist"). A task now clones the repository
    and runs DVC in the project's folder of its clone; the experiment, its numbers and a repeated
    sweep's reuse come through as for a project at the top."""
    with a_project(tmp_path, monkeypatch, executor, subdir="ml") as (root, trace, env):
        sweep = ["sweep", "-S", "anchor.lambda=0.5", "--methods", "anchor_last", "--no-report"]
        sweep += ["--root", str(root), *EXECUTORS[executor]]
        run_cli(*sweep)
        run_cli(*sweep)
    assert len(trace_records(trace, "start")) == 1, "the repeated sweep reused the point"
    assert (trace / "prepare-runs").read_text() == "prepare\n", "the shared stage was restored"
    said = "".join(log.read_text() for log in (root / ".prefshift" / "sweeps").glob("*/logs/0.log"))
    assert "experiment sweep-anchor.lambda-0.5 is on this baseline already" in said
    if executor == "local":  # DVC's one line of counts, not its line per restored output
        assert re.search(r"the baseline's outputs, from the project's DVC cache: \d+ files? added", said)
        assert not re.search(r"^A\t", said, re.MULTILINE), said
    assert run_ok(["dvc", "exp", "list", "--name-only"], root, env).split() == ["sweep-anchor.lambda-0.5"]
    filed = root / "reports" / "sweeps" / "anchor_last__anchor.lambda=0.5__seed=0.json"
    assert json.loads(filed.read_text())["wrg"] == 1.0


def test_a_point_runs_the_baseline_s_code_where_prefshift_runs_from_the_project_s_source(
    tmp_path, monkeypatch
):
    """With prefshift run from the project's own source (an editable install, as `make` sets it
    up), a point's stages imported the workspace's copy, not the clone's: a point started after an
    edit ran the new code as an experiment of the baseline. They now import the clone's."""
    env = in_sweep_env(monkeypatch)
    root, trace = toy_project(tmp_path, env, remotes=False)
    shutil.copytree(REPO / "src" / "prefshift", root / "src" / "prefshift")
    run_ok(["git", "add", "src"], root, env)
    run_ok(["git", "commit", "-qm", "the project's own prefshift"], root, env)
    monkeypatch.setenv("PYTHONPATH", str(root / "src"))  # the tasks run the project's prefshift
    run_cli(
        "sweep", "-S", "anchor.lambda=0.5", "--methods", "anchor_last", "--no-report", "--root", str(root)
    )
    (record,) = trace_records(trace, "start")
    clone = Path(record["prefshift"]).parents[2]
    assert clone.parent.name == "clones" and clone.is_relative_to(root / ".prefshift" / "sweeps"), record
    said = "".join(log.read_text() for log in (root / ".prefshift" / "sweeps").glob("*/logs/0.log"))
    assert f"the stages import prefshift from {clone / 'src'}, the baseline's" in said


def _a_repository(folder: Path, file: str, env: dict[str, str]) -> Path:
    folder.mkdir()
    (folder / file).write_text(f"{file}\n")
    run_ok(["git", "init", "-q", "-b", "main"], folder, env)
    run_ok(["git", "add", "-A"], folder, env)
    run_ok(["git", "commit", "-qm", file], folder, env)
    return folder


def _with_submodules(tmp: Path, root: Path, env: dict[str, str]) -> None:
    """The toy project's report stage reads from a submodule `lib` and from `lib/inner`, nested in
    it; a third, `unused`, is registered but left out of the workspace (its URL leads nowhere).
    Reproduced and committed again (and pushed where it has an origin)."""
    submodule = ["git", "-c", "protocol.file.allow=always", "submodule", "--quiet"]
    inner = _a_repository(tmp / "inner-repo", "x.txt", env)
    lib = _a_repository(tmp / "lib-repo", "helper.txt", env)
    run_ok([*submodule, "add", str(inner), "inner"], lib, env)
    run_ok(["git", "commit", "-qm", "inner"], lib, env)
    run_ok([*submodule, "add", str(lib), "lib"], root, env)
    run_ok([*submodule, "update", "--init", "--recursive"], root, env)
    run_ok([*submodule, "add", str(_a_repository(tmp / "unused-repo", "y.txt", env)), "unused"], root, env)
    run_ok([*submodule, "deinit", "-f", "unused"], root, env)
    run_ok(["git", "config", "-f", ".gitmodules", "submodule.unused.url", str(tmp / "gone.git")], root, env)
    stages = yaml.safe_load((root / "dvc.yaml").read_text())
    stages["stages"]["report"]["deps"] += ["lib/helper.txt", "lib/inner/x.txt"]
    (root / "dvc.yaml").write_text(yaml.safe_dump(stages))
    run_ok(["dvc", "repro"], root, env)
    run_ok(["git", "add", "-A"], root, env)
    run_ok(["git", "commit", "-qm", "submodules"], root, env)
    if run_ok(["git", "remote"], root, env).strip():
        run_ok(["git", "push", "-q", "origin", "main"], root, env)


@pytest.mark.slow
@pytest.mark.parametrize("executor", ["local", "slurm"])
def test_a_project_with_submodules_has_them_checked_out_in_each_point_s_clone(
    tmp_path, monkeypatch, executor
):
    """A stage reading a submodule failed in every point: the task's clone held none (`No such file or
    directory: .../clones/0/lib/helper.txt`). A clone now checks out those the workspace has, nested
    ones too, at the commits its baseline records, and leaves out one the workspace leaves out."""
    with a_project(tmp_path, monkeypatch, executor) as (root, trace, env):
        _with_submodules(tmp_path, root, env)
        for baseline_trace in trace.glob("*-*.json"):
            baseline_trace.unlink()
        run_cli("sweep", "-S", "anchor.lambda=0.5", "--methods", "anchor_last", "--no-report",
                "--root", str(root), *EXECUTORS[executor])  # fmt: skip
    assert len(trace_records(trace, "end")) == 1, "the point's stage ran to its end in the clone"
    filed = root / "reports" / "sweeps" / "anchor_last__anchor.lambda=0.5__seed=0.json"
    assert json.loads(filed.read_text())["wrg"] == 1.0


@pytest.mark.slow
@pytest.mark.parametrize("executor", ["local", "slurm"])
def test_one_grid_swept_twice_at_once_trains_each_point_once(tmp_path, monkeypatch, executor):
    """Two sweeps of one grid started side by side each trained the point, and the second's push
    replaced the first's experiment. A task now holds the experiment's lock in the project: the
    other sweep's task waits for it, then reuses the experiment. A SLURM task took no such lock."""
    with a_project(tmp_path, monkeypatch, executor) as (root, trace, env):
        sweep = ["sweep", "-S", "anchor.lambda=2", "--methods", "anchor_last", "--no-report"]
        sweep += EXECUTORS[executor]
        (trace / "hold-2").write_text("")
        first = start_prefshift(root, env, tmp_path / "first.log", *sweep)
        wait_until(
            lambda: len(trace_records(trace, "start")) == 1, "the first sweep to run the point's stage", 300
        )
        second = start_prefshift(root, env, tmp_path / "second.log", *sweep)
        waits = waits_or_runs(
            trace, root / ".prefshift" / "sweeps", "a task of another sweep; waiting for it to end"
        )
        wait_until(waits, "the second sweep's task to wait for the experiment, or to run it")
        assert len(trace_records(trace, "start")) == 1, (
            "the second sweep did not train the point beside the first"
        )
        (trace / "hold-2").unlink()
        assert first.wait(timeout=300) == 0, (tmp_path / "first.log").read_text()
        assert second.wait(timeout=300) == 0, (tmp_path / "second.log").read_text()
    assert len(trace_records(trace, "start")) == 1, "the point trained once"
    said = "".join(log.read_text() for log in (root / ".prefshift" / "sweeps").glob("*/logs/0.log"))
    assert "experiment sweep-anchor.lambda-2 is on this baseline already" in said
    names = run_ok(["dvc", "exp", "list", "--name-only"], root, env).split()
    assert names == ["sweep-anchor.lambda-2"]


@pytest.mark.slow
def test_a_second_sweep_waits_for_the_work_a_killed_sweep_left_on_the_same_point(tmp_path, monkeypatch):
    """Sweep and task killed (`kill -9`, the OOM killer): the experiment's lock went with the task,
    while its dvc and stage trained on, so another sweep of the point started it again beside them.
    The task that takes the experiment's lock now waits for the point lock its last holder wrote
    down, which that work holds."""
    from prefshift.pipeline.sweep.record import load

    env = in_sweep_env(monkeypatch)
    root, trace = toy_project(tmp_path, env, remotes=False)
    sweep = ["sweep", "-S", "anchor.lambda=2", "--methods", "anchor_last", "--no-report", "--root", str(root)]
    (trace / "hold-2").write_text("")
    first = start_prefshift(root, env, tmp_path / "first.log", *sweep, "--scratch", str(tmp_path / "a"))
    wait_until(
        lambda: len(trace_records(trace, "start")) == 1, "the first sweep to run the point's stage", 300
    )
    task = load(tmp_path / "a", next((tmp_path / "a").iterdir()).name).read_state(0)["pid"]
    stage = trace_records(trace, "start")[0]["pid"]
    for pid in (first.pid, task):
        os.kill(pid, signal.SIGKILL)
    first.wait()
    assert is_alive(stage)
    second = start_prefshift(root, env, tmp_path / "second.log", *sweep, "--scratch", str(tmp_path / "b"))
    waits = waits_or_runs(trace, tmp_path / "b", "killed task of another sweep runs on; waiting")
    wait_until(waits, "the second sweep's task to wait for the killed sweep's work, or to run")
    assert len(trace_records(trace, "start")) == 1, (
        "the second sweep did not train the point beside that work"
    )
    (trace / "hold-2").unlink()
    assert second.wait(timeout=300) == 0, (tmp_path / "second.log").read_text()
    (orphan,) = [t for t in trace_records(trace, "end") if t["pid"] == stage]
    assert all(t["start"] > orphan["end"] for t in trace_records(trace, "start")[1:]), "none ran beside it"


@pytest.mark.slow
def test_the_documented_baseline_commit_then_a_sweep_runs(tmp_path, monkeypatch):
    """docs/sweeps.md's commit line, verbatim, on a project whose metrics are directories, as the
    embedded default's are (`reports/metrics/<method>`). Before, the sweep then stopped with a
    StopIteration traceback (a committed `cache: false` directory left no untracked ancestor to
    carry). The full workflow, report included, runs on the real pipeline in test_pipeline_e2e.py."""
    env = in_sweep_env(monkeypatch)
    root = tmp_path / "project"
    root.mkdir()
    shutil.copy2(REPO / "params.yaml", root / "params.yaml")
    (root / "evaluate.py").write_text(DIRECTORY_METRICS)
    outputs = ["reports/metrics/anchor_last", "reports/metrics/anchor_mid", "reports/metrics.json"]
    stage = {"cmd": f"{sys.executable} evaluate.py", "deps": ["evaluate.py"], "params": ["anchor.lambda"]}
    stage["metrics"] = [{path: {"cache": False}} for path in outputs]
    (root / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"report": stage}}))
    run_ok(["git", "init", "-q"], root, env)
    run_ok(["dvc", "init", "-q"], root, env)
    run_ok(["git", "add", "-A"], root, env)
    run_ok(["git", "commit", "-qm", "sources"], root, env)
    run_ok(["dvc", "repro"], root, env)
    page = (REPO / "docs" / "sweeps.md").read_text()
    commit, sweep = (
        page.split("### The baseline workflow", 1)[1].split("```bash\n", 1)[1].split("```")[0].split("\n")[:2]
    )
    run_ok(["bash", "-c", commit], root, env)
    assert run_ok(["git", "status", "--porcelain", "--untracked-files=no"], root, env) == ""
    run_ok(["bash", "-c", f"{sweep} --no-report"], root, env)  # the toy project has no report to rebuild
    seeds = yaml.safe_load((root / "params.yaml").read_text())["seeds"]
    filed = sorted(p.name for p in (root / "reports" / "sweeps").iterdir())
    lambdas = ("0.5", "2")
    assert filed == sorted(
        f"{m}__anchor.lambda={v}__seed={k}.json"
        for m in ("anchor_last", "anchor_mid")
        for v in lambdas
        for k in seeds
    )


@pytest.mark.slow
def test_a_task_killed_alone_leaves_its_point_running_until_its_work_ends(tmp_path, monkeypatch):
    """`kill -9` of a task's pid alone (by hand, or the OOM killer) leaves its dvc and stage training
    on in the point's clone. The point counted as stopped at once: the sweep freed its slot beside
    them, and a resume started a second dvc in the same clone. With the sweep alive, the sweep now
    ends what the task left. With the sweep killed too, the point counts as running while any of it
    runs (the point's lock is handed down), so a resume waits for it instead of starting it again,
    and reruns it once that work has ended without a result."""
    from prefshift.pipeline.sweep.record import load
    from prefshift.pipeline.sweep.run import point_states

    env = in_sweep_env(monkeypatch)
    root, trace = toy_project(tmp_path, env, remotes=False)
    scratch, log = tmp_path / "scratch", tmp_path / "sweep.log"
    sweep = ["sweep", "-S", "anchor.lambda=2", "--methods", "anchor_last", "--no-report"]
    at = ["--scratch", str(scratch), "--root", str(root)]
    (trace / "hold-2").write_text("")  # the point's stage holds until this goes

    def running(attempt: int) -> tuple[str, int, int]:
        """(sweep id, task pid, stage pid) once attempt `attempt` of the point runs its stage."""
        wait_until(
            lambda: len(trace_records(trace, "start")) == attempt, f"attempt {attempt} to run its stage", 300
        )
        record = load(scratch, next(scratch.glob("*/sweep.json")).parent.name)
        return record.id, record.read_state(0)["pid"], trace_records(trace, "start")[-1]["pid"]

    driver = start_prefshift(root, env, log, *sweep, *at)
    sweep_id, task, stage = running(1)
    os.kill(task, signal.SIGKILL)
    assert driver.wait(timeout=300) == 2, log.read_text()  # no result for the point
    assert not is_alive(stage) and in_group(task) == [], "the sweep ended what the task left"
    assert "point 0: its task ended and left processes of its group; ended them" in log.read_text()
    assert point_states(load(scratch, sweep_id)) == {0: "stopped"}

    driver = start_prefshift(root, env, log, "sweep", "resume", sweep_id, *at)
    _, task, stage = running(2)
    for pid in (driver.pid, task):  # the sweep, then its task: the task's dvc and stage work on
        os.kill(pid, signal.SIGKILL)
    driver.wait()
    assert is_alive(stage) and point_states(load(scratch, sweep_id)) == {0: "running"}
    (trace / "hold-2").unlink()  # the orphaned attempt may now end, without a result (its task is gone)
    waited = run_cli("sweep", "resume", sweep_id, *at).stderr
    assert "waiting for point 0 (sweep-anchor.lambda-2, running)" in waited
    assert "point 0: the work left by its earlier task ended without a result; rerunning it" in waited
    assert not is_alive(stage) and in_group(task) == []
    assert point_states(load(scratch, sweep_id)) == {0: "success"}
    (orphan,) = [t for t in trace_records(trace, "end") if t["pid"] == stage]
    starts = trace_records(trace, "start")
    assert all(t["start"] > orphan["end"] for t in starts[2:]), "no attempt beside the orphaned one"
    assert all(t["resumed"] for t in starts[1:]), "each later attempt went on"
    filed = json.loads(
        (root / "reports" / "sweeps" / "anchor_last__anchor.lambda=2__seed=0.json").read_text()
    )
    assert filed["wrg"] == 4.0


@pytest.mark.slow
def test_a_resume_waiting_for_a_dead_task_s_work_gives_it_a_slot_and_its_stop_ends_that_work(
    tmp_path, monkeypatch
):
    """Sweep and task of point 0 killed (`kill -9`), its stage still working. A resume waits for
    that work, as the test above shows. It started point 1 beside it, past `--jobs 1`; and Ctrl-C on
    the resume ended point 1 alone, leaving point 0's work running, which no command could then stop.
    The awaited work now holds a slot, and a stop ends it as it ends the tasks the resume started."""
    from prefshift.pipeline.sweep.record import load
    from prefshift.pipeline.sweep.run import point_states

    env = in_sweep_env(monkeypatch)
    root, trace = toy_project(tmp_path, env, remotes=False)
    scratch, log = tmp_path / "scratch", tmp_path / "sweep.log"
    at = ["--scratch", str(scratch), "--root", str(root)]
    (trace / "hold-2").write_text("")  # point 0 (lambda 2) holds mid-run until this goes

    driver = start_prefshift(
        root, env, log, "sweep", "-S", "anchor.lambda=2,3", "--methods", "anchor_last", "--no-report", *at
    )
    wait_until(lambda: len(trace_records(trace, "start")) == 1, "point 0 to run its stage", 300)
    record = load(scratch, next(scratch.glob("*/sweep.json")).parent.name)
    task, stage = record.read_state(0)["pid"], trace_records(trace, "start")[0]["pid"]
    for pid in (driver.pid, task):
        os.kill(pid, signal.SIGKILL)
    driver.wait()
    assert is_alive(stage) and point_states(record) == {0: "running", 1: "missing"}

    resumed = start_prefshift(root, env, log, "sweep", "resume", record.id, *at)
    wait_until(lambda: "rerunning point 1" in log.read_text(), "the resume to take its points")
    time.sleep(4)  # four of the pool's polls: time enough to start point 1, were a slot free
    assert [t["lambda"] for t in trace_records(trace, "start")] == [2], "point 1 waits for the slot"
    resumed.send_signal(signal.SIGINT)
    assert resumed.wait(timeout=120) == 130, log.read_text()
    assert not is_alive(stage) and in_group(task) == [], "the stop ended point 0's work"
    said = log.read_text()
    assert f"point 0: ended process group {task}" in said
    assert load(scratch, record.id).data["stops"][-1]["points"] == [0]
    assert point_states(load(scratch, record.id)) == {0: "stopped", 1: "missing"}

    (trace / "hold-2").unlink()
    run_cli("sweep", "resume", record.id, *at)
    assert point_states(load(scratch, record.id)) == {0: "success", 1: "success"}


@pytest.mark.slow
def test_a_task_tells_the_stages_dvc_recomputed_for_want_of_their_outputs_on_the_remote(
    tmp_path, monkeypatch
):
    """A cluster task pulls the shared stages' outputs from the DVC remote (`dvc exp run --pull`);
    one that cannot (a remote the node does not reach) recomputes them and says so in one log line,
    which the task keeps for status. Read from real DVC output, with and without the remote's data."""
    from prefshift.pipeline.sweep.commands import run_dvc
    from prefshift.pipeline.sweep.task import UNPULLED

    env = in_sweep_env(monkeypatch)
    root, trace = toy_project(tmp_path, env, remotes=True)
    said = []
    for attempt in ("empty remote", "pushed"):
        clone = tmp_path / attempt.replace(" ", "-")
        run_ok(["git", "clone", "-q", "-b", "main", str(tmp_path / "origin.git"), str(clone)], tmp_path, env)
        output = run_dvc(clone, ["exp", "run", "--pull", "-S", "anchor.lambda=0.5", "report"], echo=False)
        said.append(UNPULLED.findall(output))
        run_ok(["dvc", "push", "-q"], root, env)
    assert said == [["prepare"], []]
    assert (trace / "prepare-runs").read_text() == "prepare\nprepare\n", "recomputed once, then pulled"
