"""The report's truncation section: how much of each split the models scored cut to encode.max_length.

Accuracy on a split where most responses were cut measures the models on the first
max_length tokens, not on what the annotators compared, so the report shows, per model
and split, the share of pairs (or best-of-n groups) whose prompt or a response was cut
and the tokens lost, from the `truncation` block `prefshift evaluate` copies into each
metrics file. Weak and strong models have their own tokenizers, so each gets its row.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from prefshift.core.console import messages
from prefshift.pipeline.heldout_scores import over_threshold


def truncation_rows(metrics: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, dict]]:
    """model → split → counts: the teacher's (the same in every metrics file) and each student's."""
    rows: dict[str, dict[str, dict]] = {}
    for method, doc in metrics.items():
        block = doc.get("truncation") or {}
        if block.get("teacher") and "teacher" not in rows:
            rows["teacher"] = block["teacher"]
        if block.get("student"):
            rows[method] = block["student"]
    return rows


def _cell(counts: Mapping[str, Any]) -> str:
    lost = counts["prompt_tokens_lost"] + counts["response_tokens_lost"]
    return f"{counts['share']:.1%} ({counts['truncated']}/{counts['items']}), {lost} tok"


def _ordered_splits(rows: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """id_test, the other pair splits, then the best-of-n group sets, each in first-seen order."""
    seen = list(dict.fromkeys(split for per_split in rows.values() for split in per_split))
    return sorted(seen, key=lambda s: (s != "id_test", s.startswith("groups/")))


def truncation_section(metrics: Mapping[str, Mapping[str, Any]], threshold: float) -> str | None:
    """The markdown section (a split per row, a model per column), with one warning line when a
    split is over `threshold` (evaluate.warn_truncated_share); the same line goes once to the stage
    output."""
    rows = truncation_rows(metrics)
    if not rows:
        return None
    splits = _ordered_splits(rows)
    header = "| split | " + " | ".join(rows) + " |\n|---|" + "---|" * len(rows)
    lines = [
        f"| {split} | "
        + " | ".join(_cell(per[split]) if split in per else "—" for per in rows.values())
        + " |"
        for split in splits
    ]
    parts = [
        "## Truncation\n\nShare of pairs (best-of-n: groups) whose prompt or a response was cut to "
        "encode.max_length, (cut / scored), and the tokens lost over all scored sequences. Texts over "
        "the character bound are cut before tokenising; their lost tokens are estimated at the kept "
        "slice's tokens per character."
    ]
    worst: dict[str, float] = {}
    for per_split in rows.values():
        for split, share in over_threshold(per_split, threshold).items():
            worst[split] = max(share, worst.get(split, 0.0))
    if worst:
        listed = ", ".join(f"{split} {worst[split]:.0%}" for split in splits if split in worst)
        warning = (
            f"warning: truncation cut more than {threshold:.0%} (evaluate.warn_truncated_share) of the "
            f"pairs of {listed} (the most of any model); accuracy there measures the first "
            "encode.max_length tokens only"
        )
        messages().print(warning)
        parts.append(f"**{warning}**")
    parts.append(header + "\n" + "\n".join(lines))
    return "\n\n".join(parts)
