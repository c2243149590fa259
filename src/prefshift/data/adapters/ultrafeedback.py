"""UltraFeedback, in its binarized form and its original four-completion form.

`ultrafeedback` (HuggingFaceH4/ultrafeedback_binarized, train_prefs/test_prefs): `chosen`
and `rejected` are message lists that end with the assistant reply; the messages before
it are the prompt. Rows whose `score_chosen` equals `score_rejected` are ties (skipped).

`ultrafeedback_full` (openbmb/UltraFeedback): one `instruction` and four `completions`,
each with GPT-4 ratings. A completion's score is its `fine-grained_score` (the mean of
its aspect ratings), recomputed from `annotations` when absent. The pair is the best
against the worst completion; equal scores are a tie. The same completions also form
a best-of-n group. The hub has one split, so prompts are held out by hash: an
instruction whose sha256 falls in the top TEST_FRACTION of the range is test, for
pairs and groups alike, so no test prompt is ever trained on.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from prefshift.config.params import Params
from prefshift.data.adapters.base import Adapter, Record, source_rows, value
from prefshift.data.schema import Group, Pair, RowError, content_hash, make_pair

TEST_FRACTION = 0.1


@dataclass(frozen=True)
class BinarizedAdapter(Adapter):
    def to_pair(self, row: dict[str, Any], where: str, params: Params) -> Pair:
        chosen, rejected = value(row, "chosen", where), value(row, "rejected", where)
        score_chosen, score_rejected = value(row, "score_chosen", where), value(row, "score_rejected", where)
        if score_chosen == score_rejected:
            raise RowError("tie", f"{where}: score_chosen equals score_rejected ({score_chosen})")
        if score_chosen < score_rejected:
            raise RowError("bad_label", f"{where}: score_chosen {score_chosen} < {score_rejected}")
        for name, messages in (("chosen", chosen), ("rejected", rejected)):
            if not isinstance(messages, list) or not messages or not isinstance(messages[-1], dict):
                raise RowError("bad_format", f"{where}: field {name!r} must be a list of messages")
            if messages[-1].get("role") != "assistant":
                raise RowError("bad_format", f"{where}: field {name!r} must end with an assistant message")
        if chosen[:-1] != rejected[:-1]:
            raise RowError("prompt_mismatch", f"{where}: chosen and rejected differ before the last reply")
        return make_pair(
            dataset=self.name,
            category=self.category,
            prompt=chosen[:-1],
            chosen=chosen[-1].get("content"),
            rejected=rejected[-1].get("content"),
            meta={
                "score_chosen": score_chosen,
                "score_rejected": score_rejected,
                "prompt_id": row.get("prompt_id"),
            },
            where=where,
        )


def is_test_prompt(instruction: str) -> bool:
    digest = hashlib.sha256(instruction.encode("utf-8")).hexdigest()
    return int(digest[:8], 16) / 0x100000000 >= 1 - TEST_FRACTION


def completion_score(completion: Any) -> float | None:
    """The completion's mean aspect rating, or None when it has none (not rated)."""
    if not isinstance(completion, dict):
        return None
    score = completion.get("fine-grained_score")
    if isinstance(score, (int, float)) and not isinstance(score, bool) and not math.isnan(score):
        return float(score)
    ratings = []
    for aspect in (completion.get("annotations") or {}).values():
        rating = aspect.get("Rating") if isinstance(aspect, dict) else None
        try:
            ratings.append(float(rating))
        except (TypeError, ValueError):
            continue
    return sum(ratings) / len(ratings) if ratings else None


def rated_completions(row: dict[str, Any], where: str) -> list[tuple[str, float]]:
    """(response, score) of the usable completions, in source order."""
    completions = value(row, "completions", where)
    if not isinstance(completions, list):
        raise RowError("bad_format", f"{where}: field 'completions' must be a list")
    rated = []
    for completion in completions:
        score = completion_score(completion)
        response = completion.get("response") if isinstance(completion, dict) else None
        if score is not None and isinstance(response, str) and response.strip():
            rated.append((response, score))
    if len(rated) < 2:
        raise RowError("too_few_rated", f"{where}: fewer than two rated, non-empty completions")
    return rated


@dataclass(frozen=True)
class FullAdapter(Adapter):
    def rows(self, split: str, params: Params) -> Iterator[Record]:
        want_test = split == "test"
        for where, row in source_rows(self, split, params):
            instruction = row.get("instruction")
            if isinstance(instruction, str) and is_test_prompt(instruction) != want_test:
                continue
            yield where, row

    def to_pair(self, row: dict[str, Any], where: str, params: Params) -> Pair:
        instruction = value(row, "instruction", where)
        rated = rated_completions(row, where)
        best = max(rated, key=lambda item: item[1])
        worst = min(rated, key=lambda item: item[1])
        if best[1] == worst[1]:
            raise RowError("tie", f"{where}: all completions share the score {best[1]}")
        return make_pair(
            dataset=self.name,
            category=self.category,
            prompt=[{"role": "user", "content": instruction}],
            chosen=best[0],
            rejected=worst[0],
            meta={"score_chosen": best[1], "score_rejected": worst[1], "source": row.get("source")},
            where=where,
        )

    def load_groups(self, params: Params) -> list[Group]:
        """Test-prompt groups whose rated completions do not all share one score."""
        groups = []
        for where, row in self.rows("test", params):
            try:
                instruction = value(row, "instruction", where)
                rated = rated_completions(row, where)
            except RowError:
                continue
            responses, scores = [r for r, _ in rated], [s for _, s in rated]
            if len(set(scores)) < 2 or not isinstance(instruction, str) or not instruction.strip():
                continue
            prompt = [{"role": "user", "content": instruction}]
            group_id = content_hash(self.name, prompt, responses)
            groups.append(Group(group_id, self.name, self.category, prompt, responses, scores))
        return groups


ULTRAFEEDBACK = BinarizedAdapter(
    name="ultrafeedback",
    category="helpful",
    hf_id="HuggingFaceH4/ultrafeedback_binarized",
    splits={"train": "train_prefs", "test": "test_prefs"},
    columns=("chosen", "rejected", "score_chosen", "score_rejected"),
    needs=(
        "hub HuggingFaceH4/ultrafeedback_binarized, or data.sources.ultrafeedback.path: a directory with "
        "train_prefs-*.parquet and test_prefs-*.parquet (or .jsonl)"
    ),
)
ULTRAFEEDBACK_FULL = FullAdapter(
    name="ultrafeedback_full",
    category="helpful",
    hf_id="openbmb/UltraFeedback",
    splits={"train": "train", "test": "train"},
    columns=("instruction", "completions"),
    needs=(
        "hub openbmb/UltraFeedback (one split; 10% of prompts held out by hash as test), or "
        "data.sources.ultrafeedback_full.path: a directory with train.jsonl/.parquet; "
        "also yields best-of-n groups"
    ),
)
