"""What DVC adds to each stage it runs, on a reproduced project: the stage's command alone against
`dvc repro -f -s <stage>`, and DVC's rewrite of dvc.lock alone.

    prefshift bench --pipeline-only --keep --out /tmp/pipe    # prints the kept clone's path
    python bench/dvc_stage_overhead.py --project <that path>

After every stage it runs, DVC parses dvc.lock round trip and dumps it again (`modify_yaml`), in
pure Python whether or not ruamel.yaml's C parser is installed. On the embedded default most of
that file is the stages' source deps (scripts/stage_deps.py), so its size, and this cost, is paid
once per stage run. `plan` is the default stage because its own command does almost nothing: what
`dvc repro -f -s plan` takes beyond it is DVC's. The rewrite is timed in this process on a copy of
dvc.lock, so the project is not touched by it; the forced stage rewrites the project's dvc.lock
with what it held. Rounds alternate the three measures.

Writes reports/results/dvc-stage-overhead/timings.json and timings.md.
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import statistics
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import yaml
from sweep_executors import REPO, git, log, timed, uptime

from prefshift.bench.common import machine, versions
from prefshift.core.atomic import write_json, write_text


def rewrite_s(lock: Path) -> float:
    """Seconds for DVC's round-trip parse and dump of a copy of `lock`, as after a stage."""
    from dvc.utils.serialize import modify_yaml

    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(shutil.copy(lock, Path(tmp) / "dvc.lock"))
        start = time.perf_counter()
        with modify_yaml(str(copy)) as data:
            data["schema"] = data["schema"]
        return round(time.perf_counter() - start, 3)


def write(result: dict, out: Path) -> None:
    runs = result["runs"]
    result["median_s"] = {name: statistics.median(r[name] for r in runs) for name in runs[0]}
    median = result["median_s"]
    write_json(out / "timings.json", result)  # whole or not at all, never through a link
    stage = result["stage"]
    measures = {
        "command": f"`{result['command']}` alone",
        "forced": f"`dvc repro -f -s {stage}`",
        "rewrite": "dvc.lock rewrite (`modify_yaml`)",
    }
    rows = [
        f"| {shown} | {' / '.join(str(r[key]) for r in runs)} | {median[key]} |"
        for key, shown in measures.items()
    ]
    overhead = median["forced"] - median["command"]
    write_text(
        out / "timings.md",
        "\n".join(
            [
                "# What DVC adds to each stage it runs",
                "",
                f"{result['date']}, {result['machine']['cpu']}, {result['machine']['cores']} cores, "
                f"commit {result['commit'][:7]}, DVC {result['versions']['dvc']}, "
                f"project {result['project']} (a clone kept by `prefshift bench --pipeline-only --keep`; "
                f"{result['lock_lines']:,} lines of dvc.lock). Regenerate: "
                f"`python bench/dvc_stage_overhead.py --project {result['project']}`.",
                "",
                "| measure | wall seconds, in the order run | median |",
                "|---|---|---|",
                *rows,
                "",
                f"DVC's share of a forced `{stage}`: {overhead:.2f} s a stage run, of which the rewrite of"
                f" dvc.lock is {median['rewrite']:.2f} s.",
                "",
                f"Load: {result['uptime_start']} at the start; {result['uptime_end']} at the end.",
                "",
            ]
        ),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--project", type=Path, required=True, help="a reproduced project (its dvc.lock)")
    parser.add_argument("--stage", default="plan", help="the stage to force (its command does little)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=REPO / "reports/results/dvc-stage-overhead")
    opts = parser.parse_args()
    project, lock = opts.project.resolve(), opts.project.resolve() / "dvc.lock"
    command = yaml.safe_load(lock.read_text())["stages"][opts.stage]["cmd"]  # as DVC resolved it
    result: dict = {
        "date": f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC",
        "machine": machine(),
        "versions": {"dvc": versions()["dvc"]},
        "commit": git("rev-parse", "HEAD"),
        "project": str(opts.project),
        "stage": opts.stage,
        "command": command,
        "lock_lines": len(lock.read_text().splitlines()),
        "uptime_start": uptime(),
        "runs": [],
    }
    with tempfile.TemporaryDirectory() as tmp:
        output = Path(tmp) / "bench.log"
        for round_ in range(opts.rounds):
            run = {"command": timed(shlex.split(command), project, output)["wall_s"]}
            run["forced"] = timed(["dvc", "repro", "-f", "-s", opts.stage], project, output)["wall_s"]
            run["rewrite"] = rewrite_s(lock)
            result["runs"].append(run)
            log(f"round {round_ + 1}/{opts.rounds}: {run}")
    result["uptime_end"] = uptime()
    write(result, opts.out)
    log(f"wrote {opts.out / 'timings.md'}: {result['median_s']}")


if __name__ == "__main__":
    main()
