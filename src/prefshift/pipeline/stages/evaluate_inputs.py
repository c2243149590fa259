"""What `prefshift evaluate` reads, each input checked before a number is computed from it.

A score file must hold the contract's columns, unique pair ids and finite margins, and come from
the current version of the split it scored; a model's held-out scores must be one scoring run's
output set; its train log must name the split versions it was trained on. Every refusal names the
stage that writes the input again. evaluate_teacher, label and the report read through the same
functions, so a stale or broken input is refused the same way everywhere.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from prefshift.core.errors import PrefshiftError
from prefshift.core.paths import SOURCE_SPLITS, Layout
from prefshift.data.splits import check_split_version
from prefshift.pipeline.frames import VERSION_KEY
from prefshift.pipeline.output_set import manifest_of, verify

SCORE_COLUMNS = ("pair_id", "delta", "gold", "len_chosen", "len_rejected")


class EvaluateError(PrefshiftError):
    """A missing or inconsistent input of the evaluation; the message says which stage to run."""


def check_scores(frame: pd.DataFrame, where: str) -> pd.DataFrame:
    """Validate one score frame: the contract's columns, unique pair ids, finite margins."""
    missing = [c for c in SCORE_COLUMNS if c not in frame.columns]
    if missing:
        raise EvaluateError(f"{where}: score file lacks column(s) {missing}")
    if frame["pair_id"].duplicated().any():
        dup = frame.loc[frame["pair_id"].duplicated(), "pair_id"].iloc[0]
        raise EvaluateError(f"{where}: pair_id {dup!r} appears more than once")
    bad = ~np.isfinite(frame["delta"].to_numpy(dtype=float))
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise EvaluateError(
            f"{where}: row {row} (pair_id {frame['pair_id'].iloc[row]!r}) has a non-finite delta"
        )
    return frame


def read_scores(
    path: Path, layout: Layout, split: str, split_ids: set[str], missing_hint: str
) -> pd.DataFrame:
    """Read a score file of `split`, refusing one made from another version of that split.

    A file stamped with a version must match the split's manifest entry; any file must
    only name pairs of the current split (an unstamped file is checked that way only).
    """
    if not path.exists():
        raise EvaluateError(f"{path}: scores not found; run `{missing_hint}`")
    table = pq.read_table(path)
    stamped = (table.schema.metadata or {}).get(VERSION_KEY)
    if stamped is not None:
        check_split_version(layout, split, stamped.decode(), str(path))
    frame = check_scores(table.to_pandas(), str(path))
    stale = set(frame["pair_id"]) - split_ids
    if stale:
        raise EvaluateError(
            f"{path}: {len(stale)} scored pair(s) are not in the current split (e.g. {sorted(stale)[0]!r}); "
            f"the scores are from another split version — run `{missing_hint}` again"
        )
    return frame


def score_hint(model: str, split: str) -> str:
    """The command that writes `model`'s scores of `split`."""
    if split in SOURCE_SPLITS:
        return "prefshift teacher" if model == "teacher" else f"prefshift train --method {model}"
    return f"prefshift score-target --model {model} --target {split}"


def read_heldout(
    layout: Layout, model: str, ids: Mapping[str, set[str]], targets: Sequence[str]
) -> dict[str, pd.DataFrame]:
    """`model`'s score frame of every split in `ids`, each directory checked as one run's output set."""
    directories = {"id_test": layout.scores_dir(model)} | {
        t: layout.target_scores_dir(model, t) for t in targets
    }
    for split, directory in directories.items():
        if directory.exists():  # one scoring run's set, not a mix
            verify(layout.root, manifest_of(directory), [directory], score_hint(model, split))
    return {
        split: read_scores(layout.scores(model, split), layout, split, ids[split], score_hint(model, split))
        for split in ids
    }


def check_trained_on(layout: Layout, model: str, log: Mapping[str, Any] | None) -> None:
    """Refuse a model trained on splits that have changed since: the versions its train log records."""
    for split, version in ((log or {}).get("split_versions") or {}).items():
        check_split_version(layout, split, version, f"{model}'s training ({layout.train_log(model)})")


def read_train_log(path: Path) -> dict[str, Any] | None:
    """A training log (DESIGN: steps, drift, wall_s, peak_rss_mb), or None when the model has none."""
    if not path.exists():
        return None
    try:
        log = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise EvaluateError(f"{path}: not valid JSON ({err}); re-run the training stage") from None
    if not isinstance(log, dict):
        raise EvaluateError(f"{path}: expected a JSON object with 'steps' and 'drift'")
    return log


def training_summary(log: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """Last logged loss and drift of a training run, for the report's drift columns and sweeps."""
    if log is None:
        return None
    steps, drift = log.get("steps") or [], log.get("drift") or []
    final_drift = {k: v for k, v in drift[-1].items() if k != "step"} if drift else {}
    return {
        "final_step": steps[-1]["step"] if steps else None,
        "final_loss": steps[-1]["loss"] if steps else None,
        "final_drift": final_drift,
        "final_drift_mean": float(np.mean(list(final_drift.values()))) if final_drift else None,
        "reward_position_cosine": (log.get("reward_position") or {}).get("cosine"),
        "wall_s": log.get("wall_s"),
        "peak_rss_mb": log.get("peak_rss_mb"),
    }
