"""Rewards for arbitrary rows: what a user of a registered reward model runs (`prefshift score`, pyfunc).

Rows are (prompt, response) or pair rows (prompt, chosen, rejected). A prompt is a
list of chat messages as in the pair schema, or a plain string (one user turn).
Scoring goes through `prefshift.engine.scoring`, the module label and evaluate use, so
these rewards are exactly what evaluation computes for the same text.
"""

from __future__ import annotations

import collections
import itertools
import json
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

from prefshift.config.params import Params
from prefshift.core.errors import JSON_TOO_DEEP, PrefshiftError, json_problem
from prefshift.core.reading import MIB, open_regular
from prefshift.data.schema import Group, check_prompt, check_response
from prefshift.engine.scoring import load_for_scoring, score_groups


class ScoreInputError(PrefshiftError, ValueError):
    """A row that cannot be scored; the message names the file and line."""


class NormalizationError(PrefshiftError):
    """A model directory without the reward mean/std that normalisation needs."""


class NonFiniteError(PrefshiftError):
    """A reward that is not a finite number: written out, it would be NaN in a JSON file."""


def reward_norm(model_dir: Path) -> tuple[float, float]:
    """(mean, std) from the model's config.json, as `prefshift teacher`/`train` write them (OpenRLHF keys).

    Both must be finite numbers and std > 0: JSON readers accept NaN and Infinity, and either
    would turn every normalised reward into NaN or -0.0 without an error.
    """
    path = Path(model_dir) / "config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise NormalizationError(f"{path}: cannot read the model config ({err})") from None
    except (ValueError, RecursionError) as err:
        raise NormalizationError(f"{path}: cannot read the model config: {json_problem(err)}") from None
    if not isinstance(config, dict):
        raise NormalizationError(f"{path}: not a model config (expected a JSON object)")
    mean, std = config.get("mean"), config.get("std")
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (mean, std))
    if not numbers or not (math.isfinite(mean) and math.isfinite(std) and std > 0):
        raise NormalizationError(
            f"{path}: no reward 'mean'/'std' to normalise with (found mean={mean!r:.40}, std={std!r:.40}; "
            "both must be finite numbers, std > 0). Models saved by `prefshift teacher`/`prefshift train` "
            "carry them: retrain, or score without --normalize"
        )
    return float(mean), float(std)


def normalize(scored: list[dict[str, Any]], mean: float, std: float) -> list[dict[str, Any]]:
    """Rewards as (r - mean) / std, the way OpenRLHF's --reward.normalize_enable applies them."""
    out = []
    for row in scored:
        row = dict(row)
        for key in ("reward", "reward_chosen", "reward_rejected"):
            if key in row:
                row[key] = (row[key] - mean) / std
        if "margin" in row:
            row["margin"] = row["reward_chosen"] - row["reward_rejected"]
        out.append(row)
    check_finite_rows(out, f"rewards normalised with mean={mean!r}, std={std!r}")
    return out


def check_finite_rows(rows: list[dict[str, Any]], what: str) -> None:
    """Refuse a non-finite number in scored rows: they are written as JSON, which has no NaN."""
    for row in rows:
        bad = [key for key, value in row.items() if isinstance(value, float) and not math.isfinite(value)]
        if bad:
            raise NonFiniteError(f"{what}: row {row.get('row')} has non-finite {', '.join(bad)}")


SIDES = {"responses": ("response",), "pairs": ("chosen", "rejected")}
"""The response fields of each row shape."""
OUTPUTS = {"responses": ("reward",), "pairs": ("reward_chosen", "reward_rejected", "margin")}
"""The reward fields scoring gives each row shape."""


def check_row(row: Any, kind: str, where: str) -> dict[str, Any]:
    """One row to score under the pair schema's own rules (`check_prompt`, `check_response`): the
    validator `prefshift score` and the served model share with `prepare`, so all three accept and
    refuse the same rows."""
    if not isinstance(row, dict):
        raise ScoreInputError(
            f"{where}: expected an object with 'prompt' and 'response' or 'chosen'/'rejected'"
        )
    item: dict[str, Any] = {"prompt": check_prompt(row.get("prompt"), where)}
    for side in SIDES[kind]:
        item[side] = check_response(row.get(side), side, where)
    return item


def row_kind(columns: Any) -> str:
    """The row shape: pairs when a row (or frame) has chosen or rejected, else responses."""
    return "pairs" if "chosen" in columns or "rejected" in columns else "responses"


MAX_LINE_BYTES = 16 * MIB
"""The bound on one input row (one line): a text longer than encode's character bound is cut
before it is tokenised anyway, and a stream with no line break is refused at this size instead of
filling memory."""
CHUNK_ROWS = 1024
"""Rows scored at a time: `score` holds one chunk of rows and rewards, whatever the file's length."""


def iter_rows(path: Path, max_line_bytes: int = MAX_LINE_BYTES) -> Iterator[tuple[str, dict[str, Any]]]:
    """("pairs" | "responses", row) per JSONL row, read one bounded line at a time; every row must
    have the same shape as the first, and a file without rows is refused at its end."""
    kind = None
    with open_regular(path, "JSONL input") as handle:
        for number, raw in enumerate(_bounded_lines(handle, path, max_line_bytes), 1):
            where = f"{path} line {number}"
            if not raw.strip():
                continue
            try:
                row = json.loads(raw.decode("utf-8"))
            except ValueError as err:  # not JSON, not UTF-8, or a number past Python's digit limit
                raise ScoreInputError(f"{where}: not a JSON object ({json_problem(err)})") from None
            except RecursionError:
                raise ScoreInputError(f"{where}: {JSON_TOO_DEEP}") from None
            if not isinstance(row, dict):
                raise ScoreInputError(
                    f"{where}: expected an object with 'prompt' and 'response' or 'chosen'/'rejected'"
                )
            shape = row_kind(row)
            if kind is not None and shape != kind:
                raise ScoreInputError(f"{where}: mixes {shape} rows into a file of {kind} rows")
            kind = shape
            yield kind, check_row(row, shape, where)
    if kind is None:
        raise ScoreInputError(f"{path}: no rows to score")


def _bounded_lines(handle: BinaryIO, path: Path, max_line_bytes: int) -> Iterator[bytes]:
    """The lines of `handle`, none longer than `max_line_bytes` (the newline aside)."""
    for number in itertools.count(1):
        raw = handle.readline(max_line_bytes + 1)
        if not raw:
            return
        if len(raw) > max_line_bytes and not (len(raw) == max_line_bytes + 1 and raw.endswith(b"\n")):
            raise ScoreInputError(
                f"{path} line {number}: longer than {max_line_bytes:,} bytes, the bound on one row (a file "
                "with no line breaks is one long row); write one JSON object per line"
            )
        yield raw


def _chunks(rows: Iterator[tuple[str, dict[str, Any]]], size: int) -> Iterator[tuple[str, list[dict]]]:
    while chunk := list(itertools.islice(rows, size)):
        yield chunk[0][0], [row for _, row in chunk]


def score_rows(
    model: Any, tokenizer: Any, kind: str, rows: list[dict[str, Any]], params: Params, first: int = 0
) -> dict:
    """Rewards through `scoring.score_groups` (one group per row), so batching and read-out are evaluation's.

    Returns {"rows": [...], "skipped": n, "truncation": counts}: a row whose response does not
    survive truncation (encode.max_length) is left out and counted, with its row number absent;
    `truncation` counts the rows whose prompt or response was cut (`TruncationCount`). Two
    sides of a row that encode to the same tokens get the same reward, so their margin is 0.
    `first`: the number of the first row (a chunk of a longer file).
    """
    groups = [
        Group(str(first + i), "input", "helpful", row["prompt"], [row[side] for side in SIDES[kind]], [])
        for i, row in enumerate(rows)
    ]
    frame = score_groups(model, tokenizer, groups, params)
    scored = []
    for group_id, values in zip(frame["group_id"], frame["rewards"], strict=True):
        if kind == "responses":
            scored.append({"row": int(group_id), "reward": float(values[0])})
        else:
            chosen, rejected = float(values[0]), float(values[1])
            scored.append(
                {
                    "row": int(group_id),
                    "reward_chosen": chosen,
                    "reward_rejected": rejected,
                    "margin": chosen - rejected,
                }
            )
    return {"rows": scored, "skipped": len(rows) - len(scored), "truncation": frame.attrs["truncation"]}


def pair_credit(scored: list[dict[str, Any]]) -> float:
    """Pairs with chosen above rejected; a tie counts half (DESIGN §7)."""
    return sum(1.0 if s["margin"] > 0 else 0.5 if s["margin"] == 0 else 0.0 for s in scored)


def score_file(
    model_dir: Path,
    input_path: Path,
    params: Params,
    emit: Callable[[dict[str, Any]], None],
    normalized: bool = False,
    chunk_rows: int = CHUNK_ROWS,
    max_line_bytes: int = MAX_LINE_BYTES,
) -> dict:
    """Score a JSONL input chunk by chunk, passing each scored row to `emit` as its chunk is done.

    Memory holds one chunk, never the file. The file is read twice: once to check every row
    before the model is loaded (a bad last row fails in seconds, not after an hour of scoring),
    then to score. Returns {"kind", "scored", "skipped", "truncation", "accuracy" (percent;
    pairs only, else None)}.
    """
    [(kind, _)] = collections.deque(iter_rows(input_path, max_line_bytes), maxlen=1)  # all checked
    stats = reward_norm(model_dir) if normalized else None
    model, tokenizer = load_for_scoring(model_dir, params)
    first = scored = credit = 0
    truncation: collections.Counter[str] = collections.Counter()
    for shape, rows in _chunks(iter_rows(input_path, max_line_bytes), chunk_rows):
        result = score_rows(model, tokenizer, shape, rows, params, first)
        done = normalize(result["rows"], *stats) if stats is not None else result["rows"]
        for row in done:
            emit(row)
        first, scored = first + len(rows), scored + len(done)
        credit += pair_credit(done) if shape == "pairs" else 0.0
        truncation.update({k: v for k, v in result["truncation"].items() if k != "share"})
    items = truncation["items"]
    cut = {**truncation, "share": truncation["truncated"] / items if items else 0.0}
    return {
        "kind": kind,
        "scored": scored,
        "skipped": first - scored,
        "truncation": cut,
        "accuracy": 100.0 * credit / scored if kind == "pairs" and scored else None,
    }


def jsonl_line(row: dict[str, Any]) -> str:
    """One output row as strict JSON (no NaN or Infinity, which JSON does not have)."""
    return json.dumps(row, sort_keys=True, allow_nan=False)
