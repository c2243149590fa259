"""Time a 4-point λ sweep under the clone executor against DVC's queue (issue 46, point 5).

    python bench/sweep_executors.py                      # old 8e9f8ba (queue) vs new HEAD (local)
    python bench/sweep_executors.py --new <rev> --values 0.1,0.5,2,10 --jobs 2 --keep
    python bench/sweep_executors.py --small    # the test suite's shrunken default: executor overhead
    python bench/sweep_executors.py --old HEAD --old-runner dvc   # both sides on one commit

Each side gets a fresh clone of this repository at its commit, in a directory of its own under one
temporary folder (the DVC remote in .dvc/config is `../../.prefshift-dvc-remote`, so the two sides
never share a remote, a cache or an MLflow database). Every command in a clone runs the clone's own
sources (PYTHONPATH=<clone>/src ahead of the editable install) with this interpreter's virtualenv.
Set-up, untimed, both sides at once: `dvc repro` of the embedded default (with --small, of
tests/e2e_project.py's shrunken one at that commit), then params.yaml and dvc.lock committed (see
baseline_commit), so the sweep starts from a warm cache and every stage the points share is
restored. On a quiet 2-core machine a full repro takes about 9 minutes; under the load of two other
engineers' pipelines (load average 7-10) one anchor student's training stage took over 15 minutes, so the
embedded default needs a quiet machine. --small keeps every stage and the grid but shrinks the
training to seconds, so what it times is mostly each executor's own cost per point.

With `--old-runner dvc` the old side runs DVC's queue with DVC's own commands instead of
prefshift's `queue` executor, so both sides can run one commit's pipeline: each point queued under
the name the sweep gives it (`dvc exp run --queue --name sweep-anchor.lambda-<v> -S ...`), then
`dvc exp run --run-all --jobs <jobs>`, which starts the workers and returns once the queue is
empty. The executor is then the only difference. That side files no results and builds no report,
so the new side runs with `--no-report` (it still files each point's metrics, a few `git show`s).
prefshift itself has no code that drives the queue; this bench drives it only to measure against it.

Timed, in ABBA order so that drifting load (the machine is shared) weighs on both sides alike:
old sweep, new sweep, new no-op rerun (the same sweep again), old no-op rerun. One sweep lasts
minutes, so each is run once; the ratio is new ÷ old wall time. `uptime` before and after, and
/proc/loadavg around each timed run, go into the result: read the ratio with the load beside it.

Writes reports/results/sweep-executors/timings.json and timings.md.
"""

from __future__ import annotations

import argparse
import ast
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path

from prefshift.bench.common import machine, versions
from prefshift.bench.pipeline import _environment
from prefshift.config.params import dump_yaml, read_yaml
from prefshift.core.atomic import write_json, write_text
from prefshift.pipeline.sweep.grid import experiment_name

REPO = Path(__file__).resolve().parent.parent
OLD_COMMIT = "8e9f8ba"  # the last commit with DVC's queue (its child 552e7fd removes it)


def log(message: str) -> None:
    print(f"[{datetime.now(timezone.utc):%H:%M:%S}] {message}", flush=True)


def git(*args: str, cwd: Path = REPO) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def environment(clone: Path) -> dict[str, str]:
    """`prefshift bench --pipeline`'s environment (this venv first on PATH, offline, the clone's own
    MLflow database beside it, a git identity), running the clone's sources."""
    return {**_environment(clone.parent), "PYTHONPATH": str(clone / "src")}


def timed(args: list[str], clone: Path, log_file: Path, env: dict[str, str | None] | None = None) -> dict:
    """Run `args` in `clone` in a process group of its own, output to `log_file`; wall seconds.
    `env` sets variables over the clone's environment, or removes those given as None."""
    changed = {**environment(clone), **(env or {})}
    load_before = Path("/proc/loadavg").read_text().split()[:3]
    offset = log_file.stat().st_size if log_file.exists() else 0
    start = time.perf_counter()
    with log_file.open("a") as out:
        out.write(f"\n$ {' '.join(args)}\n")
        out.flush()
        proc = subprocess.Popen(
            args,
            cwd=clone,
            env={key: value for key, value in changed.items() if value is not None},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            rc = proc.wait()
        except BaseException:  # Ctrl-C or SIGTERM on the bench: the sweep and its tasks stop too
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait()
            raise
    wall = time.perf_counter() - start
    if rc != 0:
        tail = log_file.read_text().splitlines()[-30:]
        raise SystemExit(f"{' '.join(args)} failed in {clone} (exit {rc}):\n" + "\n".join(tail))
    return {
        "wall_s": round(wall, 1),
        "stages_run": stages_run(log_text(log_file, offset)),
        "loadavg_before": load_before,
        "loadavg_after": Path("/proc/loadavg").read_text().split()[:3],
    }


def log_text(log_file: Path, offset: int = 0) -> str:
    with log_file.open("rb") as log:
        log.seek(offset)
        return log.read().decode("utf-8", errors="replace")


def stages_run(text: str) -> dict[str, int]:
    """Stage → how often DVC ran it in a run's log. The two sides' pipelines differ (the old commit
    predates the per-target stages), so a ratio of wall times is read with what each side ran; both
    executors' output carries DVC's `Running stage` lines (the local pool prints each point's log
    when it ends)."""
    found = re.findall(r"^Running stage '([^']+)':", text, flags=re.MULTILINE)
    return {name: found.count(name) for name in sorted(set(found))}


def small_overlay(clone: Path) -> dict:
    """The test suite's shrunken embedded default at the clone's commit (tests/e2e_project.py's SMALL:
    the same stages, one seed, fewer pairs and steps), read from its source without importing it."""
    tree = ast.parse((clone / "tests" / "e2e_project.py").read_text(encoding="utf-8"))
    (value,) = [
        node.value
        for node in tree.body
        if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "SMALL"
    ]
    return ast.literal_eval(value)


def merged(base: dict, overlay: dict) -> dict:
    return {k: merged(base[k], v) if isinstance(v, dict) and isinstance(base.get(k), dict) else v
            for k, v in {**base, **overlay}.items()}  # fmt: skip


def shrink(clone: Path) -> None:
    """Overlay the clone's params.yaml with the suite's small settings (small_overlay)."""
    path = clone / "params.yaml"
    path.write_text(dump_yaml(merged(read_yaml(path.read_text(), str(path)), small_overlay(clone))))


def set_up(side: str, commit: str, tmp: Path, small: bool, metrics: bool) -> Path:
    """The side's clone with its baseline reproduced and committed; one left by an earlier run is
    reused with its earlier sweeps cleared (forget_sweeps), and one whose baseline was not finished
    is reproduced on from where it stopped."""
    clone, log_file = tmp / side / "project", tmp / side / "bench.log"
    if (clone / ".git").is_dir() and git("branch", "--list", "bench", cwd=clone):
        log(f"{side}: reusing {clone}, its baseline committed by an earlier run, its sweeps cleared")
        forget_sweeps(clone)
        return baseline_commit(clone, metrics)
    if not (clone / ".git").is_dir():
        clone.parent.mkdir(parents=True, exist_ok=True)
        git("clone", "-q", "--no-checkout", str(REPO), str(clone))
        git("checkout", "-q", "--detach", commit, cwd=clone)
        git("remote", "remove", "origin", cwd=clone)
        if small:
            shrink(clone)
    log(f"{side}: baseline dvc repro at {commit[:7]} (untimed set-up; minutes)")
    repro = timed(["dvc", "repro"], clone, log_file)
    log(f"{side}: baseline repro took {repro['wall_s']} s; committing the baseline")
    git("checkout", "-q", "-b", "bench", cwd=clone)
    return baseline_commit(clone, metrics)


def forget_sweeps(clone: Path) -> None:
    """Clear what earlier runs' sweeps left in a reused clone, so that its timed sweep does the work
    a fresh clone's does: the experiments (refs/exps, DVC's queue), prefshift's sweep folders, and
    DVC's run cache, from which a point's stages are restored instead of run. A pass whose old side
    kept two points of a run cut short in its run cache ran 27 stages to the new side's 56. The
    baseline needs no run cache: dvc.lock holds its stages."""
    for ref in git("for-each-ref", "--format=%(refname)", "refs/exps", cwd=clone).split():
        git("update-ref", "-d", ref, cwd=clone)
    for folder in (".dvc/tmp/exps", ".dvc/cache/runs", ".prefshift/sweeps"):
        shutil.rmtree(clone / folder, ignore_errors=True)


def baseline_commit(clone: Path, metrics: bool) -> Path:
    """Commit the baseline as each side's workflow does. New (and DVC's queue on a new commit):
    docs/sweeps.md's commit (params.yaml, dvc.lock and the metrics), which its sweep requires. The
    `queue` executor: params.yaml and dvc.lock alone; it carried the other outputs with `-C`, and on
    its commit a committed `cache: false` directory (reports/metrics/<method>) stopped the sweep
    with a StopIteration before anything was queued (the bug issue 46 names)."""
    paths = ["params.yaml", "dvc.lock"] + (["reports/metrics", "reports/metrics.json"] if metrics else [])
    git("add", *paths, cwd=clone)
    if git("diff", "--cached", "--name-only", cwd=clone):
        env = environment(clone)
        subprocess.run(["git", "commit", "-qm", "Baseline for the sweep"], cwd=clone, env=env, check=True)
    return clone


def dvc_queue_sweep(values: list[str], jobs: int) -> list[str]:
    """The old side's sweep with `--old-runner dvc`, as one shell command: DVC's queue, fed and
    drained by DVC's commands. A rerun first removes the experiments of the same names, as the
    queue executor did before queueing a point again. `--run-all` reports a failed experiment but
    exits 0, so the command ends by checking that every point's experiment exists."""
    names = [experiment_name({"anchor.lambda": value}) for value in values]
    lines = ["set -eu", f"dvc exp remove {' '.join(names)} >/dev/null 2>&1 || true"]
    lines += [
        f"dvc exp run --queue --name {name} -S anchor.lambda={value} report"
        for name, value in zip(names, values, strict=True)
    ]
    lines += [f"dvc exp run --run-all --jobs {jobs}", 'made="$(dvc exp list --name-only)"']
    lines += [f'grep -qx {name} <<<"$made" || {{ echo "no experiment {name}"; exit 1; }}' for name in names]
    return ["bash", "-c", "\n".join(lines)]


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", default=OLD_COMMIT, help="commit with DVC's queue (executor `queue`)")
    parser.add_argument("--new", default="HEAD", help="commit with the clone executors (executor `local`)")
    parser.add_argument(
        "--old-runner",
        choices=("prefshift", "dvc"),
        default="prefshift",
        help="old side: prefshift's `queue` executor (a commit that has it) or DVC's own queue commands",
    )
    parser.add_argument("--values", default="0.1,0.5,2,10", help="the four anchor.lambda values")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--out", type=Path, default=REPO / "reports/results/sweep-executors")
    parser.add_argument("--keep", action="store_true", help="keep the clones (their paths are printed)")
    parser.add_argument("--workdir", type=Path, help="where the clones go (kept); a committed one is reused")
    parser.add_argument(
        "--small",
        action="store_true",
        help="the test suite's shrunken embedded default (one seed, few steps)",
    )
    parser.add_argument("--note", default="", help="a line for the result, e.g. who else used the machine")
    opts = parser.parse_args()

    commits = {"old": git("rev-parse", opts.old), "new": git("rev-parse", opts.new)}
    old_executor = "queue" if opts.old_runner == "prefshift" else "dvc exp run --run-all"
    executors = {"old": old_executor, "new": "local"}
    commits_metrics = {"old": opts.old_runner == "dvc", "new": True}  # see baseline_commit
    sweep = ["prefshift", "sweep", "-S", f"anchor.lambda={opts.values}", "--jobs", str(opts.jobs)]
    sweep += ["--no-report"] if opts.old_runner == "dvc" else []
    commands = {
        "old": dvc_queue_sweep(opts.values.split(","), opts.jobs)
        if opts.old_runner == "dvc"
        else [*sweep, "--executor", "queue"],
        "new": [*sweep, "--executor", "local"],
    }
    started = datetime.now(timezone.utc)
    result: dict = {
        "date": f"{started:%Y-%m-%d %H:%M} UTC",
        "machine": machine(),
        "versions": {name: versions()[name] for name in ("dvc", "torch")},
        "uptime_start": uptime(),
        "commits": commits,
        "executors": executors,
        "sweep": " ".join(sweep) + " --executor <executor>",
        "commands": {
            side: command[-1] if command[0] == "bash" else " ".join(command)
            for side, command in commands.items()
        },
        "points": len(opts.values.split(",")),
        "pipeline": "tests/e2e_project.py's SMALL over params.yaml" if opts.small else "embedded default",
        "note": opts.note,
    }
    log(f"start: {result['uptime_start']}")
    tmp = opts.workdir or Path(tempfile.mkdtemp(prefix="prefshift-bench-sweeps-"))
    log(f"clones under {tmp}")
    try:
        with ThreadPoolExecutor(2) as pool:  # two untimed baselines at once: set-up only, half the wait
            built = {
                side: pool.submit(set_up, side, commits[side], tmp, opts.small, commits_metrics[side])
                for side in ("old", "new")
            }
            clones = {side: future.result() for side, future in built.items()}
        runs: dict[str, dict] = {}
        result["runs"] = runs
        for side, what in (("old", "sweep"), ("new", "sweep"), ("new", "rerun"), ("old", "rerun")):
            log(f"{side}: {what} ({executors[side]})")
            runs[f"{side}_{what}"] = timed(commands[side], clones[side], tmp / side / "bench.log")
            log(f"{side}: {what} took {runs[f'{side}_{what}']['wall_s']} s")
            result["ratio_new_over_old"] = {
                what: round(runs[f"new_{what}"]["wall_s"] / runs[f"old_{what}"]["wall_s"], 3)
                for what in ("sweep", "rerun")
                if f"new_{what}" in runs and f"old_{what}" in runs
            }
            result["complete"] = len(runs) == 4  # written after every run: a cut-short bench keeps its part
            result["uptime_end"] = uptime()
            write(result, opts.out)
        log(f"end: {result['uptime_end']}")
    finally:
        if opts.keep or opts.workdir:
            log(f"clones kept under {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def side_lines(result: dict) -> list[str]:
    """How each side ran its sweep, for timings.md; a shell script goes in a code block."""
    lines = []
    for side, label in (("old", "DVC's queue"), ("new", "a clone per point")):
        head, command = f"- {side}: `{result['commits'][side][:7]}`, {label}", result["commands"][side]
        lines += (
            [f"{head}:", "", "```bash", command, "```", ""] if "\n" in command else [f"{head}: `{command}`"]
        )
    return lines


def write(result: dict, out: Path) -> None:
    write_json(out / "timings.json", result)  # whole or not at all, never through a link
    runs, ratio = result["runs"], result["ratio_new_over_old"]

    def cell(key: str) -> str:
        return str(runs[key]["wall_s"]) if key in runs else "not run"

    def ran(key: str) -> str:
        return str(sum(runs[key]["stages_run"].values())) if "stages_run" in runs.get(key, {}) else "—"

    rows = [
        f"| {label} | {cell(f'old_{what}')} | {cell(f'new_{what}')} | {ratio.get(what, '—')} "
        f"| {ran(f'old_{what}')} / {ran(f'new_{what}')} |"
        for what, label in (
            ("sweep", f"{result['points']}-point sweep, warm cache"),
            ("rerun", "the same sweep again"),
        )
    ]
    write_text(
        out / "timings.md",
        "\n".join(
            [
                "# Sweep executors: DVC's queue against a clone per point (issue 46, point 5)",
                "",
                f"{result['date']}, {result['machine']['cpu']}, {result['machine']['cores']} cores. "
                f"A {result['points']}-point sweep on the {result['pipeline']} (each side's commands below), "
                "each side in a fresh clone after its baseline `dvc repro` (warm cache); run old, new, new, "
                "old so drifting load weighs on both.",
                "",
                *side_lines(result),
                "",
                "| run | old (s) | new (s) | new ÷ old | stages DVC ran, old / new |",
                "|---|---|---|---|---|",
                *rows,
                "",
                *(
                    []
                    if result.get("complete")
                    else ["**Incomplete**: the bench stopped before its four runs.", ""]
                ),
                "The machine is shared with other work; load at start and end (`uptime`):",
                "",
                f"- start: `{result['uptime_start']}`",
                f"- end: `{result['uptime_end']}`",
                *([f"\n{result['note']}"] if result["note"] else []),
                "",
                "Each figure is one run; the load averages around each are in timings.json. "
                "Written by `python bench/sweep_executors.py`.",
                "",
            ]
        ),
    )


if __name__ == "__main__":
    main()
