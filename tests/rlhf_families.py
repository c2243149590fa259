"""The three reward-model families prefshift supports, built from configs and local text (no hub).

- `llama`: the embedded default's kind, a tiny Llama decoder with a byte-level BPE
  tokenizer that ships no chat template (prefshift writes its plain one);
- `bert`: a BERT-style encoder ([CLS] pooling) with a WordPiece vocabulary, no template;
- `qwen2`: a Qwen2-architecture decoder whose tokenizer ships its own ChatML-style
  template (the Qwen2.5 convention: <|im_start|>role\\n...<|im_end|>\\n, a default
  system turn, pad <|endoftext|> distinct from EOS <|im_end|>).

Each is saved through `save_reward_model`, as a trained model leaves prefshift.
"""

from __future__ import annotations

from pathlib import Path

import torch

from prefshift.models.backbone import tiny_config
from prefshift.models.reward import RewardModel, disable_dropout, ensure_pad_token, save_reward_model
from tiny_models import SPEC, TEXTS, fresh_tokenizer

FAMILIES = ("llama", "bert", "qwen2")
QWEN_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "{% endif %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def bert_tokenizer(texts=TEXTS):
    """A WordPiece tokenizer whose vocabulary holds every word of `texts` (and single characters)."""
    from transformers import BertTokenizerFast

    words = sorted(
        {w for text in texts for w in text.lower().replace("?", " ? ").replace(",", " , ").split()}
    )
    chars = sorted(
        {c for text in texts for c in text.lower() if not c.isspace()}
        | set("abcdefghijklmnopqrstuvwxyz0123456789.,:?!'")
    )
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *chars, *(f"##{c}" for c in chars), *words]
    return BertTokenizerFast(vocab={w: i for i, w in enumerate(dict.fromkeys(vocab))})


def _qwen_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=special, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )  # fmt: skip
    tok.train_from_iterator(TEXTS, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    fast.chat_template = QWEN_TEMPLATE
    return fast


def build(family: str, seed: int = 0):
    """(HF sequence classifier with a scalar head, tokenizer) of one family, randomly initialised."""
    from transformers import (
        BertConfig,
        BertForSequenceClassification,
        LlamaForSequenceClassification,
        Qwen2Config,
        Qwen2ForSequenceClassification,
    )

    torch.manual_seed(seed)
    if family == "llama":
        tok = fresh_tokenizer()
        config = tiny_config(SPEC, tok, 256)
        config.num_labels = 1
        model = LlamaForSequenceClassification(config)
    elif family == "bert":
        tok = bert_tokenizer()
        config = BertConfig(
            vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
            intermediate_size=64, max_position_embeddings=256, num_labels=1, pad_token_id=tok.pad_token_id,
            initializer_range=0.5,  # a pooled [CLS] far from tanh's flat zero: rewards that vary
        )  # fmt: skip
        model = BertForSequenceClassification(config)
    elif family == "qwen2":
        tok = _qwen_tokenizer()
        config = Qwen2Config(
            vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
            num_key_value_heads=2, intermediate_size=64, max_position_embeddings=256, num_labels=1,
            pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
        )  # fmt: skip
        model = Qwen2ForSequenceClassification(config)
    else:
        raise ValueError(family)
    head = model.classifier if family == "bert" else model.score
    torch.nn.init.normal_(head.weight, std=1.0)  # rewards that differ visibly between texts
    disable_dropout(model)
    ensure_pad_token(tok, model)
    return model, tok


def saved(family: str, root: Path, seed: int = 0, stats: dict[str, float] | None = None) -> Path:
    """A reward-model directory of `family` as prefshift saves it (optionally with mean/std)."""
    out = root / f"rm-{family}-{seed}"
    if not out.exists():
        model, tok = build(family, seed)
        for key, value in (stats or {}).items():
            setattr(model.config, key, value)
        save_reward_model(RewardModel(model), tok, out)
    return out
