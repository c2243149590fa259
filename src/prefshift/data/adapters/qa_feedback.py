"""qa-feedback (allenai/FineGrainedRLHF, Wu et al. 2023): human preferences among four answers.

Each record of `tasks/qa_feedback/data/{train,dev}_feedback.json` (one JSON array per file, as
published) holds an ASQA `question`, its grounding `passages`, a `gold` answer, four sampled
answers `prediction 1` … `prediction 4`, fine-grained `feedback` on the first, and `preference`:
six pairwise judgements in the order 1v2, 1v3, 1v4, 2v3, 2v4, 3v4, where 1 means the first of the
two is preferred, 2 the second, and 0 no preference (a tie, skipped and counted as `tie`).

Each judgement is one pair. The prompt is the question as one user message; the passages the
answering model saw are left out (they are long, and the preference is about the answers), and
`meta` keeps which two predictions were compared. The repository has no hub copy: a local path is
needed (`data.sources.qa_feedback.path`, the directory holding the two files; `dev_feedback.json`
serves as the test split, and a single file may be given for a target).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from prefshift.config.params import Params
from prefshift.data.adapters.base import Adapter, Record, source_rows, value
from prefshift.data.schema import Pair, RowError, make_pair

COMPARISONS = ((1, 2), (1, 3), (1, 4), (2, 3), (2, 4), (3, 4))
"""The six judgements of `preference`, in the published order."""


@dataclass(frozen=True)
class QAFeedbackAdapter(Adapter):
    def rows(self, split: str, params: Params) -> Iterator[Record]:
        """One record per judgement, so a tie skips (and counts) that judgement alone."""
        for where, row in source_rows(self, split, params):
            preference = value(row, "preference", where)
            if not isinstance(preference, list) or len(preference) != len(COMPARISONS):
                yield where, {**row, "_judgement": None}
                continue
            for (first, second), judged in zip(COMPARISONS, preference, strict=True):
                yield f"{where} {first}v{second}", {**row, "_judgement": (first, second, judged)}

    def to_pair(self, row: dict[str, Any], where: str, params: Params) -> Pair:
        judgement = row["_judgement"]
        if judgement is None:
            raise RowError("bad_label", f"{where}: field 'preference' must be a list of six judgements")
        first, second, judged = judgement
        if isinstance(judged, bool) or judged not in (0, 1, 2):
            raise RowError("bad_label", f"{where}: a judgement must be 0, 1 or 2, got {judged!r}")
        if judged == 0:
            raise RowError("tie", f"{where}: no preference between prediction {first} and {second}")
        question = value(row, "question", where)
        if not isinstance(question, str):
            raise RowError("bad_prompt", f"{where}: field 'question' must be a string")
        answers = [value(row, f"prediction {k}", where) for k in (first, second)]
        chosen, rejected = answers if judged == 1 else answers[::-1]
        return make_pair(
            dataset=self.name,
            category=self.category,
            prompt=question,
            chosen=chosen,
            rejected=rejected,
            meta={"compared": f"{first}v{second}", "preferred": first if judged == 1 else second},
            where=where,
        )


QA_FEEDBACK = QAFeedbackAdapter(
    name="qa_feedback",
    category="helpful",
    splits={"train": "train_feedback", "test": "dev_feedback"},
    columns=("question", "prediction 1", "prediction 2", "prediction 3", "prediction 4", "preference"),
    needs=(
        "data.sources.qa_feedback.path: allenai/FineGrainedRLHF's tasks/qa_feedback/data directory "
        "(train_feedback.json, dev_feedback.json, as published) or dev_feedback.json alone as a target; "
        "no hub copy"
    ),
)
