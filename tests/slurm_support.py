"""A real one-node SLURM cluster on 127.0.0.1 for the cluster-sweep test, started and stopped here.

Debian's `slurmctld`, `slurmd`, `slurm-client` and `munge` (scripts/install_slurm.sh, which .ci/run
starts in the background) run as root in a container with about ten lines of slurm.conf: Linux
process tracking, no task plugin, one node of 2 CPUs. Everything the daemons write (config, munge
key and socket, state, spool, logs) lives in the test's temporary folder and SLURM_CONF points the
commands at it, so nothing under /etc is touched and two sessions never share a cluster.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from mlflow_support import free_port

COMMANDS = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scancel", "scontrol", "sinfo")
START_S = 30.0


def why_not() -> str | None:
    """Why no cluster can start here, or None."""
    missing = [c for c in COMMANDS if shutil.which(c) is None]
    if missing:
        return f"SLURM not installed ({', '.join(missing)} missing): scripts/install_slurm.sh installs it"
    if os.geteuid() != 0:
        return "slurmd must run as root to start jobs as the test's user; not root here"
    return None


def _conf(folder: Path, socket: Path) -> str:
    return f"""ClusterName=prefshift-test
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={socket}
StateSaveLocation={folder}/state
SlurmdSpoolDir={folder}/spool
SlurmctldPidFile={folder}/slurmctld.pid
SlurmdPidFile={folder}/slurmd.pid
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
KillWait=10
NodeName=localhost NodeAddr=127.0.0.1 CPUs=2 State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
"""


def _stop_pid_file(path: Path, grace_s: float = 15.0) -> None:
    try:
        pid = int(path.read_text().strip())
    except (OSError, ValueError):
        return
    with suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    with suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def _cancel_all(env: dict[str, str], wait_s: float = 20.0) -> None:
    """Cancel every job still on this private cluster (a test that failed midway leaves some) and
    wait for them to end: a job's slurmstepd outlives `scontrol shutdown` by design."""
    subprocess.run(["scancel", f"--user={os.getuid()}"], env=env, capture_output=True)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        left = subprocess.run(["squeue", "-h", "-o", "%i"], env=env, capture_output=True, text=True)
        if left.returncode != 0 or not left.stdout.strip():
            return
        time.sleep(0.3)


@contextmanager
def controller_down(folder: Path, env: dict[str, str]) -> Iterator[None]:
    """This cluster's slurmctld stopped for the body, then started again on its saved state, as a
    maintenance restart or a failover does; the jobs run on under slurmd meanwhile."""
    subprocess.run(["scontrol", "shutdown", "slurmctld"], env=env, capture_output=True, timeout=60)
    _stop_pid_file(folder / "slurmctld.pid")
    try:
        yield
    finally:
        done = subprocess.run(
            ["slurmctld", "-L", str(folder / "slurmctld.log")], env=env, capture_output=True, text=True
        )
        if done.returncode != 0:
            raise RuntimeError(f"slurmctld did not start again: {done.stderr.strip()}")


def restart_controller(folder: Path, env: dict[str, str], down_s: float) -> None:
    """slurmctld down for `down_s` seconds (controller_down)."""
    with controller_down(folder, env):
        time.sleep(down_s)


@contextmanager
def running_cluster(folder: Path) -> Iterator[dict[str, str]]:
    """munged, slurmctld and slurmd for one test; yields the environment that reaches them."""
    folder.mkdir(parents=True, exist_ok=True)
    for sub in ("state", "spool"):
        (folder / sub).mkdir(exist_ok=True)
    key = folder / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o600)
    # munged wants every directory above its socket open to all (a pytest folder is 0700), and a
    # short path: a socket's path is limited to 107 bytes.
    sockets = Path(tempfile.mkdtemp(prefix="prefshift-munge-"))
    sockets.chmod(0o755)
    socket = sockets / "munge.sock"
    (folder / "slurm.conf").write_text(_conf(folder, socket))
    env = {**os.environ, "SLURM_CONF": str(folder / "slurm.conf")}
    munge = [
        "munged", f"--key-file={key}", f"--socket={socket}", f"--pid-file={folder}/munged.pid",
        f"--log-file={folder}/munged.log", f"--seed-file={folder}/munged.seed",
    ]  # fmt: skip
    try:
        daemons = [munge, ["slurmctld", "-L", str(folder / "slurmctld.log")]]
        daemons.append(["slurmd", "-N", "localhost", "-L", str(folder / "slurmd.log")])
        for daemon in daemons:
            done = subprocess.run(daemon, env=env, capture_output=True, text=True)
            if done.returncode != 0:
                raise RuntimeError(f"{daemon[0]} did not start: {done.stderr.strip()}")
        deadline = time.monotonic() + START_S
        while True:
            shown = subprocess.run(["sinfo", "-h", "-o", "%T"], env=env, capture_output=True, text=True)
            if shown.stdout.strip() == "idle":
                break
            if time.monotonic() > deadline:
                logs = "\n".join((folder / f).read_text()[-2000:] for f in ("slurmctld.log", "slurmd.log"))
                raise RuntimeError(f"the one-node cluster never came up (sinfo: {shown.stdout!r})\n{logs}")
            time.sleep(0.3)
        yield {"SLURM_CONF": env["SLURM_CONF"]}
    finally:
        _cancel_all(env)
        subprocess.run(["scontrol", "shutdown"], env=env, capture_output=True)
        for daemon in ("slurmd", "slurmctld", "munged"):
            _stop_pid_file(folder / f"{daemon}.pid")
        shutil.rmtree(sockets, ignore_errors=True)
