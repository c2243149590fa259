"""Sampling completions from a policy LM for best-of-n, reproducibly and batch-independently.

Every (prompt, sample) row gets its own seeded `torch.Generator`; a logits processor
adds Gumbel noise from that generator to the temperature- and top-p-warped logits and
`generate` decodes greedily, so each row is an exact draw from the warped softmax
(Gumbel-max) and depends on its own seed only, not on which prompts share its batch
or on the global torch RNG. The prompt is rendered exactly as the reward models read
it (`encode.render`), so the proxy, the judge and the policy see one transcript.

Completions are cached per prompt by a hash of (policy content hash, sampler version,
rendered prompt, sampling settings, n_max, seed), reusing SEAM's `GenerationCache`:
retraining a reward model, or adding prompts, never regenerates what exists.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import torch

from prefshift.config.params import DownstreamConfig
from prefshift.core.errors import PrefshiftError
from prefshift.core.progress import ProgressReporter
from prefshift.data.encode import render
from prefshift.data.schema import content_hash
from prefshift.engine.seam import GenerationCache

SAMPLER_VERSION = "policy-v1"
NOISE_PER_ROW = 1 << 16


class PolicyError(PrefshiftError):
    """A policy LM that cannot be loaded, or a generation cache entry that cannot be read."""


def row_seed(seed: int, prompt_key: str, sample: int) -> int:
    return int(content_hash(seed, prompt_key, sample), 16) % (1 << 63)


class _RowGumbel:
    """Logits processor: warp, then add Gumbel noise drawn from each row's own generator.

    Noise is drawn per row for a block of steps at once (one generator call per row per block,
    not per step); the block depends on the vocabulary only, never on the batch, and holds at
    most `NOISE_PER_ROW` values, so a 150k-token vocabulary draws one step at a time.
    """

    def __init__(self, generators: Sequence[torch.Generator], warpers: Sequence):
        self.generators, self.warpers = generators, warpers
        self.step, self.noise = 0, torch.empty(0)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        for warp in self.warpers:
            scores = warp(input_ids, scores)
        vocab = scores.shape[1]
        block = max(1, NOISE_PER_ROW // vocab)
        if self.step % block == 0:
            draws = [torch.empty(block, vocab).exponential_(generator=g) for g in self.generators]
            # An exponential draw of exactly 0 would give +inf noise, and NaN on a masked (-inf) token.
            self.noise = -torch.log(torch.stack(draws).clamp_min(torch.finfo(torch.float32).tiny))
        noise = self.noise[:, self.step % block].to(scores.device)
        self.step += 1
        return scores.float() + noise


class PolicySampler:
    """A causal LM that samples n_max completions per prompt; weights load on the first `sample`."""

    def __init__(self, name_or_path: str | Path, cfg: DownstreamConfig, trust_remote_code: bool = False):
        from transformers import AutoTokenizer

        from prefshift.models.reward import check_source, ensure_pad_token, hub_offline, quiet_transformers

        check_source(name_or_path)
        quiet_transformers()
        self.name, self.cfg, self.trust_remote_code = str(name_or_path), cfg, trust_remote_code
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(
                self.name, revision=cfg.policy_revision, trust_remote_code=trust_remote_code
            )
        except OSError as err:
            hint = " (HF_HUB_OFFLINE is set and no local copy exists)" if hub_offline() else ""
            raise PolicyError(f"cannot load policy LM {self.name}{hint}: {err}") from None
        self.tokenizer.padding_side = "left"
        ensure_pad_token(self.tokenizer)
        self.model = None

    def _load(self):
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(
            self.name, revision=self.cfg.policy_revision, trust_remote_code=self.trust_remote_code
        )
        model.config.pad_token_id = self.tokenizer.pad_token_id
        return model.to("cuda" if torch.cuda.is_available() else "cpu").eval()

    def render(self, prompt: Sequence[dict[str, str]]) -> str:
        return render(self.tokenizer, prompt, "")[0]

    def _input_ids(self, text: str) -> list[int]:
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        bos = self.tokenizer.bos_token_id
        add_bos = bos is not None and not getattr(self.tokenizer, "chat_template", None)
        return ([bos] if add_bos else []) + ids

    def sample(self, texts: Sequence[str], keys: Sequence[str], seed: int) -> list[list[str]]:
        """n_max completions per rendered prompt (new tokens only, special tokens dropped)."""
        from transformers import (
            GenerationConfig,
            LogitsProcessorList,
            TemperatureLogitsWarper,
            TopPLogitsWarper,
        )

        self.model = self.model or self._load()
        cfg, n = self.cfg, self.cfg.n_max
        warpers = [TemperatureLogitsWarper(cfg.temperature)] + (
            [TopPLogitsWarper(cfg.top_p)] if cfg.top_p < 1 else []
        )
        settings = GenerationConfig(
            max_new_tokens=cfg.max_new_tokens,
            min_new_tokens=1,
            # Set explicitly: unset fields are filled from the model's own generation_config
            # (instruct models ship do_sample, repetition penalties...), which would change the policy.
            do_sample=False,
            repetition_penalty=1.0,
            no_repeat_ngram_size=0,
            pad_token_id=self.tokenizer.pad_token_id,
            eos_token_id=self.tokenizer.eos_token_id,
        )
        device = next(self.model.parameters()).device
        out: list[list[str]] = []
        with torch.inference_mode(), ProgressReporter("policy samples", len(texts), "prompts") as report:
            for start in range(0, len(texts), cfg.generation_batch_size):
                chunk = range(start, min(len(texts), start + cfg.generation_batch_size))
                rows = [self._input_ids(texts[i]) for i in chunk for _ in range(n)]
                generators = [
                    torch.Generator().manual_seed(row_seed(seed, keys[i], j)) for i in chunk for j in range(n)
                ]
                batch = self.tokenizer.pad({"input_ids": rows}, return_tensors="pt")
                result = self.model.generate(
                    input_ids=batch["input_ids"].to(device),
                    attention_mask=batch["attention_mask"].to(device),
                    generation_config=settings,
                    logits_processor=LogitsProcessorList([_RowGumbel(generators, warpers)]),
                )
                width = batch["input_ids"].shape[1]
                decoded = [
                    self.tokenizer.decode(r, skip_special_tokens=True).strip() for r in result[:, width:]
                ]
                out += [decoded[k * n : (k + 1) * n] for k in range(len(chunk))]
                report.update(len(out))
        return out


def cache_key(model_key: str, rendered: str, cfg: DownstreamConfig, seed: int) -> str:
    settings = (cfg.max_new_tokens, cfg.temperature, cfg.top_p, cfg.n_max)
    return content_hash(model_key, SAMPLER_VERSION, rendered, settings, seed)


def sample_all(
    sampler: PolicySampler,
    prompts: Sequence[Sequence[dict[str, str]]],
    model_key: str,
    cache: GenerationCache,
    seed: int,
) -> tuple[list[list[str]], int]:
    """(n_max completions per prompt, how many prompts were generated rather than read from the cache)."""
    rendered = [sampler.render(p) for p in prompts]
    keys = [cache_key(model_key, text, sampler.cfg, seed) for text in rendered]
    found: dict[int, list[str]] = {}
    for i, key in enumerate(keys):
        text = cache.get(key)
        if text is not None:
            found[i] = json.loads(text)
            if not isinstance(found[i], list) or len(found[i]) != sampler.cfg.n_max:
                raise PolicyError(f"generation cache entry {key} is not a list of {sampler.cfg.n_max} texts")
    missing = [i for i in range(len(prompts)) if i not in found]
    if missing:
        fresh = sampler.sample([rendered[i] for i in missing], [keys[i] for i in missing], seed)
        for i, texts in zip(missing, fresh, strict=True):
            cache.put(keys[i], json.dumps(texts, ensure_ascii=False))
            found[i] = texts
    return [found[i] for i in range(len(prompts))], len(missing)
