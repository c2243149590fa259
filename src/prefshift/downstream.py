"""Rewards for arbitrary rows: what a user of a registered reward model runs (`prefshift score`, pyfunc).

Rows are (prompt, response) or pair rows (prompt, chosen, rejected). A prompt is a
list of chat messages as in the pair schema, or a plain string (one user turn).
Scoring goes through `prefshift.scoring`, the module label and evaluate use, so
these rewards are exactly what evaluation computes for the same text.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from prefshift.atomic import atomic_path
from prefshift.config import Params
from prefshift.data.schema import Group
from prefshift.errors import JSON_TOO_DEEP, PrefshiftError
from prefshift.models.validate import check_source
from prefshift.scoring import load_for_scoring, score_groups


class ScoreInputError(PrefshiftError, ValueError):
    """A row that cannot be scored; the message names the file and line."""


class NormalizationError(PrefshiftError):
    """A model directory without the reward mean/std that normalisation needs."""


def reward_norm(model_dir: Path) -> tuple[float, float]:
    """(mean, std) from the model's config.json, as `prefshift teacher`/`train` write them (OpenRLHF keys)."""
    path = Path(model_dir) / "config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as err:
        raise NormalizationError(f"{path}: cannot read the model config ({err})") from None
    mean, std = config.get("mean"), config.get("std")
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (mean, std)) or not std > 0:
        raise NormalizationError(
            f"{path}: no reward 'mean'/'std' (a positive std) to normalise with; models saved by "
            "`prefshift teacher`/`prefshift train` carry them: retrain, or score without --normalize"
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
    return out


def as_messages(prompt: Any, where: str) -> list[dict[str, str]]:
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    if (
        isinstance(prompt, list)
        and prompt
        and all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in prompt
        )
    ):
        return [{"role": m["role"], "content": m["content"]} for m in prompt]
    raise ScoreInputError(f"{where}: 'prompt' must be a string or a list of {{role, content}} messages")


def _response(row: dict[str, Any], key: str, where: str) -> str:
    value = row.get(key)
    if not isinstance(value, str) or not value.strip():
        raise ScoreInputError(f"{where}: {key!r} must be a non-empty string")
    return value


def read_rows(path: Path) -> tuple[str, list[dict[str, Any]]]:
    """("pairs" | "responses", rows) from JSONL; every row must have the same shape as the first."""
    if not path.exists():
        raise ScoreInputError(f"{path}: input file not found")
    if path.is_dir():
        raise ScoreInputError(f"{path}: is a directory; --input takes a JSONL file")
    rows: list[dict[str, Any]] = []
    kind = None
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, 1):
            where = f"{path} line {number}"
            if not raw.strip():
                continue
            try:
                row = json.loads(raw.decode("utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError) as err:
                raise ScoreInputError(f"{where}: not a JSON object ({err})") from None
            except RecursionError:
                raise ScoreInputError(f"{where}: {JSON_TOO_DEEP}") from None
            if not isinstance(row, dict) or "prompt" not in row:
                raise ScoreInputError(
                    f"{where}: expected an object with 'prompt' and 'response' or 'chosen'/'rejected'"
                )
            shape = "pairs" if "chosen" in row or "rejected" in row else "responses"
            if kind is not None and shape != kind:
                raise ScoreInputError(f"{where}: mixes {shape} rows into a file of {kind} rows")
            kind = shape
            item = {"prompt": as_messages(row["prompt"], where)}
            if shape == "pairs":
                item.update(
                    chosen=_response(row, "chosen", where), rejected=_response(row, "rejected", where)
                )
            else:
                item["response"] = _response(row, "response", where)
            rows.append(item)
    if not rows:
        raise ScoreInputError(f"{path}: no rows to score")
    return kind or "responses", rows


def score_rows(model: Any, tokenizer: Any, kind: str, rows: list[dict[str, Any]], params: Params) -> dict:
    """Rewards through `scoring.score_groups` (one group per row), so batching and read-out are evaluation's.

    Returns {"rows": [...], "skipped": n}: a row whose response does not survive
    truncation (encode.max_length) is left out and counted, with its row number absent.
    """
    sides = ("response",) if kind == "responses" else ("chosen", "rejected")
    groups = [
        Group(str(i), "input", "helpful", row["prompt"], [row[side] for side in sides], [])
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
    return {"rows": scored, "skipped": len(rows) - len(scored)}


def pair_accuracy(scored: list[dict[str, Any]]) -> float:
    """Percent of pairs with chosen above rejected; a tie counts half (DESIGN §7)."""
    credit = [1.0 if s["margin"] > 0 else 0.5 if s["margin"] == 0 else 0.0 for s in scored]
    return 100.0 * sum(credit) / len(credit)


def score_file(model_dir: Path, input_path: Path, params: Params, normalized: bool = False) -> dict:
    """{"kind", "rows", "skipped", "accuracy" (percent; pairs only, else None)} for a JSONL input."""
    kind, rows = read_rows(input_path)
    stats = reward_norm(model_dir) if normalized else None
    model, tokenizer = load_for_scoring(model_dir, params)
    result = {"kind": kind, **score_rows(model, tokenizer, kind, rows, params)}
    if stats is not None:
        result["rows"] = normalize(result["rows"], *stats)
    result["accuracy"] = pair_accuracy(result["rows"]) if kind == "pairs" and result["rows"] else None
    return result


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows), encoding="utf-8")


def score_command(
    model: str, input_path: Path, out: Path | None, params: Params, layout: Any, normalized: bool = False
) -> dict:
    """`prefshift score`: a registry URI is pulled (hash-checked) to a scratch dir first."""
    import tempfile

    if not model.startswith("models:/"):
        check_source(model)  # as typed: Path() would drop the trailing slash that marks `nope/` as a path
        result = score_file(Path(model), input_path, params, normalized)
    else:
        from prefshift.registry import pull_to

        with tempfile.TemporaryDirectory(prefix="prefshift-score-") as scratch:
            model_dir = Path(scratch) / "model"
            pull_to(model, model_dir, layout)
            result = score_file(model_dir, input_path, params, normalized)
    if out is not None:
        write_jsonl(out, result["rows"])
    return result
