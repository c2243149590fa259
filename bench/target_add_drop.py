"""Time `dvc repro` after adding an OOD target and after dropping it, against a full one (issue 47).

    python bench/target_add_drop.py            # the embedded default at HEAD
    python bench/target_add_drop.py --small    # the test suite's shrunken embedded default

A fresh clone of this repository at HEAD (sources run from the clone, as in
bench/sweep_executors.py, whose helpers this reuses) is reproduced in full, timed; then a third
target, the RewardBench fixture in its published parquet format (tests/fixtures/benchmarks), is
added to `data.targets` and `dvc repro` timed again; then it is dropped and `dvc repro` timed a
third time. Each step records which stages ran and which DVC restored from its run cache: a
target change should run that target's own stages and what reads scores, never a teacher, label,
targets, train or judge stage. Each figure is one run on a possibly shared machine; the load
averages around it are recorded.

Writes reports/results/target-add-drop/timings.json and timings.md.
"""

from __future__ import annotations

import argparse
import tempfile
from datetime import datetime, timezone
from pathlib import Path

from sweep_executors import REPO, git, log, shrink, timed, uptime

from prefshift.bench.common import machine, versions
from prefshift.config.params import dump_yaml, read_yaml
from prefshift.core.atomic import write_json, write_text

NEW = "rewardbench_chat"
FIXTURE = REPO / "tests" / "fixtures" / "benchmarks" / "rewardbench" / "filtered-00000-of-00001.parquet"
TRAINING = (
    *("backbone", "plan", "reference", "seam_principles", "teacher@", "label@", "targets@", "train@"),
    "judge",  # the best-of-n judge is trained too (judge_target@T only scores it)
)


def stages(log_text: str, marker: str) -> list[str]:
    """Stage names on the lines of one `dvc repro` output that carry `marker`."""
    return sorted({line.split("'")[1] for line in log_text.splitlines() if marker in line and "'" in line})


def repro(clone: Path, step: str) -> dict:
    step_log = clone.parent / f"{step}.log"
    result = timed(["dvc", "repro"], clone, step_log)
    text = step_log.read_text(encoding="utf-8")
    ran, restored = stages(text, "Running stage"), stages(text, "is cached - skipping run")
    trained = [name for name in ran if name.startswith(TRAINING) and not name.startswith("judge_target")]
    log(f"{step}: {result['wall_s']} s, {len(ran)} stages run, {len(restored)} restored, training: {trained}")
    return {**result, "ran": ran, "restored": restored, "training_ran": trained}


def set_targets(clone: Path, targets: list[str], sources: dict) -> None:
    path = clone / "params.yaml"
    params = read_yaml(path.read_text(), str(path))
    params["data"].update(targets=targets, sources=sources)
    path.write_text(dump_yaml(params))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--small", action="store_true", help="the test suite's shrunken embedded default")
    parser.add_argument("--out", type=Path, default=REPO / "reports" / "results" / "target-add-drop")
    parser.add_argument("--note", default="")
    args = parser.parse_args()
    commit = git("rev-parse", "HEAD")
    start = uptime()
    with tempfile.TemporaryDirectory(prefix="prefshift-targets-") as tmp:
        clone = Path(tmp) / "project"
        git("clone", "-q", str(REPO), str(clone))
        git("checkout", "-q", "--detach", commit, cwd=clone)
        git("remote", "remove", "origin", cwd=clone)
        if args.small:
            shrink(clone)
        data = read_yaml((clone / "params.yaml").read_text(), str(clone / "params.yaml"))["data"]
        runs = {"full": repro(clone, "full")}
        set_targets(clone, [*data["targets"], NEW], {**data["sources"], NEW: {"path": str(FIXTURE)}})
        runs["add"] = repro(clone, "add")
        set_targets(clone, data["targets"], data["sources"])
        runs["drop"] = repro(clone, "drop")
        runs["noop"] = repro(clone, "noop")
    result = {
        "date": f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC",
        "machine": machine(),
        "versions": versions(),
        "commit": commit,
        "pipeline": "test suite's shrunken embedded default" if args.small else "embedded default",
        "target": NEW,
        "runs": runs,
        "uptime_start": start,
        "uptime_end": uptime(),
        "note": args.note,
    }
    write(result, args.out)


def write(result: dict, out: Path) -> None:
    write_json(out / "timings.json", result)  # whole or not at all, never through a link
    runs, full = result["runs"], result["runs"]["full"]["wall_s"]
    labels = {
        "full": "full (fresh clone)",
        "add": f"after adding `{result['target']}`",
        "drop": "after dropping it",
        "noop": "again (no-op)",
    }
    rows = [
        f"| {label} | {runs[key]['wall_s']} | {runs[key]['wall_s'] / full:.2f} | {len(runs[key]['ran'])} | "
        f"{len(runs[key]['restored'])} | {', '.join(runs[key]['training_ran']) or 'none'} |"
        for key, label in labels.items()
    ]
    write_text(
        out / "timings.md",
        "\n".join(
            [
                "# A new OOD target is scored, not trained for (issue 47): `dvc repro` times",
                "",
                f"{result['date']}, {result['machine']['cpu']}, {result['machine']['cores']} cores; the "
                f"{result['pipeline']} at `{result['commit'][:7]}`, in a fresh clone.",
                "",
                "| `dvc repro` | wall (s) | ÷ full | stages run | restored from run cache | training run |",
                "|---|---|---|---|---|---|",
                *rows,
                "",
                f"Stages run after adding: {', '.join(runs['add']['ran'])}.",
                "",
                f"After dropping: {', '.join(runs['drop']['ran'])}; restored: "
                f"{', '.join(runs['drop']['restored']) or 'none'}.",
                "",
                f"Load (`uptime`) at start: `{result['uptime_start']}`; at end: `{result['uptime_end']}`.",
                *([f"\n{result['note']}"] if result["note"] else []),
                "",
                "Each figure is one run. Written by `python bench/target_add_drop.py`.",
                "",
            ]
        ),
    )


if __name__ == "__main__":
    main()
