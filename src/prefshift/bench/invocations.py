"""The whole bench as several separate invocations, merged into one report.

Rounds inside one invocation share a process tree, a tokenizer, a page cache and whatever
the machine was doing in those minutes; a second invocation is a fresh start. The figures
the README quotes are therefore medians across invocations, with the spread across them:
each invocation runs as its own `python -m prefshift.bench` process, and `aggregate`
merges their bench.json files leaf by leaf:

- a summary (median/min/max/n) becomes the median of the invocation medians, the min of the
  mins and max of the maxes, with the invocation medians kept;
- a ratio becomes the median of the invocation ratios, with their min–max
  (`invocation_min`/`invocation_max`), the min–max over every paired round of every
  invocation, and the median of the best-run ratios;
- any other number is the median, any other value is kept when all invocations agree and
  listed otherwise; targets are judged again on the merged ratios.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from prefshift.bench.common import BenchError

SUMMARY_KEYS = {"median", "min", "max", "n"}
RATIO_KEYS = {"ratio", "best_runs", "round_min", "round_max"}


def _is_number(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _merge(values: list, where: str):
    first = values[0]
    if all(isinstance(v, dict) for v in values):
        keys = set(first)
        if keys >= RATIO_KEYS:
            ratios = [v["ratio"] for v in values]
            return {
                "ratio": statistics.median(ratios),
                "best_runs": statistics.median(v["best_runs"] for v in values),
                "round_min": min(v["round_min"] for v in values),
                "round_max": max(v["round_max"] for v in values),
                "invocation_min": min(ratios),
                "invocation_max": max(ratios),
                "invocation_ratios": ratios,
            }
        if keys == SUMMARY_KEYS:
            medians = [v["median"] for v in values]
            return {
                "median": statistics.median(medians),
                "min": min(v["min"] for v in values),
                "max": max(v["max"] for v in values),
                "n": sum(v["n"] for v in values),
                "invocation_medians": medians,
            }
        if any(set(v) != keys for v in values):
            raise BenchError(f"bench invocations disagree on the keys of {where}: cannot merge them")
        return {key: _merge([v[key] for v in values], f"{where}.{key}") for key in first}
    if all(_is_number(v) for v in values):
        return first if all(v == first for v in values) else statistics.median(values)
    return first if all(v == first for v in values) else values


def set_targets(result: dict) -> None:
    """Judge every target again on the merged (median) ratios."""
    from prefshift.bench import anchor, evaluation, realistic, training

    for entry in (result.get("training") or {}).get("models", {}).values():
        entry["target"] = training.trl_target(entry["vs_ours"])
    if result.get("realistic") and "shared_over_two_sequence" in result["realistic"]:
        result["realistic"]["target"] = realistic.targets(result["realistic"])
    for entry in (result.get("anchor") or {}).values():
        anchor.set_targets(entry["ratios"])
    for entry in (result.get("evaluation") or {}).get("models", {}).values():
        entry["target"] = evaluation.scoring_target(entry["batched_over"])


def aggregate(results: list[dict]) -> dict:
    """One bench result from several invocations' results (see the module docstring)."""
    sections = ("training", "realistic", "anchor", "evaluation")
    merged = {key: _merge([r[key] for r in results], key) for key in sections if results[0].get(key)}
    set_targets(merged)
    first = results[0]
    return {
        "date": first["date"],
        "machine": {
            **first["machine"],
            "load_avg_1_5_15": [r["machine"]["load_avg_1_5_15"] for r in results],
        },
        "versions": first["versions"],
        "settings": {**first["settings"], "invocations": len(results)},
        "note": first.get("note"),
        "gpu": first["gpu"],
        "invocation_dates": [r["date"] for r in results],
        **merged,
    }


def run_invocations(count: int, argv: list[str], reps: int, log: Callable[[str], None] = print) -> list[dict]:
    """Run `python -m prefshift.bench ARGV --out TMP` `count` times, one process each; their results.

    Invocation i numbers its rounds from i · reps, so the order of the variants keeps
    alternating from one invocation to the next (`common.interleave`)."""
    results = []
    for i in range(count):
        log(f"bench invocation {i + 1}/{count}")
        with tempfile.TemporaryDirectory(prefix="prefshift-bench-invocation-") as tmp:
            command = [sys.executable, "-m", "prefshift.bench", *argv, "--first-round", str(i * reps)]
            done = subprocess.run([*command, "--out", tmp], check=False)
            if done.returncode != 0:
                raise BenchError(
                    f"bench invocation {i + 1}/{count} failed (exit {done.returncode}); see above"
                )
            results.append(json.loads((Path(tmp) / "bench.json").read_text()))
    return results
