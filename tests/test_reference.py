"""The shared ANCHOR reference: stored once, read by every anchor run, checked row by row."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from prefshift.config.params import ConfigError, LMSpec, Params, TrainConfig, parse_params
from prefshift.data.encode import collate
from prefshift.engine.anchor_cache import hidden_fn, hidden_upto
from prefshift.engine.reference_manifest import ReferenceMismatchError
from prefshift.engine.reference_store import ReferenceWriter, StoredReference, stored_bytes
from prefshift.engine.train import train_reward_model
from prefshift.methods import build_objective, reference_layers, reference_request
from prefshift.methods.anchor import AnchorObjective, select_response
from prefshift.methods.base import BatchOut
from tiny_models import items, reward_model, tokenizer

DEEP = LMSpec(hidden_size=32, num_layers=4, num_heads=2, intermediate_size=64, pretrain_steps=0)


def _write(directory, model, encoded, layers, store=True):
    writer = ReferenceWriter(directory, layers, model.config.hidden_size, store=store)
    batch = collate(encoded, tokenizer().pad_token_id)
    hidden = hidden_fn(model)(batch["input_ids"], batch["attention_mask"])
    for row, key in enumerate(batch["keys"]):
        rows = [h[row : row + 1] for h in hidden]
        writer.add(key, select_response(rows, layers, batch["response_mask"][row : row + 1]))
    return writer.finish(num_layers=model.num_layers), batch, hidden


def test_forward_stops_at_the_deepest_needed_layer_with_the_same_states():
    model = reward_model(seed=3, spec=DEEP).eval()
    batch = collate(items(4), tokenizer().pad_token_id)
    full = hidden_fn(model)(batch["input_ids"], batch["attention_mask"])
    calls = []
    handle = model.hf.base_model.layers[3].register_forward_hook(lambda *_: calls.append(1))
    partial = hidden_upto(model, 2)(batch["input_ids"], batch["attention_mask"])
    handle.remove()
    assert calls == [], "layer 4 must not run when layer 2 is the deepest needed"
    for k in (1, 2):
        torch.testing.assert_close(partial[k], full[k])
    assert partial[3] is None and partial[4] is None


def test_stored_states_round_trip_in_half_precision_with_their_mean_square(tmp_path):
    model = reward_model(seed=1)
    encoded = items(6)
    manifest, batch, hidden = _write(tmp_path, model, encoded, (1, 2))
    expected = select_response(hidden, (1, 2), batch["response_mask"])
    stored = StoredReference(tmp_path, (2,))
    stored.check(encoded)
    got = stored.get(batch, torch.device("cpu"))
    assert got.shape == (1, *expected.shape[1:])
    torch.testing.assert_close(got, expected[1:].float(), atol=2e-3, rtol=2e-3)
    for i, k in enumerate((1, 2)):
        assert manifest["mean_square"][str(k)] == pytest.approx(
            expected[i].double().pow(2).mean().item(), rel=1e-6
        )
    assert manifest["tokens"] == expected.shape[1]
    assert stored_bytes(encoded, (1, 2), model.config.hidden_size) == expected.numel() * 2


def test_states_spread_over_shards_come_back_in_batch_order(tmp_path, monkeypatch):
    """A batch whose sequences live in different shards is gathered shard by shard and laid out
    in the batch's own order (what a length-grouped batch of a large reference looks like)."""
    import prefshift.engine.reference_store as store

    monkeypatch.setattr(store, "SHARD_BYTES", 1)  # every sequence in its own shard
    model = reward_model(seed=1)
    encoded = items(5)
    manifest, _, _ = _write(tmp_path, model, encoded, (1, 2))
    assert len(manifest["shards"]) == 2 * len(encoded)
    shuffled = [encoded[i] for i in (3, 0, 4, 1)]
    batch = collate(shuffled, tokenizer().pad_token_id)
    hidden = hidden_fn(model)(batch["input_ids"], batch["attention_mask"])
    expected = select_response(hidden, (2, 1), batch["response_mask"]).float()
    got = StoredReference(tmp_path, (2, 1)).get(batch, torch.device("cpu"))
    torch.testing.assert_close(got, expected, atol=2e-3, rtol=2e-3)


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda shard: shard.unlink(), "shard listed in the manifest is missing"),
        (lambda shard: shard.write_bytes(shard.read_bytes()[:6]), "truncated or no header"),
        (
            lambda shard: shard.write_bytes(b"\x04\x00\x00\x00\x00\x00\x00\x00{no}" + b"0" * 64),
            "unreadable safetensors header",
        ),
        (lambda shard: shard.write_bytes(shard.read_bytes()[:-2]), "but the file has .* \\(truncated\\)"),
    ],
    ids=["missing", "truncated", "garbage-header", "short-data"],
)
def test_a_damaged_shard_is_refused_with_its_name(tmp_path, damage, message):
    _write(tmp_path, reward_model(seed=1), items(4), (2,))
    shard = tmp_path / "shard-00000.safetensors"
    damage(shard)
    with pytest.raises(
        ReferenceMismatchError, match=f"shard-00000.safetensors: .*{message}.*rerun `prefshift reference`"
    ):
        StoredReference(tmp_path, (2,))


def test_an_index_pointing_past_its_shard_is_refused(tmp_path):
    _write(tmp_path, reward_model(seed=1), items(4), (2,))
    index = json.loads((tmp_path / "index.json").read_text())
    index["offset"][-1] += 10_000
    (tmp_path / "index.json").write_text(json.dumps(index))
    with pytest.raises(ReferenceMismatchError, match=r"index.json: pair .* points past its shard"):
        StoredReference(tmp_path, (2,))


def test_a_reference_of_other_data_or_encoding_is_refused(tmp_path):
    model = reward_model(seed=1)
    _write(tmp_path, model, items(6), (2,))
    stored = StoredReference(tmp_path, (2,))
    first = items(6)[0]
    mask = list(first.chosen.response_mask)
    mask[len(mask) - 1 - mask[::-1].index(1)] = 0  # one response token fewer: another encoding
    shorter = dataclasses.replace(first, chosen=dataclasses.replace(first.chosen, response_mask=mask))
    with pytest.raises(ReferenceMismatchError, match=r"reference tokens but .* response tokens"):
        stored.check([shorter])
    with pytest.raises(ReferenceMismatchError, match="no reference states for pair"):
        stored.check(items(8))
    with pytest.raises(ReferenceMismatchError, match="holds layers \\[2\\], not \\[1\\]"):
        StoredReference(tmp_path, (1,))
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    (tmp_path / "manifest.json").write_text(json.dumps({**manifest, "format": 1}))  # an older prefshift's
    with pytest.raises(ReferenceMismatchError, match="reference format 1, this prefshift reads 2; rerun"):
        StoredReference(tmp_path, (2,))


def test_too_large_a_reference_keeps_only_its_constants(tmp_path):
    manifest, _, _ = _write(tmp_path, reward_model(seed=1), items(4), (2,), store=False)
    assert not manifest["stored"] and manifest["shards"] == [] and manifest["mean_square"]["2"] > 0
    with pytest.raises(ReferenceMismatchError, match="too large to store"):
        StoredReference(tmp_path, (2,))


def test_union_of_the_listed_anchor_methods_layers():
    params = Params.model_validate({"methods": ["naive", "anchor_last"]})
    assert reference_layers(reference_request(params), 4) == (4,)
    params = Params.model_validate({"methods": ["anchor_last", "anchor_mid"]})
    assert reference_layers(reference_request(params), 4) == (2, 3, 4)
    assert reference_request(Params.model_validate({"methods": ["naive"]}))["kinds"] == []


def test_normalised_anchor_divides_each_layer_by_its_reference_scale():
    objective = AnchorObjective("anchor_mid", layers=(1, 2), lam=0.5, normalize="reference")
    objective.set_scale({1: 2.0, 2: 0.5, 3: 9.0})
    reference = torch.zeros(2, 2, 1)
    hidden = (torch.zeros(1, 2, 1), torch.full((1, 2, 1), 1.0), torch.full((1, 2, 1), 2.0))
    out = BatchOut(
        torch.zeros(1), torch.full((1,), 0.5), hidden, torch.ones(1, 2, dtype=torch.bool), reference
    )
    loss, extra = objective.loss(out, 0, 1)
    w2s = torch.log(torch.tensor(2.0)).item()  # BCE at Δ = 0
    term = 0.5 * (1.0 / 2.0 + 4.0 / 0.5) / 2  # λ · mean(mse_k / c_k) = 0.5 · (0.5 + 8) / 2
    assert loss.item() == pytest.approx(w2s + term)
    assert extra["anchor_mse"] == pytest.approx(2.5)  # raw mean of 1 and 4, logged either way
    assert extra["anchor_share"] == pytest.approx(term / (w2s + term))


def test_training_on_the_stored_reference_equals_the_in_run_cache(tmp_path):
    cfg = TrainConfig(
        batch_size=4, epochs=1, lr=5e-3, warmup_frac=0.0, log_every=1, drift_every=1, probe_size=4
    )
    params = Params.model_validate({"anchor": {"lambda": 1.0, "normalize": "reference"}})
    encoded = items(8)
    _write(tmp_path, reward_model(seed=1), encoded, (2,))

    def run(reference):
        model = reward_model(seed=1)
        objective = build_objective("anchor_last", params, model.num_layers)
        return train_reward_model(
            model,
            tokenizer(),
            encoded,
            objective,
            cfg,
            seed=0,
            name="a",
            anchor=params.anchor,
            reference=reference,
            progress=False,
        )[1]

    shared = StoredReference(tmp_path, (2,))
    from_store, in_run = run(shared), run(None)
    assert from_store["reference"]["route"] == "shared" and in_run["reference"]["route"] == "in-run cache"
    assert from_store["reference"]["forward_rows"] == 0 and shared.rows_read > 0
    for a, b in zip(from_store["steps"], in_run["steps"], strict=True):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-4) and 0 < a["anchor_share"] < 1


def test_seam_with_an_encoder_strong_model_is_refused_when_params_are_read(tmp_path):
    from transformers import BertConfig

    BertConfig(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64
    ).save_pretrained(tmp_path)
    raw = {
        "methods": ["naive", "seam"],
        "backbone": {"strong": {"name_or_path": str(tmp_path)}},
        "downstream": {"policy": "HuggingFaceTB/SmolLM2-135M-Instruct"},  # best-of-n needs no encoder
    }
    with pytest.raises(ConfigError, match=r"is a bert encoder .* drop seam from methods"):
        parse_params(raw)
    parse_params({**raw, "methods": ["naive"]})
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == "bert"


def test_without_an_anchor_method_the_reference_stage_loads_no_model_and_stores_nothing(tmp_path):
    from prefshift.core.paths import Layout
    from prefshift.engine.reference_manifest import read_manifest
    from prefshift.pipeline.stages.reference import run

    layout = Layout(root=tmp_path, seed=0)  # no strong base on disk: loading it would fail
    params = parse_params({"methods": ["naive", "confidence", "ceiling"]}, "test params")
    run(params, layout)
    manifest = read_manifest(layout.reference_dir)
    assert manifest["stored"] is False and manifest["layers"] == [] and manifest["shards"] == []
    assert "no anchor method" in manifest["reason"]
    assert sorted(p.name for p in layout.reference_dir.iterdir()) == ["manifest.json"]
