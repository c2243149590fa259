"""Inputs are bounded: text is cut to a character bound before it is rendered and tokenised, the
kept tokens are those of the full text, and the served model refuses an oversized request with 400."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import tracemalloc
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from mlflow_support import free_port, stop_group, wait_for_http
from prefshift.cli import app
from prefshift.config.params import EncodeConfig, Params
from prefshift.data import encode
from prefshift.data.encode import CHARS_PER_TOKEN, Encoder, bound_prompt, bound_response
from prefshift.engine.rows import MAX_LINE_BYTES, score_file
from prefshift.engine.scoring import load_for_scoring
from test_output_rule import _refused
from test_registry import PAIRS
from tiny_models import tokenizer

pytest_plugins = ["output_support"]  # model_dir

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


# --- params: no YAML aliases, seeds capped, a regular file of bounded size (issue 43, item 3) ------

PREFSHIFT = str(Path(sys.executable).parent / "prefshift")


def _bomb(levels: int = 9) -> str:
    """A billion laughs in flow YAML: `levels` nested aliases, each nine times the one before."""
    lines = ['{a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, levels)]
    return ", ".join(lines) + "}"


def _cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """`prefshift ARGS` as a user runs it; a hang fails the test at `timeout` instead of stalling it."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.run([PREFSHIFT, *args], capture_output=True, text=True, timeout=timeout, env=env)


def _one_line(done: subprocess.CompletedProcess, *expected: str) -> str:
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    for text in expected:
        assert text in lines[0], lines[0]
    return lines[0]


def test_a_yaml_alias_bomb_in_params_or_one_override_is_refused_at_once(tmp_path):
    params = tmp_path / "params.yaml"
    params.write_text(f"seed: 0\ndata: {{sources: {_bomb()}}}\n")
    bound = "expand to more than 100,000 values"
    _one_line(_cli("split", "-p", str(params), "--root", str(tmp_path)), str(params), bound)
    plain = tmp_path / "plain.yaml"
    plain.write_text("seed: 0\n")
    for override, problem in ((f"data.sources={_bomb()}", bound), ("methods=&m [naive, *m]", "without end")):
        done = _cli("split", "-p", str(plain), "-S", override, "--root", str(tmp_path))
        assert _one_line(done, problem).startswith("error: override")


def test_many_values_written_out_are_read_as_dvc_reads_them():
    """The bound on values counted those written out too: a list of 150,000 items, which DVC reads,
    was refused as if its aliases expanded."""
    from prefshift.config.params import read_yaml

    text = f"v: [{', '.join(['0'] * 150_000)}]\n"
    assert read_yaml(text, "params.yaml") == {"v": [0] * 150_000}


def test_a_few_aliases_as_yaml_dump_writes_them_are_read():
    """PyYAML's dump writes `&id001`/`*id001` for a value used twice: such a file stays readable."""
    from prefshift.config.params import read_yaml

    shared = {"lr": 0.001}
    text = yaml.safe_dump({"teacher": shared, "student": shared})
    assert "*id001" in text and read_yaml(text, "params.yaml") == {"teacher": shared, "student": shared}


def test_seeds_past_the_cap_are_refused_by_count_and_the_cap_is_named(tmp_path):
    from prefshift.config.params import ConfigError, load_params

    params = tmp_path / "params.yaml"
    params.write_text(f"seeds: [{', '.join(map(str, range(10_000)))}]\n")
    with pytest.raises(ConfigError, match=r"10000 seeds listed, more than max_seeds \(32\)") as raised:
        load_params(params)
    assert "-S max_seeds=10000" in str(raised.value)
    assert len(load_params(params, ["max_seeds=10000"]).seeds) == 10_000  # the cap is raised on request
    assert load_params(params, ["seeds=[0, 1, 2]"]).seeds == [0, 1, 2]


def _special(kind: str, path: Path) -> Path:
    if kind == "device":
        return Path("/dev/zero")
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.mkdir()
    return path


@pytest.mark.parametrize("kind", ["device", "fifo"])
def test_bench_pipeline_params_must_be_a_regular_file(tmp_path, kind):
    source = _special(kind, tmp_path / "params.yaml")
    done = _cli("bench", "--out", str(tmp_path / "out"), "--pipeline-only", "--pipeline-params", str(source))
    _one_line(done, str(source), "not a regular file")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("kind", ["device", "fifo", "directory"])
def test_score_input_and_params_must_be_regular_files(tmp_path, model_dir, kind):
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"prompt": "hi", "response": "hello"}\n')
    params = tmp_path / "params.yaml"
    params.write_text("{}\n")
    source = _special(kind, tmp_path / "thing")
    word = "is a directory" if kind == "directory" else "not a regular file"
    for args in (["-i", str(rows), "-p", str(source)], ["-i", str(source), "-p", str(params)]):
        result = CliRunner().invoke(app, ["score", "--model", str(model_dir), *args])
        _refused(result, str(source), word)


# --- score: bounded lines, bounded chunks ---------------------------------------------------------


def _rows_file(path: Path, count: int, response_chars: int = 40) -> Path:
    with path.open("w", encoding="utf-8") as handle:
        for i in range(count):
            response = _prose(response_chars // 6 + 1, i)[:response_chars]
            handle.write(json.dumps({"prompt": f"question {i}", "response": response}) + "\n")
    return path


@pytest.mark.parametrize("case", ["no newline past the bound", "a number of 5,000 digits"])
def test_score_refuses_an_unbounded_row_in_one_line(tmp_path, model_dir, case):
    rows = _rows_file(tmp_path / "rows.jsonl", 2)
    with rows.open("ab") as handle:
        if case == "a number of 5,000 digits":
            handle.write(b'{"prompt": "hi", "response": "hello", "n": ' + b"9" * 5000 + b"}\n")
        else:  # a stream with no line break: read as one line, it would grow until MemoryError
            handle.write(b"x" * (MAX_LINE_BYTES + 10))
    params = tmp_path / "params.yaml"
    params.write_text("{}\n")
    result = CliRunner().invoke(app, ["score", "--model", str(model_dir), "-i", str(rows), "-p", str(params)])
    line = _refused(result, f"{rows} line 3")
    assert f"{MAX_LINE_BYTES:,} bytes" in line if case.startswith("no newline") else "digits" in line


def test_score_in_chunks_gives_what_one_pass_gives_and_holds_one_chunk(tmp_path, model_dir, monkeypatch):
    from prefshift.engine import rows as rows_module

    path = tmp_path / "pairs.jsonl"
    path.write_text(
        "".join(json.dumps(PAIRS[i % len(PAIRS)]) + "\n" + ("\n" if i == 7 else "") for i in range(23))
    )
    whole: list[dict] = []
    one_pass = rows_module.score_file(model_dir, path, Params(), whole.append, chunk_rows=1000)
    sizes: list[int] = []
    score_rows = rows_module.score_rows

    def recording(model, tok, kind, rows, params, first=0):
        sizes.append(len(rows))
        return score_rows(model, tok, kind, rows, params, first)

    monkeypatch.setattr(rows_module, "score_rows", recording)
    chunked: list[dict] = []
    chunks = rows_module.score_file(model_dir, path, Params(), chunked.append, chunk_rows=5)
    # Batches padded to other lengths round the last float bits differently: equal to 1e-5.
    assert chunks == one_pass and len(chunked) == len(whole)
    assert all(mine == pytest.approx(theirs, rel=1e-5) for mine, theirs in zip(chunked, whole, strict=True))
    assert [r["row"] for r in chunked] == list(range(23))
    assert sizes == [5, 5, 5, 5, 3] and one_pass["scored"] == 23 and one_pass["accuracy"] is not None


def test_score_memory_does_not_grow_with_the_row_count(tmp_path, model_dir):
    """Python's own allocations while scoring 40 and 340 rows of 12 KB: the row dicts and rewards
    of the extra 300 rows (3.6 MB of text, held at once when a file was read whole) never pile up."""
    peaks = {}
    for count in (40, 340):
        path = _rows_file(tmp_path / f"rows-{count}.jsonl", count, response_chars=12_000)
        tracemalloc.start()
        try:
            score_file(model_dir, path, Params(), lambda row: None, chunk_rows=20)
            peaks[count] = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert peaks[340] - peaks[40] < 1_000_000, peaks


def _cwd_under(top: Path) -> list[int]:
    """Processes whose working directory lies under `top` (a removed one reads `... (deleted)`)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and os.readlink(entry / "cwd").startswith(str(top)):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def test_bench_pipeline_removes_its_clone_and_stops_its_repro_on_sigterm(tmp_path):
    """SIGTERM once `dvc repro` runs in the clone: the clone goes, and no process is left in it."""
    scratch_dir = tmp_path / "tmp"
    scratch_dir.mkdir()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TMPDIR": str(scratch_dir)}
    bench = subprocess.Popen(
        [PREFSHIFT, "bench", "--pipeline-only", "--out", str(tmp_path / "out")],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "stderr").open("w"),  # a file: a pipe nobody reads could fill and block it
    )
    try:
        deadline = time.monotonic() + 180
        while not [p for p in _cwd_under(scratch_dir) if p != bench.pid] and time.monotonic() < deadline:
            assert bench.poll() is None, "bench ended before its dvc repro started"
            time.sleep(0.2)
        assert list(scratch_dir.glob("prefshift-bench-pipeline-*")), "no clone was made"
        bench.send_signal(signal.SIGTERM)
        bench.wait(timeout=60)
    finally:
        bench.kill()
        bench.wait()
    stderr = (tmp_path / "stderr").read_text()
    assert bench.returncode == 128 + signal.SIGTERM, stderr
    assert "Traceback" not in stderr and "stopped by SIGTERM" in stderr, stderr
    assert list(scratch_dir.iterdir()) == []
    deadline = time.monotonic() + 10
    while _cwd_under(scratch_dir) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _cwd_under(scratch_dir) == []
