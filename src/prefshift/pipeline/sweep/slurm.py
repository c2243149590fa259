"""`--executor slurm`: the sweep's points as one SLURM job array, through a generated sbatch script.

The script is written into the sweep's folder before `sbatch` reads it, so what ran is there to
read; the user's `--sbatch-template` goes in verbatim. What the sweep relies on (the job's name, its
array, its logs' paths) and the resources its options ask for go on sbatch's command line, which
wins over a template's `#SBATCH` line and an `SBATCH_*` variable: a template that names the job
would hide it from the sweep. While a task waits or runs `squeue` lists it by that name; afterwards
only its own state file tells (many clusters keep `sacct` to admins). The tasks reach the project
through remotes: git, DVC and an MLflow server.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from prefshift.core.atomic import write_text
from prefshift.core.paths import Layout
from prefshift.core.reading import MIB, read_regular
from prefshift.pipeline.sweep.baseline import git_place
from prefshift.pipeline.sweep.commands import SweepError, run, run_dvc, run_git, say
from prefshift.pipeline.sweep.record import SweepRecord, default_scratch
from prefshift.tracking.runs import tracking_uri

SQUEUE_STATES = {"PENDING": "pending", "CONFIGURING": "pending", "REQUEUED": "pending", "RUNNING": "running"}
"""squeue's states that still hold a task; the others asked for (COMPLETING, SUSPENDED...) show as running."""
LIVE_STATES = "PENDING,CONFIGURING,REQUEUED,RUNNING,COMPLETING,SUSPENDED,STOPPED,RESIZING"
CANCEL_WAIT_S = 120.0  # SLURM's KillWait (30 s by default) and the tasks' own shutdown
HEALTH_TIMEOUT_S = 10.0  # an MLflow server that takes longer to say it is up is as good as down
_TIME = re.compile(r"^(?:(\d+-)?\d+(:\d+){0,2}|(?i:infinite|unlimited))$")
_NAME = re.compile(r"^[^\s,]+(,[^\s,]+)*$")  # a partition or account name, or a comma list of them


@dataclass(frozen=True)
class SlurmResources:
    """What each array task asks SLURM for; None leaves the cluster's default."""

    gpus_per_task: int = 0
    partition: str | None = None
    time: str | None = None
    account: str | None = None
    cpus_per_task: int | None = None
    template: str | None = None
    template_body: str | None = None
    """The template's text as the sweep (or the resume that named it) read it: every submission of
    the sweep uses it, whatever became of the file since."""

    def check(self) -> None:
        """Refuse what SLURM would (Executor.check has refused a negative --gpus-per-task)."""
        if self.cpus_per_task is not None and self.cpus_per_task < 1:
            raise SweepError(f"--cpus-per-task {self.cpus_per_task}: give 1 or more")
        if self.time is not None and not _TIME.match(self.time):
            raise SweepError(f"--time {self.time!r}: use SLURM's form, e.g. 4:00:00 or 1-12:00:00")
        for flag, value in (("--partition", self.partition), ("--account", self.account)):
            if value is not None and not _NAME.match(value):
                raise SweepError(f"{flag} {value!r}: a SLURM name (or names, comma-separated) has no spaces")
        if self.template is not None and any(char in self.template for char in "\r\n"):
            raise SweepError(
                f"--sbatch-template {self.template!r}: a path with a line break, which would end the "
                "script's comment naming it and run the rest; rename the file"
            )
        self.template_text()

    def read(self) -> SlurmResources:
        """These resources with the template's text read now, for the record to keep."""
        return replace(self, template_body=self.template_text())

    def template_text(self) -> str | None:
        """The template's lines, or None; a template that is no readable UTF-8 file is refused by name."""
        if self.template is None or self.template_body is not None:
            return self.template_body
        try:
            return read_regular(Path(self.template), "sbatch template", MIB).decode("utf-8").rstrip("\n")
        except UnicodeDecodeError as err:
            raise SweepError(
                f"{self.template}: not UTF-8 text (byte {err.start}); save it as UTF-8"
            ) from None

    def options(self) -> list[str]:
        """sbatch's options for what each task asks for; None leaves the cluster's default."""
        options = {"gres": f"gpu:{self.gpus_per_task}" if self.gpus_per_task else None}
        options.update(partition=self.partition, time=self.time, account=self.account)
        options["cpus-per-task"] = self.cpus_per_task
        return [f"--{flag}={value}" for flag, value in options.items() if value is not None]


def check_tracking(
    uri: str, fix: str = "start it, or export the MLFLOW_TRACKING_URI of one that runs"
) -> None:
    """Many nodes write to one MLflow store only through a server (no sqlite file over NFS), and
    that server answers now: one that does not would fail every point, after the queue. `fix`:
    what to do about one that does not answer."""
    if not uri.lower().startswith(("http://", "https://", "databricks")):
        raise SweepError(
            f"MLflow tracking URI {uri!r}: a multi-machine sweep cannot log to a sqlite file or a folder; "
            "start `mlflow server --host 0.0.0.0 --port 5000 --backend-store-uri sqlite:///mlflow.db` on one "
            "machine and export MLFLOW_TRACKING_URI=http://<that host>:5000 before sweeping"
        )
    if uri.lower().startswith("http"):
        try:
            urllib.request.urlopen(f"{uri.rstrip('/')}/health", timeout=HEALTH_TIMEOUT_S).close()
        except urllib.error.HTTPError:  # it answered (a proxy's or an auth's refusal): it is up
            pass
        except (OSError, ValueError) as err:
            raise SweepError(
                f"MLflow tracking URI {uri}: the server does not answer ({err}); {fix}, before sweeping"
            ) from None


def git_origin(root: Path) -> str:
    """`origin`'s URL as the tasks' clones must see it: a local path given relative (git takes
    `../shared.git`, from the repository's top, also for a project in a folder of it) made absolute,
    since the tasks clone from the sweep's folder."""
    try:
        url = run_git(root, "remote", "get-url", "origin").strip()
    except SweepError:
        raise SweepError(
            f"{root}: no git remote `origin`; the tasks clone the baseline from it and push their "
            "experiments to it: `git remote add origin <url>` (a bare repository on the shared filesystem)"
        ) from None
    local = "://" not in url and not re.match(r"^[^/]+:", url)  # not a URL, not git's host:path
    return str((Path(git_place(root)[0]) / url).resolve()) if local and not Path(url).is_absolute() else url


def check_folder(folder: Path) -> None:
    """A sweep folder SLURM can log into: sbatch reads a `\\` in a log path as "no patterns here"
    (every task of the array would share one log named `%a`), and a line break in it would end
    the script's comment that names it and run the rest. A `%` is escaped (log_pattern)."""
    if bad := [char for char in ("\\", "\n", "\r") if char in str(folder)]:
        raise SweepError(
            f"--scratch {str(folder)!r}: holds {bad[0]!r}, which sbatch cannot take in a log's path; "
            "choose a sweep folder without it (--scratch, or PREFSHIFT_SWEEP_SCRATCH)"
        )


def log_pattern(folder: Path) -> str:
    """The array tasks' log path as sbatch reads it: `%a` the task's index, a `%` of the path `%%`."""
    return f"{str(folder).replace('%', '%%')}/logs/%a.log"


def check_pushed(root: Path, baseline: str, url: str) -> None:
    """The baseline is on `origin` itself: another remote holding it is no use to the tasks."""
    run_git(root, "fetch", "--quiet", "origin")
    if not run_git(root, "branch", "--remotes", "--list", "origin/*", "--contains", baseline).strip():
        raise SweepError(f"baseline {baseline[:12]} is not on origin ({url}): `git push origin HEAD`")


def dvc_remote(root: Path) -> str:
    """The default DVC remote's name, as the tasks' clones see it: set in the committed
    .dvc/config (not config.local, which stays in this workspace), with a URL that means the same
    in every clone (DVC reads a relative path from the clone's own .dvc/ folder)."""
    from configobj import ConfigObj

    config, where = ConfigObj(str(root / ".dvc" / "config")), f"{root / '.dvc' / 'config'}"
    if not (name := config.get("core", {}).get("remote")):
        raise SweepError(
            f"{where}: no default DVC remote; the tasks pull the shared stages' outputs from it and push "
            "theirs: `dvc remote add -d <name> <url>` (a folder on the shared filesystem or an object "
            "store), then commit .dvc/config (a remote set with --local stays in this workspace)"
        )
    url = config.get(f'remote "{name}"', {}).get("url", "")
    if not url:
        raise SweepError(f"{where}: DVC remote {name!r} has no url there (one in config.local stays here)")
    if "://" not in url and not Path(url).is_absolute():
        raise SweepError(
            f"{where}: DVC remote {name!r} is the relative path {url!r}, which each task's clone reads from "
            f"its own folder: give it whole, `dvc remote modify {name} url <absolute path>`, then commit"
        )
    return name


def prepare(root: Path, baseline: str, uri: str) -> dict[str, Any]:
    """Check what the tasks need before anything is submitted, and push the baseline's outputs to
    the DVC remote for them to pull instead of recomputing."""
    check_tracking(uri)
    if shutil.which("sbatch") is None:
        raise SweepError("--executor slurm: no `sbatch` on PATH; run the sweep where jobs can be submitted")
    url = git_origin(root)
    check_pushed(root, baseline, url)
    dvc_remote(root)
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


def job_name(record: SweepRecord) -> str:
    """The name every job of the sweep carries: how squeue and scancel find them all."""
    return f"prefshift-{record.id}"


def sbatch_options(record: SweepRecord, indices: Sequence[int], resources: SlurmResources) -> list[str]:
    """sbatch's command-line options for points `indices`: each value one argument, never a line
    of the script, and above the template's `#SBATCH` lines and `SBATCH_*` variables (sbatch's
    precedence), so that the job's name, array and logs are the ones the sweep reads."""
    folder = record.folder  # on the shared filesystem, wherever the sweep was started
    own = [f"--job-name={job_name(record)}", f"--array={array_spec(indices)}"]
    own += [f"--output={log_pattern(folder)}", f"--chdir={folder}", "--open-mode=append"]
    return [*own, *resources.options()]


def render_script(
    record: SweepRecord, indices: Sequence[int], resources: SlurmResources, env: Mapping[str, str]
) -> str:
    """The sbatch script that runs points `indices` of the sweep, one array task each."""
    folder, python = record.folder, Path(sys.executable)
    lines = [
        "#!/bin/bash",
        f"# Sweep {record.id}: {len(record.points)} grid point(s) of `prefshift sweep --executor slurm`;",
        "# array task i runs grid point i in its own clone (see sweep.json beside this file).",
        "# Submitted with these options, which win over any #SBATCH line below:",
        f"#   sbatch {shlex.join(sbatch_options(record, indices, resources))}",
    ]
    if (text := resources.template_text()) is not None:
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
    """A SLURM command's output, without the user's SQUEUE_* and SCANCEL_* settings: a
    SQUEUE_PARTITION hid the sweep's running tasks from it (it resubmitted them), and a
    SCANCEL_PARTITION kept a stop from cancelling them. SBATCH_* stay, below the sweep's options."""
    env = {key: value for key, value in os.environ.items() if not key.startswith(("SQUEUE_", "SCANCEL_"))}
    return run(*args, timeout=120, hint="; is SLURM installed and slurmctld up (`sinfo`)?", env=env)


def submit(record: SweepRecord, indices: Sequence[int], resources: SlurmResources) -> None:
    """Write the script into the sweep's folder, then `sbatch` it (the caller holds the sweep)."""
    for index in indices:  # slurmstepd appends each task's output to its log, through a link too
        record.check_log(index)
    script = record.folder / f"job-{len(record.data['jobs']) + 1}.sbatch"
    env = {"MLFLOW_TRACKING_URI": record.data["tracking_uri"]}
    write_text(script, render_script(record, indices, resources, env))  # never through a link placed there
    options = sbatch_options(record, indices, resources)
    job = _slurm("sbatch", "--parsable", *options, str(script)).strip().split(";")[0]
    record.data["jobs"].append({"job": job, "indices": list(indices), "script": str(script)})
    record.save()
    say(f"sweep {record.id}: submitted job {job} ({len(indices)} array task(s)), script {script}")


def _listed(record: SweepRecord, states: str, field: str) -> dict[int, str]:
    """Grid point → squeue's `field` for each task of the sweep in one of `states` (one line per
    array task, `--array`); asked by the sweep's job name, never by id, which squeue refuses once
    the controller forgot it. By name it also sees a job the record missed (one submitted as a
    stop came)."""
    query = ("--array", f"--name={job_name(record)}", f"--states={states}", f"--format=%i {field}")
    tasks = (
        line.strip().partition("_")[2].partition(" ") for line in _slurm("squeue", "-h", *query).splitlines()
    )
    return {int(task): value.strip() for task, _, value in tasks if task.isdigit()}


def live(record: SweepRecord) -> dict[int, str]:
    """Grid point → pending/running for every task of the sweep that squeue still lists."""
    return {i: SQUEUE_STATES.get(state, "running") for i, state in _listed(record, LIVE_STATES, "%T").items()}


def pending_reasons(record: SweepRecord) -> dict[int, str]:
    """Grid point → why SLURM keeps its task waiting (Resources, Priority; PartitionConfig or
    ReqNodeNotAvail when what it asks for never comes), as squeue says it."""
    return {i: why for i, why in _listed(record, "PENDING", "%r").items() if why not in ("", "None")}


def stop(record: SweepRecord) -> tuple[list[int], list[str]]:
    """`scancel` every job of the sweep by its name, and wait for squeue to let go of them:
    (points held, what was done). Where SLURM does not answer (its controller restarting), every
    point without a result counts as held, and what was done says how to cancel them later."""
    cancel = f"scancel --name={job_name(record)}"
    try:
        held = sorted(live(record))
        _slurm(*shlex.split(cancel))  # also a job sbatch made as the stop came
        if not held:
            return [], ["no task of the sweep was pending or running"]
        deadline = time.monotonic() + CANCEL_WAIT_S
        while (left := live(record)) and time.monotonic() < deadline:
            time.sleep(1.0)
    except SweepError as err:
        said = str(err).strip().splitlines()[-1]
        return list(range(len(record.points))), [
            f"SLURM did not answer ({said}); the sweep's tasks may run on: `{cancel}` once it answers"
        ]
    lines = [f"{cancel}: points {', '.join(map(str, held))}"]
    if left:
        lines.append(f"still listed by squeue after {CANCEL_WAIT_S:.0f} s: {sorted(left)}")
    return held, lines
