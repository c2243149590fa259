"""Time DVC on the reproduced embedded default with ruamel.yaml's C parser against its pure-Python
one, which is what DVC got once ruamel.yaml 0.19 made the C parser an optional package.

    python bench/dvc_yaml_loader.py                  # the embedded default at HEAD
    python bench/dvc_yaml_loader.py --small          # the test suite's shrunken embedded default
    python bench/dvc_yaml_loader.py --workdir DIR    # keep the clone there; a committed one is reused
    python bench/dvc_yaml_loader.py --project DIR    # time a project reproduced already (it reruns
                                                     # `inputs` and evaluate@naive there)

A fresh clone of this repository at HEAD gets its baseline reproduced and committed, untimed (set-up
and timing are bench/sweep_executors.py's). Then, in ABBA rounds so that drifting load weighs on
both sides, each side runs three DVC commands a user runs all the time: a no-op `dvc repro` (only
`inputs` runs, and DVC rewrites dvc.lock for it), `dvc status`, and one stage forced (`dvc repro
-f -s evaluate@naive`: DVC reads the pipeline, runs the stage, rewrites dvc.lock). `c` is the
environment as installed (pyproject.toml brings ruamel.yaml.clib); `pure` puts a directory first on
PYTHONPATH whose `_ruamel_yaml` module fails to import, which is how ruamel.yaml finds no C parser.
The ratio is c ÷ pure, median wall time per command, written after every round.

Writes reports/results/dvc-yaml-loader/timings.json and timings.md.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from datetime import datetime, timezone
from pathlib import Path

from sweep_executors import REPO, git, log, set_up, timed, uptime

from prefshift.bench.common import machine, versions
from prefshift.core.atomic import write_json, write_text

COMMANDS = {
    "no-op repro": ["dvc", "repro"],
    "status": ["dvc", "status"],
    "one stage forced": ["dvc", "repro", "-f", "-s", "evaluate@naive"],
}
SIDES = ("c", "pure")


def write(result: dict, out: Path) -> None:
    """timings.json and timings.md from the rounds so far (also to redo them from a timings.json)."""
    runs = result["runs"]
    walls = {
        name: {s: [r["wall_s"] for r in runs if (r["command"], r["side"]) == (name, s)] for s in SIDES}
        for name in COMMANDS
    }
    result["median_s"] = {
        name: {side: statistics.median(w) for side, w in by_side.items() if w}
        for name, by_side in walls.items()
    }
    result["ratio_c_over_pure"] = {
        name: round(m["c"] / m["pure"], 3) for name, m in result["median_s"].items() if len(m) == 2
    }
    write_json(out / "timings.json", result)  # whole or not at all, never through a link
    rows = [
        f"| {name} | {' / '.join(str(w) for w in walls[name]['c'])} | "
        f"{' / '.join(str(w) for w in walls[name]['pure'])} | {result['ratio_c_over_pure'].get(name, '—')} |"
        for name in COMMANDS
    ]
    write_text(
        out / "timings.md",
        "\n".join(
            [
                "# DVC's YAML: ruamel.yaml's C parser against its pure-Python one",
                "",
                f"{result['date']}, {result['machine']['cpu']}, {result['machine']['cores']} cores, "
                f"commit {result['commit'][:7]}, DVC {result['versions']['dvc']}, the {result['pipeline']}"
                f" ({result['lock_lines']} lines of dvc.lock). Regenerate: "
                f"`python bench/dvc_yaml_loader.py{' --small' if result['small'] else ''}"
                f"{' --project ' + result['project'] if result.get('project') else ''}`.",
                "",
                f"{result['rounds']} ABBA round(s) of each command; wall seconds in the order run.",
                "",
                "| command | C parser (s) | pure Python (s) | C ÷ pure, median |",
                "|---|---|---|---|",
                *rows,
                "",
                f"Load: {result['uptime_start']} at the start; "
                f"{result.get('uptime_end', 'cut short')} at the end."
                + (f" Note: {result['note']}" if result["note"] else ""),
                "",
            ]
        ),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="the test suite's shrunken embedded default")
    parser.add_argument("--workdir", type=Path, help="where the clone goes (kept); a committed one is reused")
    parser.add_argument("--project", type=Path, help="a reproduced project to time instead of a new clone")
    parser.add_argument("--rounds", type=int, default=3, help="ABBA rounds: each command twice a side")
    parser.add_argument("--out", type=Path, default=REPO / "reports/results/dvc-yaml-loader")
    parser.add_argument("--note", default="", help="a line for the result, e.g. who else used the machine")
    opts = parser.parse_args()
    tmp = opts.workdir or Path(tempfile.mkdtemp(prefix="prefshift-bench-yaml-"))
    commit = git("rev-parse", "HEAD")
    clone = opts.project.resolve() if opts.project else set_up("yaml", commit, tmp, opts.small, metrics=False)
    (tmp / "yaml").mkdir(exist_ok=True)
    shim = tmp / "pure-yaml"
    shim.mkdir(exist_ok=True)
    (shim / "_ruamel_yaml.py").write_text('raise ImportError("no C parser: the bench\'s pure-Python side")\n')
    env = {"c": {}, "pure": {"PYTHONPATH": f"{shim}:{clone / 'src'}"}}
    result: dict = {
        "date": f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC",
        "machine": machine(),
        "versions": {name: versions()[name] for name in ("dvc", "torch")},
        "commit": commit,
        "pipeline": f"project {opts.project}"
        if opts.project
        else "test suite's shrunken embedded default"
        if opts.small
        else "embedded default",
        "small": opts.small,
        "project": str(opts.project) if opts.project else None,
        "lock_lines": len((clone / "dvc.lock").read_text().splitlines()),
        "rounds": opts.rounds,
        "note": opts.note,
        "uptime_start": uptime(),
        "runs": [],
    }
    log(f"clone {clone}; {result['uptime_start']}")
    for round_ in range(opts.rounds):
        for side in (*SIDES, *reversed(SIDES)):
            for name, command in COMMANDS.items():
                run = timed(command, clone, tmp / "yaml" / "bench.log", env[side])
                result["runs"].append({"round": round_, "side": side, "command": name, **run})
                log(f"round {round_ + 1}/{opts.rounds} {side}: {name} {run['wall_s']} s")
        result["uptime_end"] = uptime()
        write(result, opts.out)
    log(f"wrote {opts.out / 'timings.md'}: {result['ratio_c_over_pure']}")


if __name__ == "__main__":
    main()
