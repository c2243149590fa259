"""`prefshift judge-target --target T`: the best-of-n judge's own accuracy on one target.

The judge trains on the source's judge split and never reads a target, so its accuracy on a
target is scoring, keyed by that target (DVC's `judge_target@<T>`): adding a target runs this
stage for it and leaves the judge as it is; dropping one runs nothing. reports/judge_targets/T.json
holds the same blocks as the judge's ID entry in reports/judge.json (accuracy with a bootstrap
interval, and on the synthetic suite the breakdown by cue), and the report joins them. When the
judge stage skipped best-of-n, its note (models/judge/judge.json) says why, and this file repeats
the reason without loading anything.
"""

from __future__ import annotations

import json
from typing import Any

from prefshift.config.params import ConfigError, Params
from prefshift.core.atomic import write_json
from prefshift.core.console import messages
from prefshift.core.paths import Layout
from prefshift.pipeline.stages.evaluate import rounded
from prefshift.pipeline.stages.gold_judge import JudgeError, judge_source
from prefshift.pipeline.stages.judge import NOTE, accuracy

console = messages()


def _judge_skipped(layout: Layout) -> str | None:
    """Why the judge stage loaded no judge (its note's `skipped`), or None when a judge is there."""
    note = layout.judge_dir / NOTE
    if note.exists():
        return json.loads(note.read_text(encoding="utf-8")).get("skipped")
    if not (layout.judge_dir / "config.json").exists():
        raise JudgeError(f"{layout.judge_dir}: no judge; run `prefshift judge`")
    return None


def run(params: Params, layout: Layout, target: str) -> dict[str, Any]:
    if target not in params.data.targets:
        raise ConfigError(f"--target {target}: not one of data.targets ({', '.join(params.data.targets)})")
    reason = _judge_skipped(layout)
    if reason:
        doc: dict[str, Any] = {"target": target, "skipped": reason}
        console.print(f"judge-target {target}: skipped: {reason}")
    else:
        scored, breakdown = accuracy(judge_source(params, layout), params, layout, [("ood", target)])
        doc = {"target": target, "accuracy": scored}
        if breakdown is not None:
            doc["breakdown"] = breakdown
        doc = rounded(doc)
        low, high = doc["accuracy"][target]["ci"]
        console.print(
            f"judge accuracy {target} (ood): {doc['accuracy'][target]['acc']:.1f} [{low:.1f}, {high:.1f}]"
        )
    write_json(layout.judge_target_report(target), doc)
    return doc
