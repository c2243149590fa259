"""Anthropic HH-RLHF (helpful-base, harmless-base): two full transcripts per row.

Each row has `chosen` and `rejected`, whole dialogues in the "\\n\\nHuman: …\\n\\nAssistant: …"
form that differ only in the final assistant turn. The prompt is the shared dialogue up
to the last "\\n\\nAssistant:"; the responses are what follows it. Rows whose two
prefixes differ (the dataset has a few) are skipped as `prompt_mismatch`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from prefshift.config.params import Params
from prefshift.data.adapters.base import Adapter, value
from prefshift.data.schema import Pair, RowError, make_pair

ASSISTANT = "\n\nAssistant:"
_TURN = re.compile(r"(?:\A|\n)[ \t]*(Human|Assistant):[ \t]?")
_ROLES = {"Human": "user", "Assistant": "assistant"}


def parse_turns(dialogue: str, where: str) -> list[dict[str, str]]:
    """Messages of a "Human: … Assistant: …" dialogue; a marker must start a line."""
    marks = list(_TURN.finditer(dialogue))
    if not marks or dialogue[: marks[0].start()].strip():
        raise RowError("bad_transcript", f"{where}: dialogue does not start with a Human:/Assistant: turn")
    messages = []
    for mark, following in zip(marks, [*marks[1:], None], strict=True):
        end = following.start() if following else len(dialogue)
        messages.append({"role": _ROLES[mark.group(1)], "content": dialogue[mark.end() : end].strip()})
    return messages


def split_transcript(text: str, where: str) -> tuple[str, str]:
    """(shared dialogue, final assistant response) of one transcript."""
    cut = text.rfind(ASSISTANT)
    if cut < 0:
        raise RowError("bad_transcript", f"{where}: no '\\n\\nAssistant:' turn in the transcript")
    return text[:cut], text[cut + len(ASSISTANT) :].strip()


def transcripts_to_pair(dataset: str, category: str, chosen: Any, rejected: Any, where: str) -> Pair:
    """The pair encoded by two HH-style transcripts (also used by the local adapter)."""
    for name, text in (("chosen", chosen), ("rejected", rejected)):
        if not isinstance(text, str):
            raise RowError("bad_type", f"{where}: field {name!r} must be a transcript string")
    prefix, chosen_reply = split_transcript(chosen, where)
    other_prefix, rejected_reply = split_transcript(rejected, where)
    if prefix.strip() != other_prefix.strip():
        raise RowError("prompt_mismatch", f"{where}: the transcripts differ before the last reply")
    return make_pair(
        dataset=dataset,
        category=category,
        prompt=parse_turns(prefix, where),
        chosen=chosen_reply,
        rejected=rejected_reply,
        where=where,
    )


@dataclass(frozen=True)
class HHAdapter(Adapter):
    def to_pair(self, row: dict[str, Any], where: str, params: Params) -> Pair:
        return transcripts_to_pair(
            self.name, self.category, value(row, "chosen", where), value(row, "rejected", where), where
        )


def _needs(data_dir: str, name: str) -> str:
    return (
        f"hub Anthropic/hh-rlhf data_dir {data_dir}, or data.sources.{name}.path: a directory with "
        "train.jsonl(.gz) and test.jsonl(.gz) as in the hub repository"
    )


HH_HELPFUL = HHAdapter(
    name="hh_helpful",
    category="helpful",
    hf_id="Anthropic/hh-rlhf",
    data_dir="helpful-base",
    columns=("chosen", "rejected"),
    needs=_needs("helpful-base", "hh_helpful"),
)
HH_HARMLESS = HHAdapter(
    name="hh_harmless",
    category="harmless",
    hf_id="Anthropic/hh-rlhf",
    data_dir="harmless-base",
    columns=("chosen", "rejected"),
    needs=_needs("harmless-base", "hh_harmless"),
)
