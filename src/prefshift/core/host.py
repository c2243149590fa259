"""What a number was computed on.

Same commit, params, seed and data give byte-identical metrics on one machine, not across
machines: torch picks CPU kernels by instruction set (AVX2 or AVX-512 paths) and their float
rounding differs, which training amplifies. On the embedded default two 2-core AMD EPYC machines
gave mean AOGs several points apart for the same commit. Runs are therefore tagged with the CPU
and the kernel level torch used, so two runs that disagree can be told apart by machine.
"""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path


def cpu_model() -> str:
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def core_share(processes: int) -> int:
    """Cores this process may run on, divided among `processes` that run at once, at least 1: the
    torch threads each should take. torch's default is a thread per core in every process, and
    OpenMP's idle threads spin, so processes side by side that each take every core slow each
    other down (bench/sweep_threads.py measured it)."""
    return max(1, len(os.sched_getaffinity(0)) // processes)


def compute_tags() -> dict[str, str]:
    """The CPU, and torch's version and CPU kernel level when this process already imported torch
    (stages that load no model stay torch-free; the numbers they report come from those that do)."""
    tags = {"host.cpu": cpu_model(), "host.machine": platform.machine()}
    torch = sys.modules.get("torch")
    if torch is not None:
        tags["torch.version"] = torch.__version__
        tags["torch.cpu_capability"] = torch.backends.cpu.get_cpu_capability()
    return tags


def cpu_only() -> bool:
    """True without CUDA or MPS. accelerate only picks gloo for a multi-process launch when
    told it runs on CPU, and a torchrun launch (`accelerate launch --multi_gpu`, see
    configs/accelerate/cpu-2proc.yaml) does not tell it, so the training loop does."""
    import torch

    return not (torch.cuda.is_available() or torch.backends.mps.is_available())


def process_state():
    """accelerate's per-process state (rank, world size), shared with the Accelerator."""
    from accelerate import PartialState

    return PartialState(cpu=cpu_only())
