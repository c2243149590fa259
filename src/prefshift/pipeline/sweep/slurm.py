"""`--executor slurm`: the sweep's points as one SLURM job array, through a generated sbatch script.

The script is written into the sweep's folder before `sbatch` reads it, so what ran is there to
read. Its `#SBATCH` lines come from the sweep's options, then, verbatim, from the user's template
(`--sbatch-template`: more `#SBATCH` lines, then set-up such as `module load`). Array task `i` runs
point `i` (`prefshift sweep task <folder> $SLURM_ARRAY_TASK_ID`), appending to `logs/<i>.log`. While
a task waits or runs `squeue` lists it; afterwards only its own state file tells (accounting is not
assumed: many clusters keep `sacct` to admins). A resume submits an array of the points left.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from prefshift.pipeline.sweep.commands import SweepError
from prefshift.pipeline.sweep.record import SweepRecord

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
            raise SweepError(
                f"--sbatch-template {self.template}: no such file (extra #SBATCH lines, yours to edit)"
            )

    def as_dict(self) -> dict:
        return asdict(self)

    def directives(self) -> list[str]:
        lines = [f"#SBATCH --gres=gpu:{self.gpus_per_task}"] if self.gpus_per_task else []
        options = (("partition", self.partition), ("time", self.time), ("account", self.account))
        for flag, value in (*options, ("cpus-per-task", self.cpus_per_task)):
            if value is not None:
                lines.append(f"#SBATCH --{flag}={value}")
        return lines


def array_spec(indices: Sequence[int]) -> str:
    """`0-3,7,9-10`: SLURM's array syntax, runs of consecutive indices as ranges."""
    runs: list[list[int]] = []
    for index in sorted(indices):
        if runs and index == runs[-1][1] + 1:
            runs[-1][1] = index
        else:
            runs.append([index, index])
    return ",".join(str(low) if low == high else f"{low}-{high}" for low, high in runs)


def job_name(record: SweepRecord) -> str:
    return f"prefshift-{record.id}"


def render_script(
    record: SweepRecord, indices: Sequence[int], resources: SlurmResources, env: Mapping[str, str]
) -> str:
    """The sbatch script that runs points `indices` of the sweep, one array task each."""
    folder, python = record.folder, Path(sys.executable)
    template = ""
    if resources.template is not None:
        text = Path(resources.template).read_text(encoding="utf-8").rstrip("\n")
        template = f"# --- from {resources.template} (yours to edit) ---\n{text}\n# --- end of template ---\n"
    header = [
        "#!/bin/bash",
        f"# Sweep {record.id}: {len(record.points)} grid point(s) of `prefshift sweep --executor slurm`;",
        "# array task i runs grid point i in its own clone (see sweep.json beside this file).",
        f"#SBATCH --job-name={job_name(record)}",
        f"#SBATCH --array={array_spec(indices)}",
        f"#SBATCH --output={folder}/logs/%a.log",
        f"#SBATCH --chdir={folder}",  # on the shared filesystem, wherever the sweep was started
        "#SBATCH --open-mode=append",
        *resources.directives(),
    ]
    exports = "".join(f"export {key}={shlex.quote(value)}\n" for key, value in env.items())
    return (
        "\n".join(header) + "\n" + template + "set -euo pipefail\n"
        f'export PATH={shlex.quote(str(python.parent))}:"$PATH"\n{exports}'
        f"exec {shlex.quote(str(python))} -m prefshift sweep task {shlex.quote(str(folder))} "
        '"$SLURM_ARRAY_TASK_ID"\n'
    )


def _slurm(args: Sequence[str]) -> str:
    try:
        done = subprocess.run(list(args), capture_output=True, text=True, timeout=120)
    except FileNotFoundError:
        raise SweepError(
            f"`{args[0]}` not found: run the sweep on a machine that can submit SLURM jobs"
        ) from None
    except subprocess.TimeoutExpired:
        raise SweepError(f"`{' '.join(args)}` did not answer in 120 s; is slurmctld up (`sinfo`)?") from None
    if done.returncode != 0:
        raise SweepError(f"`{' '.join(args)}` failed (exit {done.returncode}): {done.stderr.strip()}")
    return done.stdout


def submit(
    record: SweepRecord, indices: Sequence[int], resources: SlurmResources, env: Mapping[str, str]
) -> str:
    """Write the script into the sweep's folder, then `sbatch` it; return the job id."""
    script = record.script(len(record.data["jobs"]) + 1)
    script.write_text(render_script(record, indices, resources, env), encoding="utf-8")
    job = _slurm(["sbatch", "--parsable", str(script)]).strip().split(";")[0]
    record.data["jobs"].append({"job": job, "indices": list(indices), "script": str(script)})
    record.save()
    return job


def _array_indices(spec: str) -> list[int]:
    """`3`, or squeue's compressed pending form `[0-2,5%4]`, as the indices it names."""
    indices: list[int] = []
    for part in filter(None, spec.strip("[]").split("%")[0].split(",")):
        low, _, high = part.partition("-")
        indices += range(int(low), int(high or low) + 1)
    return indices


def live(record: SweepRecord) -> dict[int, str]:
    """Grid point → pending/running for every task of the sweep that squeue still lists; asked by
    job name, never by id, which squeue refuses once the controller forgot it."""
    if not record.data["jobs"]:
        return {}
    jobs = {entry["job"] for entry in record.data["jobs"]}
    output = _slurm(
        [
            "squeue",
            "--noheader",
            "--array",
            f"--name={job_name(record)}",
            f"--states={LIVE_STATES}",
            "--format=%i %T",
        ]
    )
    states: dict[int, str] = {}
    for line in output.splitlines():
        job_task, _, state = line.strip().partition(" ")
        job, sep, task = job_task.partition("_")
        if sep and job in jobs:
            states.update(dict.fromkeys(_array_indices(task), SQUEUE_STATES.get(state.strip(), "running")))
    return states


def stop(record: SweepRecord, wait_s: float = CANCEL_WAIT_S) -> tuple[list[int], list[str]]:
    """`scancel` the sweep's jobs and wait for squeue to let go of them; (points held, what was done)."""
    held = sorted(live(record))
    jobs = [entry["job"] for entry in record.data["jobs"]]
    if not held:
        return [], ["no task of the sweep was pending or running"]
    _slurm(["scancel", *jobs])
    deadline = time.monotonic() + wait_s
    while (left := live(record)) and time.monotonic() < deadline:
        time.sleep(1.0)
    lines = [f"scancel {' '.join(jobs)}: points {', '.join(map(str, held))}"]
    if left:
        lines.append(
            f"still listed by squeue after {wait_s:.0f} s: points {', '.join(map(str, sorted(left)))}"
        )
    return held, lines
