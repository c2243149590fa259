"""`--executor slurm`: the sweep's points as one SLURM job array, through a generated sbatch script.

The script is plain text written into the sweep's folder before `sbatch` reads it, so what ran is
there to read. Its `#SBATCH` lines come from the sweep's options (`--gpus-per-task`,
`--partition`, `--time`, `--account`), then, verbatim, from a template file that the user owns
(`--sbatch-template`: more `#SBATCH` lines first, then set-up such as `module load`). Array task
`i` runs grid point `i` (`prefshift sweep task <folder> $SLURM_ARRAY_TASK_ID`, see sweep_task),
logging to `logs/<i>.log`, appended to, so a resumed point keeps its earlier attempts' lines.

While a job waits or runs, `squeue` lists it; afterwards only the task's own state file tells
(accounting is not assumed: many clusters keep `sacct` to admins). A resume submits a new array
holding only the points still to do (`--array=1,4`).
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from prefshift.core.errors import PrefshiftError
from prefshift.pipeline.sweep_record import SweepRecord

SQUEUE_STATES = {"PENDING": "pending", "CONFIGURING": "pending", "REQUEUED": "pending", "RUNNING": "running"}
"""squeue's states that still hold a task; the others asked for (COMPLETING, SUSPENDED...) show as running."""
LIVE_STATES = "PENDING,CONFIGURING,REQUEUED,RUNNING,COMPLETING,SUSPENDED,STOPPED,RESIZING"
_TIME = re.compile(r"^(\d+-)?\d+(:\d+){0,2}$")


class SlurmError(PrefshiftError):
    """A bad resource option or template, or a SLURM command that failed."""


@dataclass(frozen=True)
class SlurmResources:
    """What each array task asks SLURM for; None leaves the cluster's default."""

    gpus_per_task: int = 0
    partition: str | None = None
    time: str | None = None
    account: str | None = None
    cpus_per_task: int | None = None
    template: Path | None = None

    def check(self) -> None:
        if self.gpus_per_task < 0:
            raise SlurmError(f"--gpus-per-task {self.gpus_per_task}: give 0 (CPU only) or more")
        if self.time is not None and not _TIME.match(self.time):
            raise SlurmError(f"--time {self.time!r}: use SLURM's form, e.g. 4:00:00 or 1-12:00:00")
        if self.template is not None and not Path(self.template).is_file():
            raise SlurmError(
                f"--sbatch-template {self.template}: no such file (extra #SBATCH lines, yours to edit)"
            )

    def as_dict(self) -> dict:
        return {**self.__dict__, "template": str(self.template) if self.template else None}


def directives(resources: SlurmResources) -> list[str]:
    lines = []
    if resources.gpus_per_task:
        lines.append(f"#SBATCH --gres=gpu:{resources.gpus_per_task}")
    for flag, value in (
        ("partition", resources.partition),
        ("time", resources.time),
        ("account", resources.account),
        ("cpus-per-task", resources.cpus_per_task),
    ):
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


def render_script(
    record: SweepRecord, indices: Sequence[int], resources: SlurmResources, env: Mapping[str, str]
) -> str:
    """The sbatch script that runs grid points `indices` of the sweep, one array task each."""
    folder = record.folder
    template = ""
    if resources.template is not None:
        text = Path(resources.template).read_text(encoding="utf-8").rstrip("\n")
        template = f"# --- from {resources.template} (yours to edit) ---\n{text}\n# --- end of template ---\n"
    python = Path(sys.executable)
    exports = "".join(f"export {key}={shlex.quote(value)}\n" for key, value in env.items())
    lines = [
        "#!/bin/bash",
        f"# Sweep {record.id}: {len(record.points)} grid point(s) of `prefshift sweep --executor slurm`;",
        "# array task i runs grid point i in its own clone (see sweep.json beside this file).",
        f"#SBATCH --job-name={job_name(record)}",
        f"#SBATCH --array={array_spec(indices)}",
        f"#SBATCH --output={folder}/logs/%a.log",
        f"#SBATCH --chdir={folder}",  # on the shared filesystem, wherever the sweep was started
        "#SBATCH --open-mode=append",
        *directives(resources),
    ]
    return (
        "\n".join(lines)
        + "\n"
        + template
        + "set -euo pipefail\n"
        + f'export PATH={shlex.quote(str(python.parent))}:"$PATH"\n'
        + exports
        + f"exec {shlex.quote(str(python))} -m prefshift sweep task {shlex.quote(str(folder))} "
        + '"$SLURM_ARRAY_TASK_ID"\n'
    )


def _slurm(args: Sequence[str]) -> str:
    try:
        done = subprocess.run(list(args), capture_output=True, text=True, timeout=120)
    except FileNotFoundError:
        raise SlurmError(
            f"`{args[0]}` not found: run the sweep on a machine that can submit SLURM jobs"
        ) from None
    except subprocess.TimeoutExpired:
        raise SlurmError(f"`{' '.join(args)}` did not answer in 120 s; is slurmctld up (`sinfo`)?") from None
    if done.returncode != 0:
        raise SlurmError(f"`{' '.join(args)}` failed (exit {done.returncode}): {done.stderr.strip()}")
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
    spec = spec.strip("[]").split("%")[0]
    indices: list[int] = []
    for part in filter(None, spec.split(",")):
        low, _, high = part.partition("-")
        indices += range(int(low), int(high or low) + 1)
    return indices


def job_name(record: SweepRecord) -> str:
    return f"prefshift-{record.id}"


def live(record: SweepRecord) -> dict[int, str]:
    """Grid point → pending/running for every task of the sweep that squeue still lists.

    Asked by job name with the states listed, never by job id: squeue fails on an id that the
    controller has already forgotten, and a finished sweep's ids all are, sooner or later.
    """
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
        if not sep or job not in jobs:
            continue
        for index in _array_indices(task):
            states[index] = SQUEUE_STATES.get(state.strip(), "running")
    return states


def cancel(record: SweepRecord) -> None:
    jobs = [entry["job"] for entry in record.data["jobs"]]
    if jobs:
        _slurm(["scancel", *jobs])
