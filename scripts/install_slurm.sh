#!/usr/bin/env bash
# SLURM (controller, node daemon, client) and munge from Debian's packages, for the test that
# runs a sweep through a real one-node cluster (tests/slurm_support.py starts and stops it).
# Also tmux: the sweep's stop tests type Ctrl-C into a real terminal (tests/test_sweep_executors.py).
# Does nothing when sbatch, slurmctld, slurmd and tmux are already on PATH.
set -euo pipefail
if command -v sbatch >/dev/null && command -v slurmctld >/dev/null && command -v slurmd >/dev/null \
    && command -v tmux >/dev/null; then
    exit 0
fi
SUDO=$([ "$(id -u)" -eq 0 ] && echo "" || echo sudo)
# Debian starts a package's service on install; in a container without an init that only fails.
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q -o DPkg::Lock::Timeout=300 --no-install-recommends slurmctld slurmd slurm-client munge tmux
