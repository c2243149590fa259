"""Time a local `--jobs 2` sweep whose tasks take every core for torch against one whose tasks take
their share, as a local sweep now gives them (OMP_NUM_THREADS = cores ÷ jobs unless set).

    python bench/sweep_threads.py            # the embedded default at HEAD
    python bench/sweep_threads.py --small    # the test suite's shrunken embedded default

A fresh clone of this repository at HEAD (sources run from the clone; set-up and timing are
bench/sweep_executors.py's) gets its baseline reproduced and committed, untimed. Then four sweeps of
two λ points each, `prefshift sweep -S anchor.lambda=<a>,<b> --jobs 2 --no-report`, in ABBA order so
that drifting load weighs on both: `every core` exports OMP_NUM_THREADS as the machine's core count,
which is what torch takes by default and what each task took before; `share` leaves it unset. Each
sweep has λ values of its own, so no point is restored from another's run cache and every sweep
runs the same stages. The ratio is share ÷ every core, mean wall time per sweep, written after
every run: a bench cut short (an oversubscribed sweep can take half an hour) keeps what it ran.

Writes reports/results/sweep-threads/timings.json and timings.md.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from datetime import datetime, timezone
from pathlib import Path

from sweep_executors import REPO, git, log, set_up, timed, uptime

from prefshift.bench.common import machine, versions
from prefshift.core.atomic import write_json, write_text

RUNS = (("every_core", "0.1,10"), ("share", "0.2,5"), ("share", "0.3,4"), ("every_core", "0.4,3"))


def write(result: dict, out: Path) -> None:
    """timings.json and timings.md from the runs so far (also to redo them from a timings.json)."""
    walls = {side: [r["wall_s"] for r in result["runs"] if r["side"] == side] for side, _ in RUNS}
    if all(walls.values()):
        mean = {side: sum(wall) / len(wall) for side, wall in walls.items()}
        result["ratio_share_over_every_core"] = round(mean["share"] / mean["every_core"], 3)
    write_json(out / "timings.json", result)  # whole or not at all, never through a link
    rows = [
        f"| {run['side']} | {run['values']} | {run['threads']} | {run['wall_s']} | "
        f"{sum(run['stages_run'].values())} | {' '.join(run['loadavg_before'])} |"
        for run in result["runs"]
    ]
    ratio = result.get("ratio_share_over_every_core", "not measured (no run of one side)")
    runs = {s: sum(r["side"] == s for r in result["runs"]) for s in ("every_core", "share")}
    write_text(
        out / "timings.md",
        "\n".join(
            [
                "# A local sweep's torch threads: every core per task against each task's share",
                "",
                f"{result['date']}, {result['machine']['cpu']}, {result['machine']['cores']} cores, "
                f"commit {result['commit'][:7]}, the {result['pipeline']}. Regenerate: "
                f"`python bench/sweep_threads.py{' --small' if result['small'] else ''}`.",
                "",
                f"Each run: `{result['sweep']}`, two points at once.",
                "",
                "| side | λ values | OMP_NUM_THREADS per task | wall (s) | stages DVC ran | load before |",
                "|---|---|---|---|---|---|",
                *rows,
                "",
                f"**share ÷ every core, mean wall time per sweep: {ratio}** ({runs['every_core']} sweep(s) "
                f"with every core, {runs['share']} with the share, of the {len(RUNS)} planned)",
                "",
                f"Note: {result['note'] or 'none'}. Start: {result['uptime_start']}",
                "",
            ]
        ),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="the test suite's shrunken embedded default")
    parser.add_argument("--workdir", type=Path, help="where the clone goes (kept); a committed one is reused")
    parser.add_argument("--out", type=Path, default=REPO / "reports/results/sweep-threads")
    parser.add_argument("--note", default="", help="a line for the result, e.g. who else used the machine")
    opts = parser.parse_args()
    cores = len(os.sched_getaffinity(0))
    sweep = "prefshift sweep -S anchor.lambda=<values> --jobs 2 --no-report"
    result: dict = {
        "date": f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC",
        "machine": machine(),
        "versions": {name: versions()[name] for name in ("dvc", "torch")},
        "commit": git("rev-parse", "HEAD"),
        "pipeline": "test suite's shrunken embedded default" if opts.small else "embedded default",
        "small": opts.small,
        "sweep": sweep,
        "note": opts.note,
        "uptime_start": uptime(),
        "runs": [],
    }
    tmp = opts.workdir or Path(tempfile.mkdtemp(prefix="prefshift-bench-threads-"))
    log(f"clone under {tmp} (kept)")
    clone = set_up("threads", result["commit"], tmp, opts.small, metrics=True)
    for side, values in RUNS:
        threads = str(cores) if side == "every_core" else None
        log(f"{side}: sweep over anchor.lambda={values}, OMP_NUM_THREADS={threads or 'unset'}")
        command = sweep.replace("<values>", values).split()
        run = timed(command, clone, tmp / "threads" / "bench.log", {"OMP_NUM_THREADS": threads})
        shown = threads or str(max(1, cores // 2))  # what the pool gives each of its two tasks
        result["runs"].append({"side": side, "values": values, "threads": shown, **run})
        log(f"{side}: {run['wall_s']} s")
        result["uptime_end"] = uptime()
        write(result, opts.out)  # after every run: a cut-short bench keeps its part


if __name__ == "__main__":
    main()
