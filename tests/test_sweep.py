"""`prefshift sweep`: grid parsing, results and a real queue on a one-stage project. The real
one-point lambda sweep on the reproduced pipeline is in test_pipeline_e2e.py, beside the tests it
shares that pipeline with."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from e2e_project import REPO
from e2e_project import run as _run
from prefshift.core.errors import PrefshiftError
from prefshift.pipeline.sweep import (
    SweepError,
    experiment_name,
    experiment_rows,
    grid_points,
    parse_grid,
    sweep_filename,
)
from prefshift.pipeline.sweep_points import ablation_keys, replicate_seed


def test_grid_keeps_list_values_whole_and_crosses_axes():
    grid = parse_grid(["anchor.lambda=1e-4, 1", "anchor.mid_fractions=[0.25,0.5],[0.75]"])
    assert grid == {"anchor.lambda": ["1e-4", "1"], "anchor.mid_fractions": ["[0.25,0.5]", "[0.75]"]}
    assert grid_points(grid) == [
        {"anchor.lambda": "1e-4", "anchor.mid_fractions": "[0.25,0.5]"},
        {"anchor.lambda": "1e-4", "anchor.mid_fractions": "[0.75]"},
        {"anchor.lambda": "1", "anchor.mid_fractions": "[0.25,0.5]"},
        {"anchor.lambda": "1", "anchor.mid_fractions": "[0.75]"},
    ]


def test_seed_and_methods_make_a_replicate_and_anything_else_an_ablation():
    assert replicate_seed({"seed": 2}) == 2
    assert replicate_seed({"seed": 2, "methods": ["naive", "anchor_last"]}) == 2
    assert (
        replicate_seed({"seed": 2, "anchor.lambda": 1.0}) is None and replicate_seed({"methods": []}) is None
    )
    assert ablation_keys({"seed": 2, "methods": ["naive"], "anchor.lambda": 1.0}) == {"anchor.lambda"}


def test_names_are_readable_and_ref_safe():
    assert experiment_name({"anchor.lambda": "1e-4"}) == "sweep-anchor.lambda-1e-4"
    assert experiment_name({"anchor.mid_fractions": "[0.25, 0.5]"}) == "sweep-anchor.mid_fractions-0.25_0.5"
    assert sweep_filename("anchor_mid", {"anchor.mid_fractions": [0.25, 0.5]}) == (
        "anchor_mid__anchor.mid_fractions=[0.25,0.5].json"
    )


@pytest.mark.parametrize(
    ("specs", "message"),
    [
        ([], "nothing to sweep"),
        (["anchor.lambda"], "expected section.key=value"),
        (["anchor..lambda=1,2"], "has an empty part"),
        (["anchor.lambda=1,,2"], "empty value"),
        (["anchor.lambda=1", "anchor.lambda=2"], "given twice"),
    ],
)
def test_bad_grids_are_refused(specs, message):
    with pytest.raises(PrefshiftError, match=message):  # key errors come from config's -S parser
        parse_grid(specs)


@pytest.mark.parametrize(
    "specs",
    [
        ["anchor.lambda=1,1"],
        ["anchor.lambda=1,1.0"],
        ["anchor.lambda=1e-4,0.0001"],
        [
            "anchor.lambda=0.5,2",
            "seed=3",
            "anchor={lambda: 2}",
        ],  # two axes set one param: both points are one
        ["methods=[naive],['naive']"],
    ],
)
def test_grid_points_that_are_one_experiment_are_refused_before_anything_is_queued(tmp_path, specs):
    """Before, `-S anchor.lambda=1,1` queued two experiments of one name (and 1,1.0 two identical runs)."""
    from prefshift.pipeline import sweep

    shutil.copy2(REPO / "params.yaml", tmp_path / "params.yaml")
    with pytest.raises(SweepError, match="give the same params: list each value once") as err:
        sweep.run(tmp_path, specs)  # no git, DVC or queue here: refused before any of them is used
    assert "nothing was queued" in str(err.value)


def test_distinct_points_pass_the_duplicate_check():
    from prefshift.pipeline.sweep import check_distinct

    check_distinct(REPO / "params.yaml", grid_points(parse_grid(["anchor.lambda=1e-4,1e-2,1", "seed=1,2"])))


def test_copy_paths_carries_untracked_uncached_outputs_but_no_cached_ones(tmp_path):
    from prefshift.pipeline.sweep import copy_paths

    env = {**os.environ, **{f"GIT_{w}_{x}": "t" for w in ("AUTHOR", "COMMITTER") for x in ("NAME", "EMAIL")}}
    stages = {
        "a": {
            "cmd": "true",
            "outs": [{"reports/metrics/a.json": {"cache": False}}, {"reports/notes.txt": {"cache": False}}],
        },
        "b": {"cmd": "true", "outs": ["data/big", {"data/counts.json": {"cache": False}}]},
    }
    (tmp_path / "dvc.yaml").write_text(yaml.safe_dump({"stages": stages}))
    for rel in ("reports/metrics/a.json", "reports/notes.txt", "data/big/x", "data/counts.json"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("{}")
    (tmp_path / "dvc.lock").write_text("schema: '2.0'\nstages: {}\n")
    (tmp_path / "reports" / "keep.md").write_text("tracked\n")
    _run(["git", "init", "-q"], tmp_path, env)
    _run([str(Path(sys.executable).parent / "dvc"), "init", "-q"], tmp_path, env)
    _run(["git", "add", "dvc.yaml", "reports/keep.md", "reports/notes.txt"], tmp_path, env)
    # reports/ exists in the copy (keep.md), reports/metrics/ does not; data/ holds a cached out.
    assert copy_paths(tmp_path) == (["dvc.lock", "reports/metrics"], ["data/counts.json"])


def _row(name, state="success", wrg=1.5):
    """One `experiment_rows` row as `dvc exp show --json` yields it for a one-method sweep."""
    headline = {"wrg": wrg, "mean_aog": -0.5, "mean_nts": 0.0}
    metrics = {
        "reports/metrics/anchor_last/seed-0.json": {"method": "anchor_last", **headline},
        "reports/metrics.json": {"anchor_last": headline},
    }
    return {"name": name, "task_id": f"task-{name}", "state": state, "rev": "ab" * 20, "metrics": metrics}


def test_experiment_rows_read_queue_state_task_and_metrics_from_exp_show_json():
    show = [
        {"rev": "workspace", "experiments": None},
        {
            "rev": "c" * 40,
            "experiments": [
                {
                    "name": "sweep-anchor.lambda-1",
                    "executor": {"state": "success", "local": {"task_id": "f" * 40}},
                    "revs": [
                        {
                            "rev": "e" * 40,
                            "name": "sweep-anchor.lambda-1",
                            "data": {
                                "metrics": {
                                    "reports/metrics.json": {"data": {"anchor_last": {"wrg": 2.0}}},
                                    "reports/metrics/naive/seed-0.json": {
                                        "error": {"type": "FileNotFoundError"}
                                    },
                                }
                            },
                        }
                    ],
                },
                {"name": None, "executor": None, "revs": [{"rev": "d" * 40, "name": "exp-1", "data": None}]},
            ],
        },
    ]
    assert experiment_rows(show) == [
        {
            "name": "sweep-anchor.lambda-1",
            "task_id": "f" * 40,
            "state": "success",
            "rev": "e" * 40,
            "metrics": {
                "reports/metrics.json": {"anchor_last": {"wrg": 2.0}},
                "reports/metrics/naive/seed-0.json": None,
            },
        },
        {"name": "exp-1", "task_id": None, "state": None, "rev": "d" * 40, "metrics": {}},
    ]


def test_only_successful_experiments_with_every_headline_number_pass():
    from prefshift.core.paths import Layout
    from prefshift.pipeline.sweep import check_experiments, missing_numbers

    layout = Layout(Path("/project"), seed=0)
    good = _row("a")
    assert missing_numbers(good["metrics"], ["anchor_last"], layout) == []
    tasks = {"a": "task-a"}
    assert check_experiments([good], tasks, ["anchor_last"], layout)["a"]["rev"] == "ab" * 20

    bad_values = _row("b", wrg=float("nan"))
    bad_values["metrics"]["reports/metrics.json"]["anchor_last"]["mean_nts"] = True
    del bad_values["metrics"]["reports/metrics/anchor_last/seed-0.json"]["mean_aog"]
    assert missing_numbers(bad_values["metrics"], ["anchor_last"], layout) == [
        "reports/metrics/anchor_last/seed-0.json:wrg",
        "reports/metrics/anchor_last/seed-0.json:mean_aog",
        "reports/metrics.json:anchor_last.wrg",
        "reports/metrics.json:anchor_last.mean_nts",
    ]
    # A failed experiment's row carries the baseline's numbers: its state decides.
    rows = [good, bad_values, _row("c", state="failed")]
    tasks = {"a": "task-a", "b": "task-b", "c": "task-c", "d": "task-d"}
    with pytest.raises(SweepError) as err:
        check_experiments(rows, tasks, ["anchor_last"], layout)
    message = str(err.value)
    assert "b (ababab" in message and "reports/metrics/anchor_last/seed-0.json:wrg" in message
    assert "c: failed" in message and "d: task task-d is not in `dvc exp show`" in message
    assert "a:" not in message and "a (" not in message


def test_uncommitted_baseline_names_lock_and_metrics_not_in_head_with_the_command(tmp_path):
    from prefshift.pipeline.sweep import commit_command, uncommitted_baseline

    env = {**os.environ, **{f"GIT_{w}_{x}": "t" for w in ("AUTHOR", "COMMITTER") for x in ("NAME", "EMAIL")}}
    stages = {
        "ev": {"cmd": "true", "outs": ["scores"], "metrics": [{"reports/metrics/a.json": {"cache": False}}]},
        "report": {"cmd": "true", "metrics": [{"reports/metrics.json": {"cache": False}}]},
    }
    (tmp_path / "dvc.yaml").write_text(yaml.safe_dump({"stages": stages}))
    (tmp_path / "reports" / "metrics").mkdir(parents=True)
    for rel in ("reports/metrics/a.json", "reports/metrics.json"):
        (tmp_path / rel).write_text("{}\n")
    (tmp_path / "dvc.lock").write_text("schema: '2.0'\nstages: {}\n")
    _run(["git", "init", "-q"], tmp_path, env)
    _run([str(Path(sys.executable).parent / "dvc"), "init", "-q"], tmp_path, env)
    _run(["git", "add", "dvc.yaml", ".dvc", "reports/metrics.json"], tmp_path, env)
    _run(["git", "commit", "-qm", "base"], tmp_path, env)
    _run(["git", "add", "dvc.lock"], tmp_path, env)  # staged, as core.autostage leaves it: not in HEAD
    assert uncommitted_baseline(tmp_path) == ["dvc.lock", "reports/metrics/a.json"]
    (tmp_path / "reports" / "metrics.json").write_text('{"wrg": 1}\n')
    uncommitted = uncommitted_baseline(tmp_path)
    assert uncommitted == ["dvc.lock", "reports/metrics/a.json", "reports/metrics.json"]
    command = commit_command(uncommitted)
    assert command.startswith("git add dvc.lock reports/metrics/a.json reports/metrics.json && git commit")
    subprocess.run(command, shell=True, cwd=tmp_path, env=env, check=True, capture_output=True)
    assert uncommitted_baseline(tmp_path) == []


EVALUATE = """\
import json, pathlib, sys, yaml
lam = yaml.safe_load(open("params.yaml"))["anchor"]["lambda"]
if lam == 13:
    sys.exit(f"evaluate.py: no result for lambda {lam}")
headline = {"wrg": 2.0 * lam, "mean_aog": float(lam), "mean_nts": -1.0 * lam}
for seed in yaml.safe_load(open("params.yaml"))["seeds"]:
    out = pathlib.Path("reports/metrics/anchor_last")
    out.mkdir(parents=True, exist_ok=True)
    (out / f"seed-{seed}.json").write_text(json.dumps({"method": "anchor_last", **headline}))
pathlib.Path("reports/metrics.json").write_text(json.dumps({"anchor_last": headline}))
"""


@pytest.mark.slow
def test_a_failed_experiment_fails_the_sweep_with_its_queue_log(tmp_path, monkeypatch):
    """A real queue on a one-stage project: the failing point's log is in the error, the other is kept."""
    from prefshift.pipeline import sweep

    for who in ("AUTHOR", "COMMITTER"):
        monkeypatch.setenv(f"GIT_{who}_NAME", "t")
        monkeypatch.setenv(f"GIT_{who}_EMAIL", "t@t")
    shutil.copy2(REPO / "params.yaml", tmp_path / "params.yaml")
    (tmp_path / "evaluate.py").write_text(EVALUATE)
    seeds = yaml.safe_load((REPO / "params.yaml").read_text())["seeds"]
    files = [f"reports/metrics/anchor_last/seed-{k}.json" for k in seeds] + ["reports/metrics.json"]
    metrics = [{p: {"cache": False}} for p in files]
    report = {"cmd": f"{sys.executable} evaluate.py", "deps": ["evaluate.py"], "params": ["anchor.lambda"]}
    (tmp_path / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"report": {**report, "metrics": metrics}}}))
    env = dict(os.environ)
    dvc = str(Path(sys.executable).parent / "dvc")
    _run(["git", "init", "-q"], tmp_path, env)
    _run([dvc, "init", "-q"], tmp_path, env)
    _run(["git", "add", "-A"], tmp_path, env)
    _run(["git", "commit", "-qm", "base"], tmp_path, env)
    _run([dvc, "repro"], tmp_path, env)  # dvc.lock and the metrics stay untracked: carried with -C

    # A task removed from the queue ends the wait with its name, instead of a wait for good. (No
    # worker has started yet, so the task is still queued when it is removed.)
    tasks = sweep.queue_points(tmp_path, [{"anchor.lambda": "7"}], [])
    _run([dvc, "queue", "remove", "sweep-anchor.lambda-7"], tmp_path, env)
    with pytest.raises(SweepError, match=r"sweep-anchor\.lambda-7: no longer listed"):
        sweep.wait_for_queue(tmp_path, tasks, poll_s=0.1, wait_s=300)  # before: a wait to the bound

    with pytest.raises(SweepError) as err:
        sweep.run(tmp_path, ["anchor.lambda=0.5,13"], ["anchor_last"], report=False, poll_s=1)
    assert "--- sweep-anchor.lambda-13 ---" in str(err.value)
    assert "evaluate.py: no result for lambda 13" in str(err.value)
    rows = {r["name"]: r for r in sweep.experiment_rows(sweep.exp_show(tmp_path))}
    assert rows["sweep-anchor.lambda-13"]["state"] == "failed"
    assert rows["sweep-anchor.lambda-0.5"]["metrics"]["reports/metrics.json"]["anchor_last"]["wrg"] == 1.0

    # Rerunning a point replaces its experiment (DVC's run cache may restore the stage instead of
    # running it); the old failed task of another name stays out of it.
    result = sweep.run(tmp_path, ["anchor.lambda=0.5"], ["anchor_last"], report=False, poll_s=1)
    assert [e["name"] for e in result["experiments"]] == ["sweep-anchor.lambda-0.5"]
    headline = {"wrg": 1.0, "mean_aog": 0.5, "mean_nts": -0.5}
    for seed in seeds:  # one record per replicate seed of the experiment
        name = f"anchor_last__anchor.lambda=0.5__seed={seed}.json"
        filed = json.loads((tmp_path / "reports" / "sweeps" / name).read_text())
        assert filed == {"method": "anchor_last", **headline, "sweep": {"anchor.lambda": 0.5, "seed": seed}}


def test_a_hung_exp_show_is_killed_and_retried(monkeypatch, tmp_path):
    import prefshift.pipeline.sweep as sweep_module

    calls = []

    def run(command, **kwargs):
        calls.append(kwargs["timeout"])
        if len(calls) == 1:
            raise subprocess.TimeoutExpired(command, kwargs["timeout"])
        return subprocess.CompletedProcess(command, 0, "[]", "")

    monkeypatch.setattr(sweep_module.subprocess, "run", run)
    assert sweep_module.exp_show(tmp_path, pause_s=0) == []
    assert calls == [sweep_module.EXP_SHOW_TIMEOUT_S] * 2


def test_exp_show_waits_out_the_queues_own_files_but_not_other_failures(monkeypatch, tmp_path):
    """A failure on a file under .dvc/tmp/exps/ (an executor being set up or cleaned up) is retried
    past `attempts`, up to `settle_s`; any other failure counts after `attempts` tries."""
    import prefshift.pipeline.sweep as sweep_module

    missing = "ERROR: [Errno 2] No such file or directory: '/p/.dvc/tmp/exps/run/ab/ab.run'"
    calls = []

    def run(command, **kwargs):
        calls.append(command)
        if len(calls) < 9:
            return subprocess.CompletedProcess(command, 255, "", missing)
        return subprocess.CompletedProcess(command, 0, "[]", "")

    monkeypatch.setattr(sweep_module.subprocess, "run", run)
    assert sweep_module.exp_show(tmp_path, attempts=3, pause_s=0) == []
    assert len(calls) == 9

    def broken(command, **kwargs):
        calls.append(command)
        return subprocess.CompletedProcess(command, 255, "", "ERROR: dvc.yaml is invalid")

    calls.clear()
    monkeypatch.setattr(sweep_module.subprocess, "run", broken)
    with pytest.raises(SweepError, match="failed 3 times"):
        sweep_module.exp_show(tmp_path, attempts=3, pause_s=0)
    assert len(calls) == 3
    monkeypatch.setattr(sweep_module.subprocess, "run", run)
    calls.clear()
    with pytest.raises(SweepError, match=r"run/ab/ab\.run"):
        sweep_module.exp_show(tmp_path, attempts=3, pause_s=0, settle_s=0)


def test_a_handed_back_task_with_no_worker_starts_the_queue_or_says_how(monkeypatch, tmp_path):
    """The info file of a task listed as running is missing: while a worker runs, that is a task
    being set up (waited on); with none, a task handed back, which `revive_jobs` has run."""
    import prefshift.pipeline.sweep as sweep_module

    rev = "4e9b81fcc574357a65b154206b10d3f42f8e7f4c"
    missing = f"ERROR: [Errno 2] No such file or directory: '/p/.dvc/tmp/exps/run/{rev}/{rev}.run'"
    workers, started, calls = {}, [], []

    def run(command, **kwargs):
        calls.append(command)
        if not started:
            return subprocess.CompletedProcess(command, 255, "", missing)
        return subprocess.CompletedProcess(command, 0, "[]", "")

    monkeypatch.setattr(sweep_module.subprocess, "run", run)
    monkeypatch.setattr(sweep_module, "queue_workers", lambda root: workers)
    monkeypatch.setattr(sweep_module, "start_queue", lambda root, jobs: started.append(jobs))
    with pytest.raises(SweepError, match=r"task 4e9b81f is listed as running .* `dvc queue start` runs it"):
        sweep_module.exp_show(tmp_path, attempts=3, pause_s=0)
    assert len(calls) == 3 and started == []  # not the 300 s of a task being set up

    assert sweep_module.exp_show(tmp_path, attempts=3, pause_s=0, revive_jobs=2) == []
    assert started == [2]

    workers[1] = ("0", "dvc exp queue-worker")  # a worker runs: the task is being set up, waited on
    started.clear()
    calls.clear()
    with pytest.raises(SweepError, match=r"failed \d+ times"):
        sweep_module.exp_show(tmp_path, attempts=3, pause_s=0, settle_s=0.2, revive_jobs=2)
    assert len(calls) > 3 and started == []  # retried past `attempts`, up to `settle_s`


HANDBACK_STAGE = "import json, yaml; x = yaml.safe_load(open('params.yaml'))['anchor']['lambda']; " + (
    "json.dump({'x': x}, open('reports/metrics.json', 'w'))"
)


def _hand_back(root: Path) -> None:
    """Leave the project's one queued task as a worker leaves a task it took and handed back when
    it stopped. DVC's queue is kombu's filesystem transport: a worker taking a message moves its
    file from broker/in/ to broker/processed/ (which DVC reads as the running tasks), and a message
    taken but not acknowledged when the worker stops is put back in broker/in/ under a new name."""
    broker = root / ".dvc" / "tmp" / "exps" / "celery" / "broker"
    (message,) = [m for m in (broker / "in").glob("*.celery.msg") if "pidbox" not in m.name]
    shutil.copy2(message, broker / "in" / f"9{message.name}")
    (broker / "processed").mkdir(exist_ok=True)
    message.rename(broker / "processed" / message.name)


@pytest.mark.slow
def test_a_task_handed_back_by_a_stopping_worker_is_run_and_a_queued_task_gets_a_worker(tmp_path, capfd):
    """CI, stop 41: the queue's worker stopped as a sweep queued its rerun, took the task and handed
    it back; every `dvc exp show` then failed on the task's info file, and the sweep gave up after
    300 s, before starting any worker. Here the same state, made on disk, with real DVC and workers."""
    from prefshift.pipeline import sweep

    env = {**os.environ, **{f"GIT_{w}_{x}": "t" for w in ("AUTHOR", "COMMITTER") for x in ("NAME", "EMAIL")}}
    stage = {"cmd": f'{sys.executable} -c "{HANDBACK_STAGE}"', "params": ["anchor.lambda"]}
    (tmp_path / "reports").mkdir()
    (tmp_path / "reports" / ".gitkeep").write_text("")
    _git_dvc_project(tmp_path, {**stage, "metrics": [{"reports/metrics.json": {"cache": False}}]}, env)
    names = ["sweep-anchor.lambda-3", "sweep-anchor.lambda-4"]
    try:
        tasks = sweep.queue_points(tmp_path, [{"anchor.lambda": "3"}], [])
        _hand_back(tmp_path)
        shown = subprocess.run(
            [str(Path(sys.executable).parent / "dvc"), "exp", "show", "--json"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
        )
        assert shown.returncode != 0 and ".run'" in shown.stderr, shown  # the state CI was stuck in
        with pytest.raises(SweepError, match="`dvc queue start` runs it"):
            sweep.exp_show(tmp_path, attempts=2, pause_s=0.1)
        rows, _ = sweep.wait_for_queue(tmp_path, tasks, poll_s=1, wait_s=600, jobs=1)
        assert {r["task_id"]: r["state"] for r in rows}[tasks[names[0]]] == "success"
        assert "was handed back to the queue and no worker runs it: starting one" in capfd.readouterr().err

        deadline = time.monotonic() + 300  # the worker that ran it, out of work, stops by itself (10 s)
        while sweep.queue_workers(tmp_path):
            assert time.monotonic() < deadline, sweep.queue_workers(tmp_path)
            time.sleep(0.5)
        tasks = sweep.queue_points(tmp_path, [{"anchor.lambda": "4"}], [])  # and no worker is started
        rows, _ = sweep.wait_for_queue(tmp_path, tasks, poll_s=1, wait_s=600, jobs=1)
        assert {r["task_id"]: r["state"] for r in rows}[tasks[names[1]]] == "success"
        assert f"note: {names[1]} queued and no queue worker runs: starting one" in capfd.readouterr().err
    finally:
        sweep.stop_queue(tmp_path, names)


SLEEPER = """
import os, pathlib, sys, time
pids = pathlib.Path(sys.argv[1])
pids.mkdir(exist_ok=True)
(pids / str(os.getpid())).write_text(os.getcwd())
time.sleep(900)
"""


def _git_dvc_project(root: Path, stage: dict, env: dict) -> None:
    """params.yaml (the repository's), a one-stage dvc.yaml, committed, in a fresh git+DVC repo."""
    shutil.copy2(REPO / "params.yaml", root / "params.yaml")
    (root / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"report": stage}}))
    dvc = str(Path(sys.executable).parent / "dvc")
    _run(["git", "init", "-q"], root, env)
    _run([dvc, "init", "-q"], root, env)
    _run(["git", "add", "-A"], root, env)
    _run(["git", "commit", "-qm", "base"], root, env)


def _gone(pid: int) -> bool:
    """No such process, or only its zombie waiting to be reaped."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat[stat.rindex(")") + 2] == "Z"


def _take_ctrl_c() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stopped_sweep_stops_its_queue_and_experiments_and_says_what_it_stopped(tmp_path, signum):
    """Before, SIGTERM ended the sweep alone: its queue worker and the running experiment's stage
    (here a sleeper standing in for a training) ran on."""
    from prefshift.pipeline.sweep import queue_processes

    env = {**os.environ, **{f"GIT_{w}_{x}": "t" for w in ("AUTHOR", "COMMITTER") for x in ("NAME", "EMAIL")}}
    root, pids = tmp_path / "project", tmp_path / "pids"
    root.mkdir()
    (root / "sleeper.py").write_text(SLEEPER)
    stage = {
        "cmd": f"{sys.executable} sleeper.py {pids}",
        "deps": ["sleeper.py"],
        "params": ["anchor.lambda"],
    }
    _git_dvc_project(root, {**stage, "metrics": [{"reports/metrics.json": {"cache": False}}]}, env)
    sweep = subprocess.Popen(
        [str(Path(sys.executable).parent / "prefshift"), "sweep", "-S", "anchor.lambda=0.5,2", "--no-report"],
        cwd=root,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # A job started in the background of a non-interactive shell (as a CI script may start the
        # suite) inherits SIGINT ignored, and Python keeps it so; a user's sweep takes Ctrl-C.
        preexec_fn=_take_ctrl_c,
    )
    try:
        deadline = time.monotonic() + 600  # queueing and the worker's start take long on a loaded machine
        while not (pids.is_dir() and any(pids.iterdir())):
            assert sweep.poll() is None, sweep.communicate()
            assert time.monotonic() < deadline, "the first experiment's stage never started"
            time.sleep(0.2)
        stage_pid = int(next(pids.iterdir()).name)
        assert queue_processes(root), "the running experiment is one of the queue's processes"
        sweep.send_signal(signum)
        _, err = sweep.communicate(timeout=600)
    finally:
        if sweep.poll() is None:
            sweep.kill()
            sweep.communicate()
    assert sweep.returncode == 128 + signum, err
    assert f"sweep: stopped by {signal.Signals(signum).name}; stopping what it started" in err
    assert "`dvc queue stop --kill`: " in err
    assert f"{stage_pid} (sleeper.py " in err  # the stage it ended (DVC had left it), by pid
    assert _gone(stage_pid)
    assert queue_processes(root) == {}  # no worker, no experiment, no stage left
    status = subprocess.run(
        [str(Path(sys.executable).parent / "dvc"), "queue", "status"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
    ).stdout
    assert "Queued" not in status and "Running" not in status, status  # a rerun is not refused as busy
