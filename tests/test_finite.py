"""Finite numbers or a refusal: rewards, normalisation statistics and metrics are checked where
they are produced and where they are read; identical texts tie exactly; `prepare`, `prefshift
score` and the served model validate rows with one validator; JSON output never holds NaN."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest
import torch
from mlflow.exceptions import MlflowException
from typer.testing import CliRunner

from prefshift.cli import app
from prefshift.config.params import Params
from prefshift.data.schema import Group, Pair, RowError, make_pair
from prefshift.engine.rows import (
    NonFiniteError,
    NormalizationError,
    iter_rows,
    normalize,
    reward_norm,
    score_rows,
)
from prefshift.engine.scoring import (
    NonFiniteRewardError,
    load_for_scoring,
    rewards_mean_std,
    score_groups,
    score_pairs,
)
from prefshift.pipeline.stages import report
from prefshift.science import metrics
from test_bounded_inputs import tiny_scorer
from test_registry import tiny_reward_model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return tiny_reward_model(tmp_path_factory.mktemp("finite") / "hf", 0)


def _with_stats(model_dir: Path, tmp_path: Path, **stats) -> Path:
    out = tmp_path / "model"
    out.mkdir(parents=True)
    for f in model_dir.iterdir():
        (out / f.name).write_bytes(f.read_bytes())
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**config, **stats}))  # json writes NaN/Infinity as given
    return out


# --- normalisation statistics ----------------------------------------------------------------


@pytest.mark.parametrize(
    "stats",
    [
        {"mean": 0.0, "std": math.inf},
        {"mean": 0.0, "std": math.nan},
        {"mean": math.nan, "std": 1.0},
        {"mean": -math.inf, "std": 1.0},
        {"mean": 0.0, "std": 0.0},
        {"mean": 0.0, "std": -1.0},
        {"mean": 0.0, "std": "1"},
        {"mean": True, "std": 1.0},
        {"std": 1.0},
    ],
)
def test_normalisation_stats_must_be_finite_with_a_positive_std(stats, model_dir, tmp_path):
    with pytest.raises(NormalizationError, match="both must be finite numbers, std > 0"):
        reward_norm(_with_stats(model_dir, tmp_path, **stats))


def test_score_normalize_with_infinite_std_exits_2_and_writes_nothing(model_dir, tmp_path):
    """It used to give every reward -0.0 (std Infinity) or write bare NaN (mean NaN), with exit 0."""
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"prompt": "hi", "response": "two divisors"}) + "\n")
    out = tmp_path / "rewards.jsonl"
    for stats in ({"mean": 0.0, "std": math.inf}, {"mean": math.nan, "std": 1.0}):
        model = _with_stats(model_dir, tmp_path / str(len(list(tmp_path.iterdir()))), **stats)
        args = ["score", "--model", str(model), "--input", str(rows), "--out", str(out), "--normalize"]
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 2, result.output
        assert "no reward 'mean'/'std' to normalise with" in result.output
        assert not out.exists()


def test_normalised_rewards_that_overflow_are_refused():
    scored = [{"row": 0, "reward_chosen": 1e308, "reward_rejected": -1e308, "margin": 0.0}]
    with pytest.raises(NonFiniteError, match="row 0 has non-finite"):
        normalize(scored, -1e308, 1e-10)


def test_reward_stats_are_finite_where_produced():
    frame = pd.DataFrame({"reward_chosen": [1e308, 1e308], "reward_rejected": [-1e308, 1e308]})
    with pytest.raises(NonFiniteRewardError, match="not finite"):
        rewards_mean_std(frame)


# --- rewards ---------------------------------------------------------------------------------


def test_a_model_that_gives_nan_is_refused_where_rewards_are_produced(model_dir):
    params = Params()
    model, tokenizer = load_for_scoring(model_dir, params)
    with torch.no_grad():
        for weight in model.parameters():
            weight.fill_(math.nan)
    rows = [{"prompt": [{"role": "user", "content": "hi"}], "response": "two divisors"}]
    with pytest.raises(NonFiniteRewardError, match="non-finite reward"):
        score_rows(model, tokenizer, "responses", rows, params)
    pair = make_pair(dataset="t", category="helpful", prompt="hi", chosen="two", rejected="a fox")
    with pytest.raises(NonFiniteRewardError):
        score_pairs(model, tokenizer, [pair], params)


class RowDependent(torch.nn.Module):
    """A reward model whose batch numerics depend on the row, as padded batched kernels can: the
    same text gets slightly different rewards at different rows of one batch (6e-8 was seen)."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def pair_path(self) -> str:
        return self.inner.pair_path()

    def forward(self, input_ids, attention_mask, groups=None):
        out = self.inner(input_ids, attention_mask, groups=groups)
        out.rewards = out.rewards + 1e-6 * torch.arange(len(input_ids), dtype=out.rewards.dtype)
        return out


def test_identical_texts_tie_exactly_whatever_the_batch_numerics(model_dir):
    params = Params()
    model, tokenizer = load_for_scoring(model_dir, params)
    noisy = RowDependent(model)
    same = "keep the soil moist"
    tie = Pair(
        "tie", "t", "helpful", [{"role": "user", "content": "fern?"}], same, same
    )  # prepare drops these
    other = make_pair(dataset="t", category="helpful", prompt="prime?", chosen="two divisors", rejected="fox")
    frame = score_pairs(noisy, tokenizer, [other, tie], params)
    row = frame.set_index("pair_id").loc[tie.pair_id]
    assert row["delta"] == 0.0 and row["reward_chosen"] == row["reward_rejected"]
    assert metrics.credit(frame["delta"]).tolist()[1] == 0.5  # a tie counts half, never a win
    assert frame.set_index("pair_id").loc[other.pair_id, "delta"] != 0.0

    rows = [{"prompt": [{"role": "user", "content": "fern?"}], "chosen": same, "rejected": same}]
    [scored] = score_rows(noisy, tokenizer, "pairs", rows, params)["rows"]
    assert scored["margin"] == 0.0 and scored["reward_chosen"] == scored["reward_rejected"]

    group = Group("g", "t", "helpful", [{"role": "user", "content": "fern?"}], [same, "fox", same], [0, 0, 0])
    [rewards] = score_groups(noisy, tokenizer, [group], params)["rewards"]
    assert rewards[0] == rewards[2] != rewards[1]


# --- one row validator -----------------------------------------------------------------------

GOOD_PROMPTS = [
    "what is prime?",
    [{"role": "system", "content": "be brief"}, {"role": "user", "content": "what is prime?"}],
    json.dumps([{"role": "user", "content": "what is prime?"}]),
]
BAD_ROWS = {
    "empty prompt": ({"prompt": "", "chosen": "a", "rejected": "b"}, "empty_prompt"),
    "blank prompt": ({"prompt": "   ", "chosen": "a", "rejected": "b"}, "empty_prompt"),
    "no prompt": ({"chosen": "a", "rejected": "b"}, "bad_prompt"),
    "empty message list": ({"prompt": [], "chosen": "a", "rejected": "b"}, "bad_prompt"),
    "unknown role": (
        {"prompt": [{"role": "robot", "content": "hi"}], "chosen": "a", "rejected": "b"},
        "bad_prompt",
    ),
    "extra message key": (
        {"prompt": [{"role": "user", "content": "hi", "x": 1}], "chosen": "a", "rejected": "b"},
        "bad_prompt",
    ),
    "non-string content": (
        {"prompt": [{"role": "user", "content": 3}], "chosen": "a", "rejected": "b"},
        "bad_prompt",
    ),
    "only a system turn": (
        {"prompt": [{"role": "system", "content": "hi"}], "chosen": "a", "rejected": "b"},
        "empty_prompt",
    ),
    "numeric prompt": ({"prompt": 7, "chosen": "a", "rejected": "b"}, "bad_prompt"),
    "empty response": ({"prompt": "hi", "chosen": "", "rejected": "b"}, "empty_response"),
    "blank response": ({"prompt": "hi", "chosen": "a", "rejected": " \n"}, "empty_response"),
    "null response": ({"prompt": "hi", "chosen": None, "rejected": "b"}, "bad_type"),
    "numeric response": ({"prompt": "hi", "chosen": 1.5, "rejected": "b"}, "bad_type"),
    "list response": ({"prompt": "hi", "chosen": ["a"], "rejected": "b"}, "bad_type"),
}


def _prepare(row: dict) -> None:
    make_pair(dataset="t", category="helpful", prompt=row.get("prompt"), chosen=row.get("chosen"),
              rejected=row.get("rejected"), where="line 1")  # fmt: skip


def _score_file(row: dict, tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(row) + "\n")
    list(iter_rows(path))


@pytest.fixture(scope="module")
def scorer(tmp_path_factory):
    return tiny_scorer(tmp_path_factory.mktemp("served"))


@pytest.mark.parametrize("case", BAD_ROWS)
def test_prepare_score_and_the_served_model_refuse_the_same_rows(case, tmp_path, scorer):
    row, reason = BAD_ROWS[case]
    with pytest.raises(RowError) as prepared:
        _prepare(row)
    with pytest.raises(RowError) as scored:
        _score_file(row, tmp_path)
    assert prepared.value.reason == scored.value.reason == reason
    with pytest.raises(MlflowException) as served:
        scorer.predict(None, pd.DataFrame([row]))
    assert served.value.get_http_status_code() == 400
    assert str(scored.value).split(": ", 1)[1] == served.value.message.split(": ", 1)[1]
    assert "Traceback" not in served.value.message


@pytest.mark.parametrize("prompt", GOOD_PROMPTS)
def test_prepare_score_and_the_served_model_accept_the_same_prompts(prompt, tmp_path, scorer):
    row = {"prompt": prompt, "chosen": "two divisors", "rejected": "a fox"}
    pair = make_pair(dataset="t", category="helpful", prompt=prompt, chosen="two divisors", rejected="a fox")
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(row) + "\n")
    assert next(iter_rows(path))[1]["prompt"] == pair.prompt
    served = scorer.predict(None, pd.DataFrame([row]))
    assert served.notna().all().all() and len(served) == 1


def test_the_served_model_never_answers_nan(scorer):
    """A missing cell (NaN in the frame) was scored as NaN or crashed; it is now a 400 naming the row."""
    frame = pd.DataFrame([{"prompt": "hi", "response": "two divisors"}, {"prompt": "hi"}])
    with pytest.raises(MlflowException, match="row 1: field 'response' must be a string, got float"):
        scorer.predict(None, frame)
    rewards = scorer.predict(None, frame.iloc[:1])
    assert rewards["reward"].map(math.isfinite).all()


# --- metrics ---------------------------------------------------------------------------------


def test_metrics_are_checked_finite_where_written_and_where_read(tmp_path):
    doc = {"method": "naive", "split_version": "v", "id": {"acc": 60.0, "ci": [50.0, math.nan]},
           "teacher": {"id": {"acc": 55.0}}, "targets": {}}  # fmt: skip
    with pytest.raises(metrics.MetricsError, match=r"id\.ci\.1 is nan"):
        metrics.check_finite(doc, "naive.json")
    path = tmp_path / "naive.json"
    path.write_text(json.dumps(doc))  # a hand-edited or foreign file: Python's json writes NaN
    with pytest.raises(metrics.MetricsError, match=r"naive.json: id\.ci\.1 is nan"):
        report._read_json(path)
    doc["id"]["ci"][1] = 70.0
    path.write_text(json.dumps({**doc, "mean_aog": math.inf}))
    with pytest.raises(metrics.MetricsError, match="mean_aog is inf"):
        report._read_json(path)


def test_a_row_truncated_away_is_refused_by_the_served_model_not_answered_with_nan(scorer):
    """It used to come back as NaN (bare `NaN` in the server's JSON)."""
    strict = Params.model_validate({"encode": {"max_length": 16, "min_response_tokens": 12}})
    scorer.params, before = strict, scorer.params
    try:
        frame = pd.DataFrame([{"prompt": "what is prime?", "response": "two"}])
        with pytest.raises(MlflowException, match=r"row\(s\) \[0\]: a response keeps fewer than") as err:
            scorer.predict(None, frame)
        assert err.value.get_http_status_code() == 400
    finally:
        scorer.params = before
