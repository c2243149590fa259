"""`--executor slurm`: the sweep's points as one SLURM job array, through a generated sbatch script.

The script is written into the sweep's folder before `sbatch` reads it, so what ran is there to
read; the user's `--sbatch-template` goes in verbatim after the sweep's own `#SBATCH` lines. While
a task waits or runs `squeue` lists it; afterwards only its own state file tells (many clusters keep
`sacct` to admins). The tasks reach the project through remotes: git, DVC and an MLflow server.
"""

from __future__ import annotations

import re
import shlex
import shutil
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prefshift.core.paths import Layout
from prefshift.pipeline.sweep.commands import SweepError, run, run_dvc, run_git, say
from prefshift.pipeline.sweep.record import SweepRecord, default_scratch
from prefshift.tracking.runs import tracking_uri

SQUEUE_STATES = {"PENDING": "pending", "CONFIGURING": "pending", "REQUEUED": "pending", "RUNNING": "running"}
"""squeue's states that still hold a task; the others asked for (COMPLETING, SUSPENDED...) show as running."""
LIVE_STATES = "PENDING,CONFIGURING,REQUEUED,RUNNING,COMPLETING,SUSPENDED,STOPPED,RESIZING"
CANCEL_WAIT_S = 120.0  # SLURM's KillWait (30 s by default) and the tasks' own shutdown
_TIME = re.compile(r"^(\d+-)?\d+(:\d+){0,2}$")


@dataclass(frozen=True)
class SlurmResources:
    """What each array task asks SLURM for; None leaves the cluster's default."""

    gpus_per_task: int = 0
    partition: str | None = None
    time: str | None = None
    account: str | None = None
    cpus_per_task: int | None = None
    template: str | None = None

    def check(self) -> None:
        if self.gpus_per_task < 0:
            raise SweepError(f"--gpus-per-task {self.gpus_per_task}: give 0 (CPU only) or more")
        if self.time is not None and not _TIME.match(self.time):
            raise SweepError(f"--time {self.time!r}: use SLURM's form, e.g. 4:00:00 or 1-12:00:00")
        if self.template is not None and not Path(self.template).is_file():
            raise SweepError(f"--sbatch-template {self.template}: no such file (extra #SBATCH lines)")

    def directives(self) -> list[str]:
        options = {"gres": f"gpu:{self.gpus_per_task}" if self.gpus_per_task else None}
        options.update(partition=self.partition, time=self.time, account=self.account)
        options["cpus-per-task"] = self.cpus_per_task
        return [f"#SBATCH --{flag}={value}" for flag, value in options.items() if value is not None]


def check_tracking(uri: str) -> None:
    """Many nodes write to one MLflow store only through a server (no sqlite file over NFS)."""
    if not uri.startswith(("http://", "https://", "databricks")):
        raise SweepError(
            f"MLflow tracking URI {uri!r}: a multi-machine sweep cannot log to a sqlite file or a folder; "
            "start `mlflow server --host 0.0.0.0 --port 5000 --backend-store-uri sqlite:///mlflow.db` on one "
            "machine and export MLFLOW_TRACKING_URI=http://<that host>:5000 before sweeping"
        )


def prepare(root: Path, baseline: str, uri: str) -> dict[str, Any]:
    """Check what the tasks need before anything is submitted, and push the baseline's outputs to
    the DVC remote for them to pull instead of recomputing."""
    check_tracking(uri)
    if shutil.which("sbatch") is None:
        raise SweepError("--executor slurm: no `sbatch` on PATH; run the sweep where jobs can be submitted")
    try:
        url = run_git(root, "remote", "get-url", "origin").strip()
    except SweepError:
        raise SweepError(
            f"{root}: no git remote `origin`; the tasks clone the baseline from it and push their "
            "experiments to it: `git remote add origin <url>` (a bare repository on the shared filesystem)"
        ) from None
    run_git(root, "fetch", "--quiet", "origin")
    if not run_git(root, "branch", "--remotes", "--contains", baseline).strip():
        raise SweepError(f"baseline {baseline[:12]} is not on origin ({url}): `git push origin HEAD`")
    if not run_dvc(root, ["remote", "default"], echo=False).strip():
        raise SweepError(
            f"{root}: no default DVC remote; the tasks pull the shared stages' outputs from it and push "
            "theirs: `dvc remote add -d <name> <url>` (a folder on the shared filesystem or an object store)"
        )
    say("sweep: dvc push (the baseline's outputs, for the tasks to pull instead of recomputing)")
    run_dvc(root, ["push"])
    return {"git_remote": url, "dvc_cache": None}


def array_spec(indices: Sequence[int]) -> str:
    """`0-3,7,9-10`: SLURM's array syntax, runs of consecutive indices as ranges."""
    runs: list[list[int]] = []
    for index in sorted(indices):
        if runs and index == runs[-1][1] + 1:
            runs[-1][1] = index
        else:
            runs.append([index, index])
    return ",".join(str(low) if low == high else f"{low}-{high}" for low, high in runs)


def render_script(
    record: SweepRecord, indices: Sequence[int], resources: SlurmResources, env: Mapping[str, str]
) -> str:
    """The sbatch script that runs points `indices` of the sweep, one array task each."""
    folder, python = record.folder, Path(sys.executable)
    lines = [
        "#!/bin/bash",
        f"# Sweep {record.id}: {len(record.points)} grid point(s) of `prefshift sweep --executor slurm`;",
        "# array task i runs grid point i in its own clone (see sweep.json beside this file).",
        f"#SBATCH --job-name=prefshift-{record.id}",
        f"#SBATCH --array={array_spec(indices)}",
        f"#SBATCH --output={folder}/logs/%a.log",
        f"#SBATCH --chdir={folder}",  # on the shared filesystem, wherever the sweep was started
        "#SBATCH --open-mode=append",
        *resources.directives(),
    ]
    if resources.template is not None:
        text = Path(resources.template).read_text(encoding="utf-8").rstrip("\n")
        lines += [f"# --- from {resources.template} (yours to edit) ---", text, "# --- end of template ---"]
    lines += ["set -euo pipefail", f'export PATH={shlex.quote(str(python.parent))}:"$PATH"']
    lines += [f"export {key}={shlex.quote(value)}" for key, value in env.items()]
    task = f"{shlex.quote(str(python))} -m prefshift sweep task {shlex.quote(str(folder))}"
    return "\n".join([*lines, f'exec {task} "$SLURM_ARRAY_TASK_ID"', ""])


def dry_run_script(
    root: Path, resources: SlurmResources, points: Sequence[Mapping], scratch: Path | None
) -> str:
    """The sbatch script a SLURM sweep of `points` would submit (nothing is written or submitted)."""
    folder = Path(scratch or default_scratch(root)).resolve() / "<sweep id>"
    record = SweepRecord(folder, {"id": "<sweep id>", "points": list(points), "names": []})
    env = {"MLFLOW_TRACKING_URI": tracking_uri(Layout(root))}
    return render_script(record, range(len(points)), resources, env)


def _slurm(*args: str) -> str:
    return run(*args, timeout=120, hint="; is SLURM installed and slurmctld up (`sinfo`)?")


def submit(record: SweepRecord, indices: Sequence[int], resources: SlurmResources) -> None:
    """Write the script into the sweep's folder, then `sbatch` it."""
    script = record.folder / f"job-{len(record.data['jobs']) + 1}.sbatch"
    env = {"MLFLOW_TRACKING_URI": record.data["tracking_uri"]}
    script.write_text(render_script(record, indices, resources, env), encoding="utf-8")
    job = _slurm("sbatch", "--parsable", str(script)).strip().split(";")[0]
    record.data["jobs"].append({"job": job, "indices": list(indices), "script": str(script)})
    record.save()
    say(f"sweep {record.id}: submitted job {job} ({len(indices)} array task(s)), script {script}")


def live(record: SweepRecord) -> dict[int, str]:
    """Grid point → pending/running for every task of the sweep that squeue still lists (one line
    per array task, `--array`); asked by job name, never by id, which squeue refuses once the
    controller forgot it."""
    if not (jobs := {entry["job"] for entry in record.data["jobs"]}):
        return {}
    states: dict[int, str] = {}
    query = ("--array", f"--name=prefshift-{record.id}", f"--states={LIVE_STATES}", "--format=%i %T")
    for line in _slurm("squeue", "-h", *query).splitlines():
        job, _, rest = line.strip().partition("_")
        task, _, state = rest.partition(" ")
        if job in jobs and task.isdigit():
            states[int(task)] = SQUEUE_STATES.get(state.strip(), "running")
    return states


def stop(record: SweepRecord) -> tuple[list[int], list[str]]:
    """`scancel` the sweep's jobs and wait for squeue to let go of them: (points held, what was done)."""
    if not (held := sorted(live(record))):
        return [], ["no task of the sweep was pending or running"]
    jobs = [entry["job"] for entry in record.data["jobs"]]
    _slurm("scancel", *jobs)
    deadline = time.monotonic() + CANCEL_WAIT_S
    while (left := live(record)) and time.monotonic() < deadline:
        time.sleep(1.0)
    lines = [f"scancel {' '.join(jobs)}: points {', '.join(map(str, held))}"]
    if left:
        lines.append(f"still listed by squeue after {CANCEL_WAIT_S:.0f} s: {sorted(left)}")
    return held, lines
