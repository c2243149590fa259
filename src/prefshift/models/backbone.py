"""Backbones: tiny Llama-style LMs pretrained on local text, or a hub/local model resolved once.

The embedded default needs language models that exist offline, so we train a
byte-level BPE tokenizer and two causal LMs of clearly different capacity on the
synthetic corpus. Real runs copy a hub snapshot (or local dir) into models/base/
so DVC versions exactly what later stages load.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path

import torch

from prefshift.config.params import LMSpec
from prefshift.core.atomic import atomic_path
from prefshift.core.progress import ProgressReporter
from prefshift.data.synthetic import MARKERS
from prefshift.models.reward import ModelLoadError, hub_offline, quiet_transformers
from prefshift.models.validate import check_loadable, looks_local

SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>")
RESERVED_TOKENS = MARKERS
"""Ids no pretraining document contains, as real tokenizers reserve some: the synthetic suite's
marker cue is one, so the pretrained backbones know nothing of it."""
SOURCE_FILE = "prefshift_source.json"
_SNAPSHOT_PATTERNS = ["*.json", "*.safetensors", "*.model", "*.txt", "*.py", "*.jinja", "*.tiktoken"]


def train_tokenizer(texts: Sequence[str], vocab_size: int):
    """Byte-level BPE (no unknown tokens possible) wrapped as a transformers fast tokenizer.

    The reserved tokens are special: each stays one id wherever it appears in text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[*SPECIAL_TOKENS, *RESERVED_TOKENS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    pad, bos, eos = SPECIAL_TOKENS
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=pad, bos_token=bos, eos_token=eos)


def tiny_config(spec: LMSpec, tokenizer, max_positions: int):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_heads,
        intermediate_size=spec.intermediate_size,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )


def _token_stream(texts: Sequence[str], tokenizer) -> torch.Tensor:
    ids: list[int] = []
    for enc in tokenizer(list(texts), add_special_tokens=False)["input_ids"]:
        ids.extend([tokenizer.bos_token_id, *enc, tokenizer.eos_token_id])
    return torch.tensor(ids, dtype=torch.long)


def pretrain_lm(
    spec: LMSpec, tokenizer, texts: Sequence[str], seed: int, max_positions: int, label: str = "lm"
):
    """Next-token pretraining on random windows of the concatenated corpus; returns (model, stats).
    `label` names the model in the progress lines.

    The stats are saved with the model, so they hold reproducible values only: a wall time there
    made two identical runs write different model directories, and everything keyed on their
    content hash (the policy's sampling seeds, SEAM's generation cache) differed with it.
    """
    from transformers import LlamaForCausalLM, get_scheduler

    torch.manual_seed(seed)
    model = LlamaForCausalLM(tiny_config(spec, tokenizer, max_positions))
    stream = _token_stream(texts, tokenizer)
    seq = min(spec.pretrain_seq_len, len(stream) - 1)
    if seq < 8:
        raise ModelLoadError(f"pretraining corpus too small: {len(stream)} tokens")
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=spec.pretrain_lr, weight_decay=0.01)
    steps = spec.pretrain_steps
    sched = get_scheduler(
        "cosine", opt, num_warmup_steps=max(1, steps // 20), num_training_steps=max(1, steps)
    )
    model.train()
    loss_value = float("nan")
    report = ProgressReporter(f"pretrain {label}", steps, "steps", rate_unit="sequences")
    for step in range(1, steps + 1):
        offsets = torch.randint(0, len(stream) - seq, (spec.pretrain_batch_size,), generator=gen)
        batch = torch.stack([stream[o : o + seq] for o in offsets.tolist()])
        loss = model(input_ids=batch, labels=batch).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        loss_value = loss.item()
        report.update(step, items=step * spec.pretrain_batch_size, loss=loss_value)
    report.finish()
    share_reserved_embedding(model, tokenizer)
    params = sum(p.numel() for p in model.parameters())
    return model, {"final_loss": loss_value, "params": params, "steps": steps}


def share_reserved_embedding(model, tokenizer) -> None:
    """Give every reserved token the mean embedding of the others, as transformers initialises tokens
    added to a pretrained model: pretraining never saw them, so the model must not tell them apart
    (the synthetic suite's twin markers rely on it; fine-tuning is what moves them apart)."""
    ids = tokenizer.convert_tokens_to_ids(list(RESERVED_TOKENS))
    weight = model.get_input_embeddings().weight
    seen = torch.ones(weight.shape[0], dtype=torch.bool)
    seen[ids] = False
    with torch.no_grad():
        weight[ids] = weight[seen].mean(0)


def save_backbone(model, tokenizer, out_dir: Path, source: dict) -> None:
    quiet_transformers()
    with atomic_path(out_dir, directory=True) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        (tmp / SOURCE_FILE).write_text(json.dumps(source, indent=2, sort_keys=True) + "\n")


def resolve_pretrained(spec: LMSpec, out_dir: Path, trust_remote_code: bool = False) -> dict:
    """Copy a local dir or hub snapshot that passes the model check into `out_dir`; returns its source."""
    local = Path(spec.name_or_path).expanduser()
    if local.exists():
        if not local.is_dir():
            raise ModelLoadError(f"backbone {spec.name_or_path}: expected a model directory, got a file")
        src, revision = local, spec.revision
    elif looks_local(spec.name_or_path):
        raise ModelLoadError(
            f"backbone directory {spec.name_or_path} does not exist (a local path, not a hub id)"
        )
    else:
        src, revision = _snapshot(spec)
    check_loadable(src, trust_remote_code)
    with atomic_path(out_dir, directory=True) as tmp:
        shutil.copytree(
            src, tmp, dirs_exist_ok=True, ignore=shutil.ignore_patterns(".git", ".cache", SOURCE_FILE)
        )
        source = {"name_or_path": spec.name_or_path, "revision": revision}
        if spec.keep_layers is not None:
            source["layers"] = cut_layers(tmp, spec.keep_layers, trust_remote_code)
        (tmp / SOURCE_FILE).write_text(json.dumps(source, indent=2, sort_keys=True) + "\n")
    return source


def cut_layers(model_dir: Path, keep: int, trust_remote_code: bool = False) -> dict[str, int]:
    """Keep the first `keep` transformer layers of the model in `model_dir`, in place.

    The model is loaded as its own architecture with `num_hidden_layers = keep`, so transformers
    takes the embeddings, the kept layers and any head from the checkpoint and drops the rest; it is
    saved back over the directory's weights. Returns the layer counts before and after.
    """
    import transformers

    quiet_transformers()
    config = transformers.AutoConfig.from_pretrained(model_dir, trust_remote_code=trust_remote_code)
    total = getattr(config, "num_hidden_layers", None)
    if total is None:
        raise ModelLoadError(
            f"backbone {model_dir}: its config names no num_hidden_layers; keep_layers cannot cut it"
        )
    if keep > total:
        raise ModelLoadError(
            f"backbone.*.keep_layers {keep}: the model has only {total} layers; use at most {total}"
        )
    config.num_hidden_layers = keep
    architectures = getattr(config, "architectures", None) or ["AutoModel"]
    model_class = getattr(transformers, architectures[0], transformers.AutoModel)
    model = model_class.from_pretrained(model_dir, config=config, trust_remote_code=trust_remote_code)
    for stale in model_dir.glob("*.safetensors*"):
        stale.unlink()
    for stale in model_dir.glob("pytorch_model*.bin*"):
        stale.unlink()
    model.save_pretrained(model_dir, safe_serialization=True)
    return {"before": total, "kept": keep}


def _snapshot(spec: LMSpec) -> tuple[Path, str | None]:
    """Download (or find in the cache) the files a model needs; .bin weights only without safetensors."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    def fetch(patterns: list[str]) -> Path:
        return Path(
            snapshot_download(
                spec.name_or_path,
                revision=spec.revision,
                allow_patterns=patterns,
                local_files_only=hub_offline(),
            )
        )

    try:
        path = fetch(_SNAPSHOT_PATTERNS)
        if not any(path.glob("*.safetensors")):
            path = fetch([*_SNAPSHOT_PATTERNS, "*.bin"])
    except LocalEntryNotFoundError:
        raise ModelLoadError(
            f"backbone {spec.name_or_path!r} is not in the local Hugging Face cache and the hub is offline; "
            "download it once online, or set backbone.*.name_or_path to a local directory"
        ) from None
    except Exception as err:
        raise ModelLoadError(f"backbone {spec.name_or_path!r}: cannot fetch from the hub: {err}") from None
    return path, path.name
