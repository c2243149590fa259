"""Promotion gate, registry identity, pull and score, against real MLflow stores and tiny local models."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml
from mlflow import MlflowClient
from typer.testing import CliRunner

from mlflow_support import free_port, running_server, seed_database, stop_group
from prefshift.cli import app
from prefshift.config.params import EncodeConfig, Params
from prefshift.core.paths import Layout
from prefshift.data.encode import Encoder
from prefshift.engine.rows import score_rows
from prefshift.engine.scoring import load_for_scoring
from prefshift.models.reward import save_reward_model
from prefshift.pipeline.output_set import OutputSetError, output_set
from prefshift.pipeline.stages import promote
from prefshift.tracking import registry
from prefshift.tracking import runs as tracking

os.environ.setdefault("HF_HUB_OFFLINE", "1")

TEXTS = [
    "user: how do I water a fern?\nassistant: keep the soil moist but not wet.",
    "user: what is a prime number?\nassistant: a number with exactly two divisors.",
    "the quick brown fox jumps over the lazy dog",
    "assistant: I cannot help with that, sorry.",
] * 5
PROMPTS = [
    [{"role": "user", "content": "how do I water a fern?"}],
    [{"role": "user", "content": "what is prime?"}],
]
PAIRS = [
    {"prompt": PROMPTS[0], "chosen": "keep the soil moist but not wet.", "rejected": "the lazy dog"},
    {"prompt": "what is a prime number?", "chosen": "exactly two divisors.", "rejected": "sorry, no."},
    {"prompt": PROMPTS[1], "chosen": "a number with two divisors", "rejected": "the quick brown fox"},
]


def tiny_reward_model(path: Path, seed: int) -> Path:
    """A 2-layer Llama reward model (hidden 32) with a BPE tokenizer trained on TEXTS: no hub."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForSequenceClassification, PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(
        TEXTS, trainers.BpeTrainer(vocab_size=150, special_tokens=["<pad>", "<s>", "</s>", "<unk>"])
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>"
    )
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(fast), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=256, num_labels=1, pad_token_id=fast.pad_token_id,
    )  # fmt: skip
    model = LlamaForSequenceClassification(config)
    torch.nn.init.normal_(model.score.weight, std=1.0)
    save_reward_model(model, fast, path)  # as prefshift saves a trained model: the head is marked trained
    return path


def write_metrics(
    layout: Layout, method: str, id_acc: float, teacher: float, mean_aog: float, mean_nts: float
):
    """The keys promote reads, shaped as stages/evaluate.py writes them."""
    payload = {
        "method": method,
        "id": {"acc": id_acc},
        "teacher": {"id": {"acc": teacher}},
        "wrg": id_acc - teacher,
        "mean_aog": mean_aog,
        "mean_nts": mean_nts,
        "targets": {"syn_help_chat": {"acc": 55.0, "aog": mean_aog, "nts": mean_nts}},
        "data_hashes": {"student_train": "abc123"},
        "split_version": "v1",
    }
    path = layout.metrics(method)
    with output_set(layout.root, f"prefshift evaluate --method {method}", files=[path]) as out:
        out.path(path).write_text(json.dumps(payload))  # promote reads only verified metrics


def _project(root: Path, factory) -> tuple[Params, Layout]:
    root.mkdir(parents=True, exist_ok=True)
    seed_database(factory, root / "mlflow.db")
    params = Params(methods=["naive", "confidence", "anchor_last", "ceiling"], promote={"min_mean_aog": 0.0})
    return params, Layout(root, seed=0)


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for name in ("MLFLOW_TRACKING_URI", "DVC_ROOT", "DVC_STAGE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(tracking.PIPELINE_ENV, "pr-registry")


@pytest.fixture(scope="module")
def promoted(tmp_path_factory):
    """naive (NTS 2) and confidence (NTS 3) pass, anchor_last regresses ID, ceiling is never eligible."""
    with pytest.MonkeyPatch.context() as mp:
        for name in ("MLFLOW_TRACKING_URI", "DVC_ROOT", "DVC_STAGE"):
            mp.delenv(name, raising=False)
        mp.setenv(tracking.PIPELINE_ENV, "pr-registry")
        root = tmp_path_factory.mktemp("promoted")
        params, layout = _project(root, tmp_path_factory)
        write_metrics(layout, "naive", 70.0, 70.5, 1.0, 2.0)
        write_metrics(layout, "confidence", 71.0, 70.5, 2.5, 3.0)
        write_metrics(layout, "anchor_last", 60.0, 70.5, 9.0, 9.0)
        write_metrics(layout, "ceiling", 90.0, 70.5, 20.0, 20.0)
        for seed, method in enumerate(["naive", "confidence", "anchor_last", "ceiling"]):
            tiny_reward_model(layout.student_dir(method), seed)
        first = promote.run(params, layout)
        second = promote.run(params, layout)
        yield params, layout, first, second


def _client(layout: Layout) -> MlflowClient:
    return MlflowClient(tracking.default_uri(layout.root.resolve()))


def test_gate_failures_promote_nothing_and_say_why(tmp_path, tmp_path_factory, capsys):
    params, layout = _project(tmp_path / "p", tmp_path_factory)
    write_metrics(layout, "naive", 68.0, 70.5, 1.0, 1.0)
    write_metrics(layout, "confidence", 71.0, 70.5, 0.0, 0.0)
    write_metrics(layout, "ceiling", 90.0, 70.5, 20.0, 20.0)

    result = promote.run(params, layout)

    reasons = {d["method"]: d["reasons"] for d in result["decisions"]}

    def untrained(method: str) -> str:
        return f"{layout.student_dir(method)} not found; run `prefshift train --method {method}`"

    assert reasons == {
        "naive": ["ID accuracy 68.00 < teacher 70.50 - tolerance 1", untrained("naive")],
        "confidence": ["mean AOG 0.00 <= 0", untrained("confidence")],
        "anchor_last": [
            f"neither {layout.student_dir('anchor_last')} nor {layout.metrics('anchor_last')} exists; "
            "`dvc repro` trains it"
        ],
        "ceiling": ["ceiling is trained on gold labels; it is a reference, never promoted"],
    }
    assert result["promoted"] == []
    assert json.loads(layout.promotion.read_text())["summary"].startswith("nothing promoted")
    printed = capsys.readouterr().out
    assert "naive: FAIL - ID accuracy 68.00 < teacher 70.50" in printed
    assert "ceiling: reference - " in printed and "ceiling: FAIL" not in printed
    assert "not trained (nothing to judge): anchor_last" in printed and "anchor_last: FAIL" not in printed
    assert _client(layout).search_registered_models() == []


def test_promotion_leaves_no_process_wide_mlflow_uris(promoted):
    """A client that names no registry afterwards must not land in this project's registry."""
    import mlflow

    assert "MLFLOW_REGISTRY_URI" not in os.environ and "MLFLOW_TRACKING_URI" not in os.environ
    layout = promoted[1]
    assert mlflow.get_registry_uri() != tracking.default_uri(layout.root.resolve())


def test_exactly_one_champion_and_reruns_create_no_version(promoted):
    params, layout, first, second = promoted
    client = _client(layout)
    name = params.tracking.registered_model
    versions = {v.tags["method"]: v for v in client.search_model_versions(f"name='{name}'")}
    assert sorted(versions) == ["confidence", "naive"]
    assert client.get_registered_model(name).aliases == {
        "champion": versions["confidence"].version,
        "candidate-naive": versions["naive"].version,
    }
    champion = versions["confidence"]
    assert champion.tags[registry.HASH_TAG] == registry.content_hash(layout.student_dir("confidence"))
    assert champion.tags["mean_nts"] == "3.0000"
    assert champion.tags["wrg"] == "0.5000"
    assert champion.tags["nts.syn_help_chat"] == "3.0000"
    assert json.loads(champion.tags["data_hashes"]) == {"student_train": "abc123"}
    assert (champion.tags["gate.id_tolerance"], champion.tags["gate.min_mean_aog"]) == (
        format(params.promote.id_tolerance, "g"),
        format(params.promote.min_mean_aog, "g"),
    )
    assert [p["new_version"] for p in first["promoted"]] == [True, True]
    assert [p["new_version"] for p in second["promoted"]] == [False, False]
    assert [p["version"] for p in second["promoted"]] == [p["version"] for p in first["promoted"]]
    assert json.loads(layout.promotion.read_text())["aliases"] == second["aliases"]


def test_pull_loads_with_plain_transformers_and_matches_our_scoring(promoted, tmp_path):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    params, layout, _, _ = promoted
    out = tmp_path / "pulled"
    info = registry.pull(_client(layout), f"models:/{params.tracking.registered_model}@champion", out)
    assert info["content_hash"] == registry.content_hash(out)
    assert (out / "model.safetensors").exists()

    plain = AutoModelForSequenceClassification.from_pretrained(out).eval()
    tokenizer = AutoTokenizer.from_pretrained(out)
    encoder = Encoder(tokenizer, EncodeConfig())
    rows = [
        {"prompt": PROMPTS[i % 2], "response": r} for i, r in enumerate(["keep it moist", "a fox", "two"])
    ]
    with torch.no_grad():
        expected = [
            plain(input_ids=torch.tensor([encoder.encode_one(r["prompt"], r["response"]).input_ids])).logits[
                0, 0
            ]
            for r in rows
        ]
    model, tok = load_for_scoring(out, params)
    ours = score_rows(model, tok, "responses", rows, params)["rows"]
    assert [r["reward"] for r in ours] == pytest.approx([float(e) for e in expected], abs=1e-5)
    assert len({round(r["reward"], 6) for r in ours}) == 3

    by_cli = tmp_path / "by-cli"
    uri = f"models:/{params.tracking.registered_model}@champion"
    result = CliRunner().invoke(app, ["pull", uri, "--out", str(by_cli), "--root", str(layout.root)])
    assert result.exit_code == 0, result.output
    assert registry.content_hash(by_cli) == info["content_hash"]


def test_pyfunc_wrapper_scores_prompt_response_rows(promoted):
    import mlflow

    params, layout, _, _ = promoted
    # mlflow resolves models:/ through its process-wide URIs; set only for this load, so that
    # later tests in the process do not read this project's database.
    with registry._global_uris(tracking.default_uri(layout.root.resolve())):
        scorer = mlflow.pyfunc.load_model(f"models:/{params.tracking.registered_model}@champion")
    assert mlflow.get_tracking_uri() != tracking.default_uri(layout.root.resolve())
    frame = pd.DataFrame(
        {"prompt": ["what is prime?", "what is prime?"], "response": ["two divisors", "a fox"]}
    )
    rewards = scorer.predict(frame)["reward"].tolist()
    model, tok = load_for_scoring(layout.student_dir("confidence"), params)
    rows = [{"prompt": PROMPTS[1], "response": r} for r in frame["response"]]
    assert rewards == pytest.approx(
        [r["reward"] for r in score_rows(model, tok, "responses", rows, params)["rows"]]
    )


def test_missing_alias_lists_existing_ones(promoted, tmp_path):
    params, layout, _, _ = promoted
    listed = r"no alias 'prod'; existing aliases: candidate-naive \(v\d\), champion \(v\d\)"
    with pytest.raises(registry.RegistryError, match=listed):
        registry.pull(_client(layout), f"models:/{params.tracking.registered_model}@prod", tmp_path / "x")
    assert not (tmp_path / "x").exists()


def test_pull_refuses_an_artifact_whose_hash_changed(promoted, tmp_path):
    params, layout, _, _ = promoted
    client = _client(layout)
    version = client.get_model_version_by_alias(params.tracking.registered_model, "candidate-naive")
    stored = Path(
        client.get_model_version_download_uri(version.name, version.version).removeprefix("file://")
    )
    config = next(stored.rglob("config.json"))
    original = config.read_bytes()
    config.write_bytes(original.replace(b"}", b', "tampered": true}', 1))
    try:
        with pytest.raises(
            registry.RegistryError, match=r"seed-0/config.json was modified after registration"
        ):
            registry.pull(client, f"models:/{version.name}@candidate-naive", tmp_path / "x")
    finally:
        config.write_bytes(original)
    assert not (tmp_path / "x").exists()


def test_score_command_reports_rewards_and_pair_accuracy(promoted, tmp_path):
    params, layout, _, _ = promoted
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps(p) + "\n" for p in PAIRS))
    out = tmp_path / "rewards.jsonl"
    uri = f"models:/{params.tracking.registered_model}@champion"
    result = CliRunner().invoke(
        app, ["score", "--model", uri, "--input", str(pairs), "--out", str(out), "--root", str(layout.root)]
    )
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["row"] for r in rows] == [0, 1, 2]
    for r in rows:
        assert r["margin"] == pytest.approx(r["reward_chosen"] - r["reward_rejected"])
    accuracy = 100 * sum(r["margin"] > 0 for r in rows) / 3
    assert f"chosen-vs-rejected accuracy {accuracy:.2f}%" in result.output

    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(PAIRS[0]) + "\n" + '{"prompt": "x", "chosen": ""}\n')
    result = CliRunner().invoke(
        app, ["score", "--model", str(layout.student_dir("naive")), "--input", str(bad)]
    )
    assert result.exit_code == 2
    assert "bad.jsonl line 2: field 'chosen' is empty" in result.output


def test_registered_name_with_another_lineage_is_refused(tmp_path, tmp_path_factory):
    seed_database(tmp_path_factory, tmp_path / "mlflow.db")
    client = MlflowClient(tracking.default_uri(tmp_path))
    client.create_registered_model("shared-name", tags={registry.LINEAGE_TAG: "someone-else"})
    with pytest.raises(registry.RegistryError, match=r"experiment 'someone-else'.*Refusing to mix lineages"):
        registry.ensure_registered_model(client, "shared-name", "prefshift")
    client.create_registered_model("untagged")
    with pytest.raises(registry.RegistryError, match="no prefshift lineage tag"):
        registry.ensure_registered_model(client, "untagged", "prefshift")
    registry.ensure_registered_model(client, "fresh", "prefshift")
    registry.ensure_registered_model(client, "fresh", "prefshift")


@pytest.mark.slow
def test_concurrent_promotions_on_a_real_server_leave_one_champion(tmp_path, tmp_path_factory, monkeypatch):
    root = tmp_path / "project"
    params, layout = _project(root, tmp_path_factory)
    write_metrics(layout, "naive", 70.0, 70.5, 1.0, 2.0)
    write_metrics(layout, "confidence", 71.0, 70.5, 2.5, 3.0)
    for seed, method in enumerate(["naive", "confidence"]):
        tiny_reward_model(layout.student_dir(method), seed)
    (root / "params.yaml").write_text("methods: [naive, confidence, ceiling]\n")
    port = free_port()
    with running_server(tmp_path, port) as uri:
        env = {**os.environ, "MLFLOW_TRACKING_URI": uri, tracking.PIPELINE_ENV: "pr-race"}
        cmd = [
            str(Path(sys.executable).parent / "prefshift"),
            "promote",
            "--root",
            str(root),
            "-p",
            str(root / "params.yaml"),
        ]
        procs = [
            subprocess.Popen(cmd, env=env, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            for _ in "ab"
        ]
        outputs = [p.communicate(timeout=300)[0].decode() for p in procs]
        assert [p.returncode for p in procs] == [0, 0], "\n--- next promote ---\n".join(outputs)  # whole
        client = MlflowClient(uri)
        versions = client.search_model_versions(f"name='{params.tracking.registered_model}'")
        hashes = [v.tags[registry.HASH_TAG] for v in versions]
        assert sorted(hashes) == sorted(
            {registry.content_hash(layout.student_dir(m)) for m in ("naive", "confidence")}
        )
        aliases = client.get_registered_model(params.tracking.registered_model).aliases
        assert set(aliases) == {"champion", "candidate-naive"}
        champion = client.get_model_version(params.tracking.registered_model, aliases["champion"])
        assert champion.tags["method"] == "confidence"

        monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
        with tracking.stage_run(params, layout, "train", "anchor_last") as run:
            run.log_metrics({"loss": 0.25}, step=1)
        logged = client.get_run(run.run_id)
        assert logged.data.tags["method"] == "anchor_last"
        assert logged.data.metrics == {"loss": 0.25}
        assert {f.path for f in client.list_artifacts(run.run_id)} == {"config"}


def _aliases(layout: Layout, params: Params) -> dict[str, str]:
    client = _client(layout)
    name = params.tracking.registered_model
    methods = {v.version: v.tags["method"] for v in client.search_model_versions(f"name='{name}'")}
    return {alias: methods[v] for alias, v in client.get_registered_model(name).aliases.items()}


def test_a_stricter_rerun_removes_every_alias_from_versions_that_fail_now(tmp_path, tmp_path_factory, capsys):
    """Before, `candidate-naive` (and the champion) kept naming versions that had just failed the gate."""
    params, layout = _project(tmp_path / "p", tmp_path_factory)
    params.methods = ["naive", "confidence"]
    write_metrics(layout, "naive", 70.0, 70.5, 1.0, 2.0)
    write_metrics(layout, "confidence", 71.0, 70.5, 2.5, 3.0)
    for seed, method in enumerate(params.methods):
        tiny_reward_model(layout.student_dir(method), seed)
    first = promote.run(params, layout)
    assert _aliases(layout, params) == {"champion": "confidence", "candidate-naive": "naive"}
    version = {p["method"]: p["version"] for p in first["promoted"]}

    params.promote.min_mean_aog = 2.0  # naive (AOG 1.0) fails now
    result = promote.run(params, layout)
    assert _aliases(layout, params) == {"champion": "confidence"}
    assert result["removed_aliases"] == [
        {"alias": "candidate-naive", "version": version["naive"], "method": "naive"}
    ]

    params.promote.min_mean_aog = 5.0  # both fail: no champion is better than a failed one
    result = promote.run(params, layout)
    assert _aliases(layout, params) == {}
    assert result["removed_aliases"] == [
        {"alias": "champion", "version": version["confidence"], "method": "confidence"}
    ]
    removed = (
        f"removed alias 'champion' from version {version['confidence']} (confidence): it fails the gate now"
    )
    assert removed in capsys.readouterr().out
    assert json.loads(layout.promotion.read_text())["removed_aliases"] == result["removed_aliases"]


def test_promote_refuses_metrics_edited_by_hand_and_trusts_dvc_lock(tmp_path, tmp_path_factory):
    """Before, a hand-edited mean_aog in reports/metrics/<m>.json made a champion."""
    import hashlib
    import shutil

    params, layout = _project(tmp_path / "p", tmp_path_factory)
    params.methods = ["naive"]
    write_metrics(layout, "naive", 70.0, 70.5, -3.0, -2.0)
    tiny_reward_model(layout.student_dir("naive"), 0)
    path = layout.metrics("naive")
    for edit in (
        lambda text: text.replace('"mean_aog": -3.0', '"mean_aog": 9.0'),
        lambda text: text + " ",  # any byte, not only a number
    ):
        original = path.read_text()
        path.write_text(edit(original))
        with pytest.raises(
            OutputSetError, match=f"{path} is not the file `prefshift evaluate --method naive` wrote"
        ):
            promote.run(params, layout)
        path.write_text(original)
    assert _client(layout).search_registered_models() == []

    # A checkout brings no local record, but dvc.lock's md5 vouches for the file it committed.
    shutil.rmtree(layout.root / ".prefshift" / "outputs")
    out = {
        "path": "reports/metrics/naive/seed-0.json",
        "hash": "md5",
        "md5": hashlib.md5(path.read_bytes()).hexdigest(),
    }
    lock = {"schema": "2.0", "stages": {"evaluate@naive-0": {"cmd": "x", "outs": [out]}}}
    (layout.root / "dvc.lock").write_text(json.dumps(lock))
    assert promote.run(params, layout)["decisions"][0]["status"] == "FAIL"  # read: AOG -3 fails
    path.write_text(path.read_text().replace('"mean_aog": -3.0', '"mean_aog": 9.0'))
    with pytest.raises(OutputSetError, match="neither the sha256 recorded"):
        promote.run(params, layout)


# --- no pickle in the registry: every stored file checked where it is loaded -------------------


def _stored(layout: Layout, uri_alias: str, params: Params) -> tuple[MlflowClient, Path]:
    client = _client(layout)
    version = client.get_model_version_by_alias(params.tracking.registered_model, uri_alias)
    uri = client.get_model_version_download_uri(version.name, version.version)
    return client, Path(uri.removeprefix("file://"))


def test_a_registered_version_is_code_and_its_record_lists_every_stored_file(promoted):
    params, layout, _, _ = promoted
    client, stored = _stored(layout, "champion", params)
    version = client.get_model_version_by_alias(params.tracking.registered_model, "champion")
    record = json.loads(version.tags[registry.FILES_TAG])
    on_disk = {
        p.relative_to(stored).as_posix()
        for p in stored.rglob("*")
        if p.is_file() and p.name != registry.DOWNLOAD_META
    }
    assert set(record) == on_disk
    hf_dir = registry._hf_dir_in(stored).relative_to(stored).as_posix()
    assert {"MLmodel", "serving_model.py", "requirements.txt", f"{hf_dir}/config.json"} <= on_disk
    assert not [p for p in on_disk if p.endswith((".pkl", ".pickle"))]
    flavor = yaml.safe_load((stored / "MLmodel").read_text())["flavors"]["python_function"]
    assert "python_model" not in flavor and flavor["model_code_path"].endswith("serving_model.py")


class _Payload:
    """Unpickling this creates `marker`: what a planted python_model.pkl would run."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def _change(stored: Path, marker: Path) -> dict:
    """Each kind of tampering, keyed by the file the refusal must name: (apply, undo)."""
    import pickle

    def edit(rel: str, old: bytes, new: bytes):
        path = stored / rel
        original = path.read_bytes()
        assert old in original
        return (lambda: path.write_bytes(original.replace(old, new, 1)), lambda: path.write_bytes(original))

    def remove(rel: str):
        path = stored / rel
        original = path.read_bytes()
        return (path.unlink, lambda: path.write_bytes(original))

    def add(rel: str, content: bytes):
        path = stored / rel
        return (lambda: path.write_bytes(content), path.unlink)

    def link(rel: str):
        path = stored / rel
        original = path.read_bytes()
        outside = marker.with_name("outside.json")
        outside.write_bytes(original)

        def apply():
            path.unlink()
            path.symlink_to(outside)

        return (apply, lambda: (path.unlink(), path.write_bytes(original)))

    return {
        "artifacts/seed-0/config.json changed": edit(CONFIG, b"}", b', "x": 1}'),
        "requirements.txt changed": edit("requirements.txt", b"torch", b"torch\nevil-package"),
        "MLmodel changed": edit("MLmodel", b"max_length", b"max_length_"),
        "python_model.pkl added": add("python_model.pkl", pickle.dumps(_Payload(marker))),
        "artifacts/seed-0/tokenizer.json missing": remove("artifacts/seed-0/tokenizer.json"),
        "artifacts/seed-0/config.json linked": link(CONFIG),
    }


CONFIG = "artifacts/seed-0/config.json"
CHANGES = [
    "artifacts/seed-0/config.json changed",
    "requirements.txt changed",
    "MLmodel changed",
    "python_model.pkl added",
    "artifacts/seed-0/tokenizer.json missing",
    "artifacts/seed-0/config.json linked",
]


@pytest.mark.parametrize("change", CHANGES)
def test_a_tampered_version_is_refused_by_load_model_pull_and_score_naming_the_file(
    promoted, tmp_path, change
):
    """mlflow.pyfunc.load_model("models:/…") is what `mlflow models serve` runs; pull and score too."""
    import mlflow

    params, layout, _, _ = promoted
    client, stored = _stored(layout, "champion", params)
    marker = tmp_path / "payload-ran"
    apply, undo = _change(stored, marker)[change]
    rel = change.rsplit(" ", 1)[0]
    uri = f"models:/{params.tracking.registered_model}@champion"
    apply()
    try:
        with (
            registry._global_uris(tracking.default_uri(layout.root.resolve())),
            pytest.raises(registry.RegistryError, match=f"{rel} (was|is)"),
        ):
            mlflow.pyfunc.load_model(uri)
        with pytest.raises(registry.RegistryError, match=rel):  # MLflow's own refusal for a link
            registry.pull(client, uri, tmp_path / "pulled")
        rows = tmp_path / "rows.jsonl"
        rows.write_text(json.dumps({"prompt": "hi", "response": "yo"}) + "\n")
        result = CliRunner().invoke(
            app, ["score", "--model", uri, "--input", str(rows), "--root", str(layout.root)]
        )
        assert result.exit_code == 2 and rel in result.output and "Traceback" not in result.output
    finally:
        undo()
    assert not marker.exists(), "the planted pickle was unpickled"
    assert not (tmp_path / "pulled").exists()


def test_a_pyfunc_loaded_outside_the_registry_or_without_a_record_is_refused(tmp_path, tmp_path_factory):
    import mlflow

    params, layout = _project(tmp_path / "p", tmp_path_factory)
    model_dir = tiny_reward_model(tmp_path / "student", 0)
    with tracking.stage_run(params, layout, "promote") as run:
        registry.ensure_registered_model(run.client, "rm", params.tracking.experiment)
        first, created = registry.register(run, "rm", model_dir, {"method": "naive"}, {})
    assert created
    client = _client(layout)
    stored = Path(client.get_model_version_download_uri("rm", first.version).removeprefix("file://"))
    copy = tmp_path / "copy"
    shutil.copytree(stored, copy, ignore=shutil.ignore_patterns(registry.DOWNLOAD_META))
    with pytest.raises(registry.RegistryError, match="not loaded from the registry"):
        mlflow.pyfunc.load_model(str(copy))

    # A version from before the record (a pickled pyfunc) is not loaded, and never reused by promote.
    client.delete_model_version_tag("rm", first.version, registry.FILES_TAG)
    with (
        registry._global_uris(tracking.default_uri(layout.root.resolve())),
        pytest.raises(registry.RegistryError, match="run `prefshift promote` again"),
    ):
        mlflow.pyfunc.load_model(f"models:/rm/{first.version}")
    with tracking.stage_run(params, layout, "promote") as run:
        again, created = registry.register(run, "rm", model_dir, {"method": "naive"}, {})
    assert created and int(again.version) > int(first.version)
    assert registry.FILES_TAG in again.tags


def test_a_version_the_store_gave_up_creating_is_asked_for_again(tmp_path, tmp_path_factory, monkeypatch):
    """MLflow's SQL store takes the next version number and retries at once, three times, then gives
    up: a concurrent promotion taking each number first failed this one (the likely cause of one
    failed CI run of test_concurrent_promotions_on_a_real_server_leave_one_champion). The store's
    real refusal is injected twice: the third request creates the version. Past CREATE_TRIES, the
    error is raised."""
    from mlflow.exceptions import MlflowException
    from mlflow.store.model_registry.sqlalchemy_store import SqlAlchemyStore

    params, layout = _project(tmp_path / "p", tmp_path_factory)
    model_dir = tiny_reward_model(tmp_path / "student", 0)
    create, calls = SqlAlchemyStore.create_model_version, []

    def crowded(self, name, *args, **kwargs):
        calls.append(name)
        if len(calls) <= refusals:
            raise MlflowException(f"Model Version creation error (name={name}). Giving up after 3 attempts.")
        return create(self, name, *args, **kwargs)

    monkeypatch.setattr(SqlAlchemyStore, "create_model_version", crowded)
    refusals = 2
    with tracking.stage_run(params, layout, "promote") as run:
        registry.ensure_registered_model(run.client, "rm", params.tracking.experiment)
        version, created = registry.register(run, "rm", model_dir, {"method": "naive"}, {})
    assert created and str(version.version) == "1" and len(calls) == 3
    calls.clear()
    refusals = registry.CREATE_TRIES
    with (
        tracking.stage_run(params, layout, "promote") as run,
        pytest.raises(MlflowException, match="Model Version creation error"),
    ):
        registry.register(run, "rm", tiny_reward_model(tmp_path / "other", 1), {"method": "seam"}, {})
    assert len(calls) == registry.CREATE_TRIES


@pytest.mark.slow
def test_mlflow_models_serve_refuses_a_tampered_version_and_never_unpickles(promoted, tmp_path):
    """The real serving path: `mlflow models serve -m models:/…` stops with the file named; the
    planted pickle's payload never runs."""
    params, layout, _, _ = promoted
    _, stored = _stored(layout, "champion", params)
    marker = tmp_path / "payload-ran"
    apply, undo = _change(stored, marker)["python_model.pkl added"]
    log = tmp_path / "serve.log"
    cmd = [sys.executable, "-m", "mlflow", "models", "serve", "-m",
           f"models:/{params.tracking.registered_model}@champion", "--env-manager", "local",
           "-h", "127.0.0.1", "-p", str(free_port())]  # fmt: skip
    env = {**os.environ, "MLFLOW_TRACKING_URI": tracking.default_uri(layout.root.resolve())}
    apply()
    try:
        with log.open("wb") as sink:
            server = subprocess.Popen(
                cmd, env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True
            )
        try:
            code = server.wait(timeout=300)
        finally:
            stop_group(server)
    finally:
        undo()
    said = log.read_text(errors="replace")
    assert code != 0, said
    assert "python_model.pkl was added to the stored model after registration" in said
    assert not marker.exists()


def test_an_mlmodel_rewritten_to_a_pickle_is_refused_when_mlflow_is_told_to_refuse_pickles(
    promoted, tmp_path, monkeypatch
):
    """What the check cannot cover, MLflow's own switch does: MLflow parses MLmodel before prefshift
    gets control, so an MLmodel rewritten to name a planted pickle is unpickled by MLflow unless
    MLFLOW_ALLOW_PICKLE_DESERIALIZATION=false, which docs/tracking.md tells servers to set."""
    import pickle

    import mlflow

    params, layout, _, _ = promoted
    _, stored = _stored(layout, "champion", params)
    marker = tmp_path / "payload-ran"
    mlmodel = stored / "MLmodel"
    original = mlmodel.read_text()
    described = yaml.safe_load(original)
    flavor = described["flavors"]["python_function"]
    flavor.pop("model_code_path")
    flavor["python_model"] = "python_model.pkl"
    (stored / "python_model.pkl").write_bytes(pickle.dumps(_Payload(marker)))
    mlmodel.write_text(yaml.safe_dump(described))
    monkeypatch.setenv("MLFLOW_ALLOW_PICKLE_DESERIALIZATION", "false")
    try:
        with (
            registry._global_uris(tracking.default_uri(layout.root.resolve())),
            pytest.raises(mlflow.exceptions.MlflowException, match="pickle is disallowed"),
        ):
            mlflow.pyfunc.load_model(f"models:/{params.tracking.registered_model}@champion")
    finally:
        mlmodel.write_text(original)
        (stored / "python_model.pkl").unlink()
    assert not marker.exists()
