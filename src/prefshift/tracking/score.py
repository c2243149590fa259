"""`prefshift score`: rewards for a file of rows from a model directory or a registry URI.

It lives on the tracking side because a `models:/` URI is pulled from the MLflow registry
(hash-checked) first; the scoring itself is the engine's (`prefshift.engine.rows`).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from prefshift.config.params import Params
from prefshift.engine.rows import score_file, write_jsonl
from prefshift.models.validate import check_source
from prefshift.tracking.registry import pull_to


def score_command(
    model: str, input_path: Path, out: Path | None, params: Params, layout: Any, normalized: bool = False
) -> dict:
    """`prefshift score`: a registry URI is pulled (hash-checked) to a scratch dir first."""
    if not model.startswith("models:/"):
        check_source(model)  # as typed: Path() would drop the trailing slash that marks `nope/` as a path
        result = score_file(Path(model), input_path, params, normalized)
    else:
        with tempfile.TemporaryDirectory(prefix="prefshift-score-") as scratch:
            model_dir = Path(scratch) / "model"
            pull_to(model, model_dir, layout)
            result = score_file(model_dir, input_path, params, normalized)
    if out is not None:
        write_jsonl(out, result["rows"])
    return result
