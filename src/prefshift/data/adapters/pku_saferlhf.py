"""PKU-SafeRLHF: one prompt, `response_0` and `response_1`, two separate human labels.

`pku_saferlhf` (harmless) takes `safer_response_id` as chosen. When both responses carry
the same `is_response_*_safe` label the safety comparison is weak, so such rows are
skipped as `same_safety` unless params `data.pku_keep_same_safety` is true.
`pku_saferlhf_helpful` (helpful) takes `better_response_id` and keeps every row.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from prefshift.config.params import Params
from prefshift.data.adapters.base import Adapter, value
from prefshift.data.schema import Pair, RowError, make_pair

_META = (
    "is_response_0_safe",
    "is_response_1_safe",
    "better_response_id",
    "safer_response_id",
    "response_0_severity_level",
    "response_1_severity_level",
)


@dataclass(frozen=True)
class PKUAdapter(Adapter):
    label: str = "safer_response_id"

    def to_pair(self, row: dict[str, Any], where: str, params: Params) -> Pair:
        choice = value(row, self.label, where)
        if isinstance(choice, bool) or choice not in (0, 1):
            raise RowError("bad_label", f"{where}: {self.label} must be 0 or 1, got {choice!r}")
        if self.label == "safer_response_id" and not params.data.pku_keep_same_safety:
            first, second = value(row, "is_response_0_safe", where), value(row, "is_response_1_safe", where)
            if bool(first) == bool(second):
                raise RowError(
                    "same_safety",
                    f"{where}: both responses are {'safe' if first else 'unsafe'} "
                    "(set data.pku_keep_same_safety: true to keep such rows)",
                )
        responses = (value(row, "response_0", where), value(row, "response_1", where))
        prompt = value(row, "prompt", where)
        if not isinstance(prompt, str):
            raise RowError("bad_type", f"{where}: field 'prompt' must be a string")
        return make_pair(
            dataset=self.name,
            category=self.category,
            prompt=[{"role": "user", "content": prompt}],
            chosen=responses[int(choice)],
            rejected=responses[1 - int(choice)],
            meta={key: row[key] for key in _META if key in row},
            where=where,
        )


_COLUMNS = ("prompt", "response_0", "response_1")
PKU_SAFERLHF = PKUAdapter(
    name="pku_saferlhf",
    category="harmless",
    hf_id="PKU-Alignment/PKU-SafeRLHF",
    columns=(*_COLUMNS, "safer_response_id", "is_response_0_safe", "is_response_1_safe"),
    label="safer_response_id",
    needs=(
        "hub PKU-Alignment/PKU-SafeRLHF, or data.sources.pku_saferlhf.path: a directory with train.jsonl "
        "and test.jsonl; data.pku_keep_same_safety decides rows whose responses share a safety label"
    ),
)
PKU_SAFERLHF_HELPFUL = PKUAdapter(
    name="pku_saferlhf_helpful",
    category="helpful",
    hf_id="PKU-Alignment/PKU-SafeRLHF",
    columns=(*_COLUMNS, "better_response_id"),
    label="better_response_id",
    needs=(
        "hub PKU-Alignment/PKU-SafeRLHF, or data.sources.pku_saferlhf_helpful.path: a directory with "
        "train.jsonl and test.jsonl; chosen = better_response_id"
    ),
)
