"""Operator tables from torch's profiler: what `bench.training.measured` attaches to a profiled
run and `bench.profile` renders. Apart from both so the runner and the report need not import
each other."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

RANGES = {
    "no_grad_forward": "prefshift::no_grad_forward",
    "optimizer_step": "Optimizer.step#",
    "data_loading": "enumerate(DataLoader)#",
}
"""Labelled spans reported with their inclusive CPU time: forwards outside training (our drift
probes; labelled by `bench.work.WorkCounter`), optimizer steps, TRL's data loader."""
TOP = 15


@contextlib.contextmanager
def profiled(enabled: bool) -> Iterator:
    """A CPU `torch.profiler.profile` around the block, or nothing (yields None)."""
    if not enabled:
        yield None
        return
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        yield prof


def operator_table(prof, top: int) -> dict:
    """Top `top` operators by self CPU time (seconds, share of all self time, calls), and the
    inclusive CPU time of the labelled spans in RANGES."""
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    ranked = sorted(events, key=lambda e: -e.self_cpu_time_total)
    ops = [
        {
            "name": e.key,
            "self_cpu_s": e.self_cpu_time_total / 1e6,
            "share": e.self_cpu_time_total / total,
            "calls": e.count,
        }
        for e in ranked[:top]
    ]
    spans = {
        label: sum(e.cpu_time_total for e in events if e.key.startswith(prefix)) / 1e6
        for label, prefix in RANGES.items()
    }
    return {
        "self_cpu_total_s": total / 1e6,
        "operators": ops,
        "spans_s": spans,
        "span_shares": {k: v * 1e6 / total for k, v in spans.items()},
    }
