"""Inputs are bounded: text is cut to a character bound before it is rendered and tokenised, the
kept tokens are those of the full text, and the served model refuses an oversized request with 400."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from mlflow_support import free_port, stop_group, wait_for_http
from prefshift.config.params import EncodeConfig, Params
from prefshift.data import encode
from prefshift.data.encode import CHARS_PER_TOKEN, Encoder, bound_prompt, bound_response
from prefshift.engine.scoring import load_for_scoring
from tiny_models import tokenizer

MAX_LENGTH = 32
WORDS = [
    "first",
    "fix",
    "the",
    "door",
    "gently",
    "then",
    "check",
    "the",
    "window",
    "again",
    "and",
    "open",
    "the",
    "lamp",
]


def _prose(words: int, offset: int = 0) -> str:
    return " ".join(WORDS[(i + offset) % len(WORDS)] for i in range(words))


class RecordingTokenizer:
    """The tiny tokenizer, recording the longest text each call renders or tokenises."""

    def __init__(self, inner):
        self._inner = inner
        self.longest = 0

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def apply_chat_template(self, conversations, **kwargs):
        texts = self._inner.apply_chat_template(conversations, **kwargs)
        self.longest = max(self.longest, *(len(t) for t in texts))
        return texts

    def __call__(self, texts, **kwargs):
        self.longest = max(self.longest, *(len(t) for t in texts))
        return self._inner(texts, **kwargs)


def _unbounded(monkeypatch) -> Encoder:
    """An encoder whose character bound never cuts: the reference the bounded encoding must equal."""
    monkeypatch.setattr(encode, "CHARS_PER_TOKEN", 10**9)
    return Encoder(tokenizer(), EncodeConfig(max_length=MAX_LENGTH))


CASES = {
    "long response": ([{"role": "user", "content": "how do I fix the door?"}], _prose(20_000)),
    "long prompt": ([{"role": "user", "content": _prose(20_000)}], "first fix it gently"),
    "both long": ([{"role": "user", "content": _prose(9_000, 3)}], _prose(9_000, 5)),
    "long dialogue": (
        [
            {"role": "system", "content": _prose(3_000)},
            *(
                {"role": "user" if i % 2 == 0 else "assistant", "content": _prose(40 + i, i)}
                for i in range(401)
            ),
        ],
        "open the window",
    ),
    "long unbroken word": ([{"role": "user", "content": "fix it"}], "gently" * 5_000),
    "whitespace runs": ([{"role": "user", "content": "fix it"}], "door" + " " * 50_000 + "lamp"),
}


@pytest.mark.parametrize("case", CASES)
def test_a_cut_text_keeps_exactly_the_tokens_of_the_full_text(case, monkeypatch):
    prompt, response = CASES[case]
    bounded = Encoder(tokenizer(), EncodeConfig(max_length=MAX_LENGTH)).encode_one(prompt, response)
    with monkeypatch.context() as patch:
        full = _unbounded(patch).encode_one(prompt, response)
    assert bounded.input_ids == full.input_ids
    assert bounded.response_mask == full.response_mask
    assert len(bounded.input_ids) <= MAX_LENGTH


def test_a_text_within_the_bound_is_not_touched():
    prompt = [{"role": "system", "content": " be brief "}, {"role": "user", "content": _prose(50)}]
    response = _prose(60) + "  "
    limit = MAX_LENGTH * CHARS_PER_TOKEN
    assert bound_prompt(prompt, limit) == (prompt, 0)
    assert bound_response(response, limit) == (response, 0)


def test_a_slice_with_too_few_tokens_is_cut_again_wider(monkeypatch):
    """With one character per token of max_length the first slice is far too short; the retry widens
    it until the kept window lies inside, so the ids still equal the full text's."""
    prompt, response = CASES["both long"]
    with monkeypatch.context() as patch:
        full = _unbounded(patch).encode_one(prompt, response)
    monkeypatch.setattr(encode, "CHARS_PER_TOKEN", 1)
    seq = Encoder(tokenizer(), EncodeConfig(max_length=MAX_LENGTH)).encode_one(prompt, response)
    assert seq.input_ids == full.input_ids and seq.response_mask == full.response_mask


def test_work_does_not_grow_with_the_input():
    """A 5 MB response is never rendered or tokenised whole: the longest text handed to the
    tokenizer stays within a few character bounds, whatever the input's size."""
    recording = RecordingTokenizer(tokenizer())
    encoder = Encoder(recording, EncodeConfig(max_length=MAX_LENGTH))
    for size in (100_000, 5_000_000):
        recording.longest = 0
        encoder.encode_one([{"role": "user", "content": _prose(size // 6)}], _prose(size // 6, 1))
        assert recording.longest <= 4 * MAX_LENGTH * CHARS_PER_TOKEN


def test_a_dialogue_of_very_many_messages_is_bounded_and_keeps_its_role_order():
    turns = [{"role": "system", "content": "be brief"}] + [
        {"role": "user" if i % 2 == 0 else "assistant", "content": "door"} for i in range(100_001)
    ]
    kept, cut = bound_prompt(turns, 64)
    assert len(kept) <= 66 and cut > 0
    assert kept[0]["role"] == "system" and kept[-1] == turns[-1]
    roles = [m["role"] for m in kept[1:]]
    assert roles == ["user" if i % 2 == 0 else "assistant" for i in range(len(roles))]


# --- the served model ------------------------------------------------------------------------


def tiny_scorer(tmp_path: Path):
    """A RewardScorer loaded the way `load_context` does, on the registry tests' tiny model."""
    from prefshift.tracking.registry import RewardScorer
    from test_registry import tiny_reward_model

    scorer = RewardScorer()
    scorer.params = Params()
    scorer.model, scorer.tokenizer = load_for_scoring(tiny_reward_model(tmp_path / "hf", 0), scorer.params)
    return scorer


def test_the_served_model_refuses_an_oversized_request_with_a_400(tmp_path):
    import pandas as pd
    from mlflow.exceptions import MlflowException

    from prefshift.tracking.registry import MAX_REQUEST_CHARS

    scorer = tiny_scorer(tmp_path)
    big = pd.DataFrame({"prompt": ["what is prime?"], "response": ["two " * (MAX_REQUEST_CHARS // 4 + 1)]})
    with pytest.raises(MlflowException) as err:
        scorer.predict(None, big)
    assert err.value.get_http_status_code() == 400
    assert f"more than the served model takes at once ({MAX_REQUEST_CHARS})" in err.value.message
    small = pd.DataFrame({"prompt": ["what is prime?"], "response": ["two " * 50_000]})
    assert scorer.predict(None, small)["reward"].notna().all()


def _registered_pyfunc(tmp_path: Path) -> tuple[str, dict[str, str]]:
    """The tiny model registered as `prefshift promote` registers one (a pyfunc logged as code, whose
    files `load_context` checks against its version's record): its models:/ URI and the env that
    reaches the registry (the session's tracking database, tests/conftest.py)."""
    from prefshift.core.paths import Layout
    from prefshift.tracking import registry
    from prefshift.tracking import runs as tracking
    from test_registry import tiny_reward_model

    params, layout = Params(), Layout(tmp_path, seed=0)
    with tracking.stage_run(params, layout, "promote") as run:
        registry.ensure_registered_model(run.client, "bounded", params.tracking.experiment)
        version, _ = registry.register(
            run, "bounded", tiny_reward_model(tmp_path / "hf", 0), {}, {"max_length": 64}
        )
    return f"models:/bounded/{version.version}", {"MLFLOW_TRACKING_URI": run.uri}


def _post(url: str, payload: bytes) -> tuple[int, dict]:
    request = urllib.request.Request(url, payload, {"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


@pytest.mark.slow
def test_mlflow_models_serve_refuses_a_50_mb_row_with_400_and_keeps_serving(tmp_path):
    model, registry_env = _registered_pyfunc(tmp_path)
    port, log = free_port(), tmp_path / "serve.log"
    cmd = [sys.executable, "-m", "mlflow", "models", "serve", "-m", model, "--env-manager", "local",
           "-h", "127.0.0.1", "-p", str(port)]  # fmt: skip
    with log.open("wb") as sink:
        server = subprocess.Popen(
            cmd,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, **registry_env},
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for_http(server, f"{url}/ping", 300.0, f"mlflow models serve did not come up; see {log}")
        huge = {"dataframe_records": [{"prompt": "what is prime?", "response": "two " * 12_500_000}]}
        status, body = _post(f"{url}/invocations", json.dumps(huge).encode())
        assert status == 400, body
        assert "more than the served model takes at once" in body["message"]
        rows = [
            {"prompt": "what is prime?", "response": "two divisors"},
            {"prompt": "what is prime?", "response": ""},
        ]
        status, body = _post(f"{url}/invocations", json.dumps({"dataframe_records": rows}).encode())
        assert status == 400 and "row 1: field 'response' is empty" in body["message"], body
        status, body = _post(f"{url}/invocations", json.dumps({"dataframe_records": rows[:1]}).encode())
        assert status == 200 and len(body["predictions"]) == 1, body
    finally:
        stop_group(server)
