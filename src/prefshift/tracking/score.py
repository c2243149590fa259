"""`prefshift score`: rewards for a file of rows from a model directory or a registry URI.

It lives on the tracking side because a `models:/` URI is pulled from the MLflow registry
(hash-checked) first; the scoring itself is the engine's (`prefshift.engine.rows`). Rewards are
written as each chunk of rows is scored (to the output's scratch file, or to standard output),
so memory holds one chunk, never the whole file.
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from prefshift.config.params import Params
from prefshift.core.atomic import atomic_path
from prefshift.engine.rows import jsonl_line, score_file
from prefshift.models.validate import check_source
from prefshift.tracking.registry import pull_to


def score_command(
    model: str,
    input_path: Path,
    out: Path | None,
    params: Params,
    layout: Any,
    normalized: bool = False,
    force: bool = False,
) -> dict:
    """`prefshift score`: a registry URI is pulled (hash-checked) to a scratch dir first; rewards go
    to `out` (replaced whole, once every row is scored) or, with None, to standard output."""
    with _rewards_to(out, force) as stream:

        def emit(row: dict[str, Any]) -> None:
            stream.write(jsonl_line(row) + "\n")

        if not model.startswith("models:/"):
            check_source(model)  # as typed: Path() would drop the trailing slash that marks `nope/` as a path
            return score_file(Path(model), input_path, params, emit, normalized)
        with tempfile.TemporaryDirectory(prefix="prefshift-score-") as scratch:
            model_dir = Path(scratch) / "model"
            pull_to(model, model_dir, layout)
            return score_file(model_dir, input_path, params, emit, normalized)


@contextmanager
def _rewards_to(out: Path | None, force: bool) -> Iterator[IO[str]]:
    if out is None:
        yield sys.stdout
        return
    with atomic_path(out, force=force) as tmp, tmp.open("w", encoding="utf-8") as stream:
        yield stream
