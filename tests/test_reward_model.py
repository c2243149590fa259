"""Reward reading (left/right padding, pad == EOS), plain-transformers round trip, backbones, load errors."""

from __future__ import annotations

import json
import math

import pytest
import torch

from prefshift.config.params import LMSpec
from prefshift.models.backbone import SOURCE_FILE, pretrain_lm, resolve_pretrained
from prefshift.models.reward import (
    ModelLoadError,
    RewardModel,
    disable_dropout,
    ensure_pad_token,
    last_token_index,
    load_reward_model,
    save_reward_model,
)
from tiny_models import SPEC, TEXTS, base_dir, fresh_tokenizer, reward_model, tokenizer

SEQS = [[1, 40, 41, 42, 43, 44], [1, 50, 51], [1, 60, 61, 62]]


def _batch(seqs, pad_id, side):
    width = max(map(len, seqs))
    ids = torch.full((len(seqs), width), pad_id)
    attn = torch.zeros((len(seqs), width), dtype=torch.long)
    for row, seq in enumerate(seqs):
        cols = slice(width - len(seq), width) if side == "left" else slice(0, len(seq))
        ids[row, cols] = torch.tensor(seq)
        attn[row, cols] = 1
    return ids, attn


def _single_rewards(model, seqs):
    return torch.stack(
        [model(torch.tensor([s]), torch.ones(1, len(s), dtype=torch.long)).rewards[0] for s in seqs]
    )


def test_last_token_index_from_the_mask():
    right = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    left = torch.tensor([[0, 1, 1, 1], [0, 0, 1, 1]])
    assert last_token_index(right).tolist() == [2, 1]
    assert last_token_index(left).tolist() == [3, 3]


@torch.no_grad()
@pytest.mark.parametrize("side", ["right", "left"])
def test_rewards_do_not_depend_on_padding_side(side):
    model = reward_model().eval()
    ids, attn = _batch(SEQS, tokenizer().pad_token_id, side)
    got = model(ids, attn).rewards
    assert torch.allclose(got, _single_rewards(model, SEQS), atol=1e-5)


@torch.no_grad()
@pytest.mark.parametrize("side", ["right", "left"])
def test_pad_equal_to_eos_is_read_from_the_mask(side):
    model = reward_model().eval()
    eos = tokenizer().eos_token_id
    seqs = [[*s, eos] for s in SEQS]  # every sequence really ends with EOS, and padding is EOS too
    ids, attn = _batch(seqs, eos, side)
    got = model(ids, attn).rewards
    assert torch.allclose(got, _single_rewards(model, seqs), atol=1e-5)


def test_saved_model_reloads_with_plain_transformers(tmp_path):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    model = reward_model(seed=3).eval()
    save_reward_model(model, tokenizer(), tmp_path / "rm")
    plain = AutoModelForSequenceClassification.from_pretrained(tmp_path / "rm").eval()
    plain_tok = AutoTokenizer.from_pretrained(tmp_path / "rm")
    assert plain_tok.pad_token_id == tokenizer().pad_token_id == plain.config.pad_token_id
    ids, attn = _batch(SEQS, plain_tok.pad_token_id, "right")
    with torch.no_grad():
        ours = model(ids, attn).rewards
        theirs = plain(input_ids=ids, attention_mask=attn).logits.squeeze(-1)
        reloaded, _ = load_reward_model(tmp_path / "rm")
        again = reloaded(ids, attn).rewards
    assert torch.allclose(ours, theirs, atol=1e-5)
    assert torch.equal(ours, again)


def test_encoder_reward_is_the_cls_head():
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=100,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=32,
        num_labels=1,
    )
    hf = BertForSequenceClassification(config)
    disable_dropout(hf)
    assert config.hidden_dropout_prob == 0.0 and config.attention_probs_dropout_prob == 0.0
    model = RewardModel(hf).eval()
    ids, attn = _batch([[2, 5, 6, 3], [2, 7, 3]], 0, "right")
    with torch.no_grad():
        out = model(ids, attn, output_hidden_states=True)
        plain = hf(input_ids=ids, attention_mask=attn).logits.squeeze(-1)
    assert torch.equal(out.rewards, plain)
    assert len(out.hidden_states) == 3 and model.num_layers == 2


def test_tokenizer_without_pad_gets_eos_as_pad():
    tok = fresh_tokenizer()
    tok.pad_token = None
    model = reward_model()
    ensure_pad_token(tok, model.hf)
    assert tok.pad_token_id == tok.eos_token_id == model.config.pad_token_id


def test_a_template_that_writes_eos_gets_a_dedicated_pad_and_hf_reads_the_true_last_token():
    """Pad = EOS with texts ending in EOS would make HF's classifier read the token before it."""
    from transformers import AutoModelForSequenceClassification

    tok = fresh_tokenizer()
    tok.pad_token = None
    tok.chat_template = "{% for m in messages %}{{ m['content'] }}{{ eos_token }}{% endfor %}"
    model = reward_model()
    before = model.hf.get_input_embeddings().num_embeddings
    ensure_pad_token(tok, model.hf)
    assert tok.pad_token == "<|pad|>" and tok.pad_token_id != tok.eos_token_id
    assert model.hf.get_input_embeddings().num_embeddings == before + 1 == len(tok)
    text = tok.apply_chat_template([{"role": "user", "content": "fix it"}], tokenize=False)
    assert text.endswith(tok.eos_token)
    batch = tok(
        [text, text + "x"], padding=True, padding_side="right", add_special_tokens=False, return_tensors="pt"
    )
    with torch.no_grad():
        ours = model(batch["input_ids"], batch["attention_mask"]).rewards
        hf = AutoModelForSequenceClassification.from_config(model.hf.config)
        hf.load_state_dict(model.hf.state_dict())
        plain = hf.eval()(**batch).logits[:, 0]
    assert torch.allclose(ours, plain, atol=1e-5)


def test_load_from_backbone_dir_adds_head_and_turns_dropout_off(tmp_path):
    from transformers import LlamaForCausalLM

    from prefshift.models.backbone import save_backbone, tiny_config

    config = tiny_config(SPEC, tokenizer(), 64)
    config.attention_dropout = 0.2
    save_backbone(LlamaForCausalLM(config), tokenizer(), tmp_path / "base", {})
    model, tok = load_reward_model(tmp_path / "base")
    assert model.config.attention_dropout == 0.0
    assert model.hf.score.out_features == 1
    assert tok.pad_token_id == model.config.pad_token_id


def test_a_fresh_head_depends_on_the_seed_alone(tmp_path):
    """torch seeds itself from the OS in every process, so a head built from whatever state the
    generator is in differs from run to run (the best-of-n judge did). Loading seeds it."""
    from transformers import LlamaForCausalLM

    from prefshift.models.backbone import save_backbone, tiny_config

    save_backbone(LlamaForCausalLM(tiny_config(SPEC, tokenizer(), 64)), tokenizer(), tmp_path / "base", {})
    heads = []
    for state, seed in ((11, 3), (12, 3), (11, 4)):
        torch.manual_seed(state)  # what ran before the load: another draw, another process
        torch.rand(state)
        model, _ = load_reward_model(tmp_path / "base", seed=seed)
        heads.append(model.hf.score.weight.detach().clone())
    assert torch.equal(heads[0], heads[1])
    assert not torch.equal(heads[0], heads[2])


def test_missing_local_dir_and_offline_hub_id_fail_clearly(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_reward_model(tmp_path / "nope")
    with pytest.raises(ModelLoadError, match="offline"):
        load_reward_model("prefshift-test/definitely-not-cached")


def test_resolve_copies_a_local_dir_and_refuses_unknown_hub_ids(tmp_path):
    src = base_dir(tmp_path)
    source = resolve_pretrained(LMSpec(name_or_path=str(src)), tmp_path / "models" / "weak")
    assert source["name_or_path"] == str(src)
    assert json.loads((tmp_path / "models" / "weak" / SOURCE_FILE).read_text())["name_or_path"] == str(src)
    load_reward_model(tmp_path / "models" / "weak")
    with pytest.raises(ModelLoadError, match="not in the local Hugging Face cache"):
        resolve_pretrained(LMSpec(name_or_path="prefshift-test/not-cached"), tmp_path / "models" / "strong")
    with pytest.raises(ModelLoadError, match="does not exist"):
        resolve_pretrained(LMSpec(name_or_path="./missing/model"), tmp_path / "models" / "strong")


def test_pretraining_is_seeded_and_learns():
    spec = LMSpec(
        hidden_size=16,
        num_layers=1,
        num_heads=2,
        intermediate_size=32,
        pretrain_steps=10,
        pretrain_batch_size=4,
        pretrain_seq_len=32,
        pretrain_lr=1e-2,
    )
    model, stats = pretrain_lm(spec, tokenizer(), TEXTS, 0, 64)
    assert stats["final_loss"] < math.log(len(tokenizer())) - 0.5  # well below a uniform guess
    again, _ = pretrain_lm(spec, tokenizer(), TEXTS, 0, 64)
    pairs = zip(model.state_dict().values(), again.state_dict().values(), strict=True)
    assert all(torch.equal(a, b) for a, b in pairs)


def test_keep_layers_cuts_a_pretrained_backbone_to_its_first_layers(tmp_path):
    """backbone.weak.keep_layers: the weak model as the strong one cut short (MiniLM-L6 → 1 layer)."""
    from safetensors.torch import load_file

    src = base_dir(tmp_path)  # two layers
    out = tmp_path / "models" / "weak"
    source = resolve_pretrained(LMSpec(name_or_path=str(src), keep_layers=1), out)
    assert source["layers"] == {"before": 2, "kept": 1}
    assert json.loads((out / "config.json").read_text())["num_hidden_layers"] == 1
    full, cut = load_file(src / "model.safetensors"), load_file(out / "model.safetensors")
    assert not any(".layers.1." in name for name in cut)
    assert set(cut) == {name for name in full if ".layers.1." not in name}
    assert all(torch.equal(cut[name], full[name]) for name in cut)  # what is kept is kept exactly
    assert load_reward_model(out)[0].num_layers == 1
    with pytest.raises(ModelLoadError, match="keep_layers 3: the model has only 2 layers"):
        resolve_pretrained(LMSpec(name_or_path=str(src), keep_layers=3), tmp_path / "models" / "strong")
