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

from prefshift.console import messages
from prefshift.heldout_scores import over_threshold


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


def truncation_section(metrics: Mapping[str, Mapping[str, Any]], threshold: float) -> str | None:
    """The markdown section, with one warning line when a split is over `threshold`
    (evaluate.warn_truncated_share); the same line goes once to the stage output."""
    rows = truncation_rows(metrics)
    if not rows:
        return None
    splits = list(dict.fromkeys(split for per_split in rows.values() for split in per_split))
    header = "| model | " + " | ".join(splits) + " |\n|---|" + "---|" * len(splits)
    lines = [
        f"| {model} | " + " | ".join(_cell(per_split[s]) if s in per_split else "—" for s in splits) + " |"
        for model, per_split in rows.items()
    ]
    parts = [
        "## Truncation\n\nShare of pairs (best-of-n: groups) whose prompt or a response was cut to "
        "encode.max_length, (cut / scored), and the tokens lost over all scored sequences. Texts over "
        "the character bound are cut before tokenising; their lost tokens are estimated at the kept "
        "slice's tokens per character."
    ]
    over = {
        f"{model} {split}": share
        for model, per_split in rows.items()
        for split, share in over_threshold(per_split, threshold).items()
    }
    if over:
        listed = ", ".join(f"{name} {share:.0%}" for name, share in over.items())
        warning = (
            f"warning: truncation cut more than {threshold:.0%} (evaluate.warn_truncated_share) of: "
            f"{listed}; accuracy there measures the first encode.max_length tokens only"
        )
        messages().print(warning)
        parts.append(f"**{warning}**")
    parts.append(header + "\n" + "\n".join(lines))
    return "\n\n".join(parts)
