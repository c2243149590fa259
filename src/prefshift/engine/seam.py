"""SEAM weak labels: the strong LM proposes principles, the weak teacher judges under each, confidence picks.

SEAM (OpenReview jF4rnVgWlN) has no public code; every choice below is ours and
named here so the README and the report can state it.

1. Principles come from the strong backbone used as a causal LM, once per unique
   (category, context). The context is the final user turn (`seam.principle_context:
   request`, the default: principles judge how a request should be answered, and
   the embedded default has ~200 requests behind ~1,800 dialogues) or the whole
   `conversation`. The responses are never shown, so a principle cannot favour one
   side by quoting it. Greedy decoding, `seam.max_new_tokens`, batches of
   `seam.generation_batch_size` prompts, left padding. The prompt is `TEMPLATE`
   (through the tokenizer's chat template when it has one, else plain text) over
   the most recent `seam.max_context_tokens` tokens of the context.
2. The paper's "principle tree" is flattened to an ordered list of at most
   `seam.max_principles` yes/no questions; we do not branch on the answers.
3. Parsing keeps lines that, after stripping list markers, start with a yes/no
   auxiliary ("Does", "Is", ...), end with '?' and have 3-40 words; duplicates
   (case-insensitive) are dropped. A generation with no such line falls back to
   `DEFAULT_PRINCIPLES[category]`; the fallback is counted and flagged per pair.
4. The teacher judges the pair with the principle as a preamble (`PREAMBLE`) of
   the last user turn (`seam.principle_position: last_user`, the default, which
   left truncation of long prompts cannot cut off) or as a leading system turn
   (`system`). Node label q_j = σ(Δ_j / label.temperature), as in `label`.
5. Nodes: the principles, plus the plain (unconditioned) judgement when
   `seam.include_plain`. Selection keeps the `seam.keep_top_k` nodes with the
   largest |q_j − 0.5| (ties: plain first, then principle order). Aggregation is
   the weighted mean of the kept q_j with weight |2q_j − 1| (`confidence`) or
   1 − H₂(q_j) in bits (`entropy`); all-zero weights give 0.5.
6. Generations are cached by a hash of (strong model content hash, template
   version, rendered prompt, max_new_tokens); the cache file keeps exactly the
   entries the last run used, so it stays small and identical for identical inputs.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from prefshift.config.params import Params, SeamConfig
from prefshift.core.atomic import atomic_path
from prefshift.core.progress import ProgressReporter
from prefshift.data.schema import Pair, SchemaError, content_hash

TEMPLATE_VERSION = "seam-v1"
TEMPLATE = (
    "Here is a conversation between a user and an AI assistant.\n\n{conversation}\n\n"
    "Write {n} short yes/no questions that a careful judge should ask to decide whether the "
    "assistant's next reply is {goal}. One question per line, numbered.\nQuestions:\n"
)
GOALS = {"helpful": "helpful", "harmless": "harmless (safe and ethical)"}
PREAMBLE = "Judge the reply by this principle: {principle}\n\n"
DEFAULT_PRINCIPLES = {
    "helpful": (
        "Does the response directly address what the user asked?",
        "Is the response specific and accurate about the user's situation?",
        "Does the response give concrete steps the user can follow?",
        "Is the response free of off-topic or evasive content?",
    ),
    "harmless": (
        "Does the response avoid helping with dangerous or illegal actions?",
        "Does the response decline unsafe requests without insulting the user?",
        "Is the response free of hateful, harassing or demeaning language?",
        "Does the response point the user to a safe alternative when it declines?",
    ),
}
_MARKER = re.compile(r"^\s*(?:[-*•]+|\(?\d{1,2}[.):]|q\d*[.:)])\s*", re.IGNORECASE)
_YES_NO = re.compile(
    r"^(?:does|do|did|is|are|was|were|can|could|will|would|should|has|have|had|may|might|must)\b",
    re.IGNORECASE,
)
CACHE_SCHEMA = pa.schema([("key", pa.string()), ("text", pa.string())])


class SeamError(SchemaError):
    """A SEAM input (generation cache, model output) that cannot be used as it is."""


def parse_principles(text: str, max_principles: int) -> list[str]:
    """Yes/no principle questions found in one generation, deduplicated, in order, capped."""
    found: list[str] = []
    seen: set[str] = set()
    for line in text.splitlines():
        question = " ".join(_MARKER.sub("", line).strip().strip("*\"'").split())
        words = len(question.split())
        if not (question.endswith("?") and _YES_NO.match(question) and 3 <= words <= 40):
            continue
        if question.lower() not in seen:
            seen.add(question.lower())
            found.append(question)
        if len(found) == max_principles:
            break
    return found


def principles_for(text: str, category: str, max_principles: int) -> tuple[list[str], bool]:
    """(principles, fallback): the parsed generation, or the category's defaults when nothing parses."""
    parsed = parse_principles(text, max_principles)
    if parsed:
        return parsed, False
    return list(DEFAULT_PRINCIPLES[category][:max_principles]), True


def generation_context(pair: Pair, context: str) -> list[dict[str, str]]:
    """What the strong LM is shown: the final user turn (`request`) or the whole `conversation`."""
    if context == "conversation":
        return pair.prompt
    return [next(m for m in reversed(pair.prompt) if m["role"] == "user")]


def conversation_text(prompt: Sequence[dict[str, str]]) -> str:
    return "\n".join(f"{m['role'].capitalize()}: {m['content']}" for m in prompt)


def condition(pair: Pair, principle: str, position: str, node: int) -> Pair:
    """The pair as the teacher sees it under one principle; pair_id gets a `#node` suffix."""
    preamble = PREAMBLE.format(principle=principle)
    prompt = [dict(m) for m in pair.prompt]
    if position == "system":
        if prompt[0]["role"] == "system":
            prompt[0]["content"] = preamble + prompt[0]["content"]
        else:
            prompt.insert(0, {"role": "system", "content": preamble.rstrip()})
    else:
        last = max(i for i, m in enumerate(prompt) if m["role"] == "user")
        prompt[last]["content"] = preamble + prompt[last]["content"]
    return replace(pair, pair_id=f"{pair.pair_id}#{node}", prompt=prompt)


class GenerationCache:
    """Raw generations by key; `save` keeps only the entries looked up since `load`."""

    def __init__(self, entries: dict[str, str]):
        self.entries = entries
        self.used: dict[str, str] = {}

    @classmethod
    def load(cls, path: Path) -> GenerationCache:
        if not path.exists():
            return cls({})
        table = pq.read_table(path)
        if table.column_names != CACHE_SCHEMA.names:
            raise SeamError(
                f"{path}: generation cache needs columns {CACHE_SCHEMA.names}, got {table.column_names}"
            )
        return cls(dict(zip(table.column("key").to_pylist(), table.column("text").to_pylist(), strict=True)))

    def get(self, key: str) -> str | None:
        text = self.entries.get(key)
        if text is not None:
            self.used[key] = text
        return text

    def put(self, key: str, text: str) -> None:
        self.entries[key] = self.used[key] = text

    def save(self, path: Path) -> None:
        keys = sorted(self.used)
        table = pa.table({"key": keys, "text": [self.used[k] for k in keys]}, schema=CACHE_SCHEMA)
        with atomic_path(path) as tmp:
            pq.write_table(table, tmp)


class PrincipleGenerator:
    """The strong backbone as a causal LM: prompt rendering, and batched greedy generation.

    Rendering needs only the tokenizer and config; the weights load on the first
    `generate`, so a run served entirely from the cache never loads them.
    """

    def __init__(self, model_dir: Path, cfg: SeamConfig, trust_remote_code: bool = False):
        from transformers import AutoConfig, AutoTokenizer

        from prefshift.models.reward import check_source, ensure_pad_token, quiet_transformers

        check_source(model_dir)
        quiet_transformers()
        self.model_dir, self.cfg, self.trust_remote_code = Path(model_dir), cfg, trust_remote_code
        self.tokenizer = AutoTokenizer.from_pretrained(str(model_dir), trust_remote_code=trust_remote_code)
        self.tokenizer.padding_side = "left"
        ensure_pad_token(self.tokenizer)
        config = AutoConfig.from_pretrained(str(model_dir), trust_remote_code=trust_remote_code)
        self.max_positions = getattr(config.get_text_config(), "max_position_embeddings", None) or 1 << 20
        self.model = None
        self.calls = 0

    def _load(self):
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(
            str(self.model_dir), trust_remote_code=self.trust_remote_code
        )
        model.config.pad_token_id = self.tokenizer.pad_token_id
        return model.to("cuda" if torch.cuda.is_available() else "cpu").eval()

    def _ids(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def render(self, category: str, prompt: Sequence[dict[str, str]]) -> str:
        """The full generation prompt, with the conversation cut to the most recent tokens that fit."""
        frame = TEMPLATE.format(conversation="", n=self.cfg.max_principles, goal=GOALS[category])
        limit = self.max_positions
        budget = min(self.cfg.max_context_tokens, limit - self.cfg.max_new_tokens - len(self._ids(frame)) - 8)
        if budget < 8:
            raise SeamError(
                f"seam.max_new_tokens={self.cfg.max_new_tokens} leaves no room for the conversation in the "
                f"strong model's {limit} positions"
            )
        conversation = self.tokenizer.decode(self._ids(conversation_text(prompt))[-budget:])
        text = TEMPLATE.format(conversation=conversation, n=self.cfg.max_principles, goal=GOALS[category])
        if getattr(self.tokenizer, "chat_template", None):
            return self.tokenizer.apply_chat_template(
                [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
            )
        return text

    def _input_ids(self, text: str) -> list[int]:
        bos = self.tokenizer.bos_token_id
        add_bos = bos is not None and not getattr(self.tokenizer, "chat_template", None)
        return ([bos] if add_bos else []) + self._ids(text)

    def generate(self, texts: Sequence[str]) -> list[str]:
        """Greedy continuations (new tokens only, special tokens dropped), in the order given."""
        from transformers import GenerationConfig

        self.model = self.model or self._load()
        settings = GenerationConfig(
            max_new_tokens=self.cfg.max_new_tokens,
            do_sample=False,
            pad_token_id=self.tokenizer.pad_token_id,
            eos_token_id=self.tokenizer.eos_token_id,
        )
        encoded = [self._input_ids(t) for t in texts]
        order = sorted(range(len(texts)), key=lambda i: -len(encoded[i]))
        out: list[str] = [""] * len(texts)
        device = next(self.model.parameters()).device
        size = self.cfg.generation_batch_size
        with torch.inference_mode(), ProgressReporter("seam principles", len(order), "prompts") as report:
            for start in range(0, len(order), size):
                idx = order[start : start + size]
                batch = self.tokenizer.pad({"input_ids": [encoded[i] for i in idx]}, return_tensors="pt")
                result = self.model.generate(
                    input_ids=batch["input_ids"].to(device),
                    attention_mask=batch["attention_mask"].to(device),
                    generation_config=settings,
                )
                self.calls += 1
                width = batch["input_ids"].shape[1]
                for i, row in zip(idx, result[:, width:], strict=True):
                    out[i] = self.tokenizer.decode(row, skip_special_tokens=True)
                report.update(start + len(idx))
        return out


@dataclass
class Principles:
    """Per-pair principle lists and where they came from."""

    by_pair: dict[str, list[str]]
    fallback: dict[str, bool]
    counts: dict[str, int]
    examples: list[dict]


def propose(
    pairs: Sequence[Pair],
    cache: GenerationCache,
    model_key: str,
    cfg: SeamConfig,
    generator: PrincipleGenerator,
) -> Principles:
    """Principles for every pair, generating only for prompts the cache lacks (the LM loads only then)."""
    prompts: dict[str, tuple[str, list[dict[str, str]]]] = {}
    units = {}
    for pair in pairs:
        context = generation_context(pair, cfg.principle_context)
        units[pair.pair_id] = content_hash(pair.category, context)
        prompts.setdefault(units[pair.pair_id], (pair.category, context))
    texts: dict[str, str] = {}
    missing: dict[str, tuple[str, str]] = {}
    for pid, (category, prompt) in prompts.items():
        rendered = generator.render(category, prompt)
        key = content_hash(model_key, TEMPLATE_VERSION, rendered, cfg.max_new_tokens)
        cached = cache.get(key)
        if cached is None:
            missing[pid] = (key, rendered)
        else:
            texts[pid] = cached
    generated = generator.generate([rendered for _, rendered in missing.values()]) if missing else []
    for (pid, (key, _)), text in zip(missing.items(), generated, strict=True):
        cache.put(key, text)
        texts[pid] = text
    parsed = {pid: principles_for(texts[pid], prompts[pid][0], cfg.max_principles) for pid in prompts}
    by_pair, fallback = {}, {}
    for pair in pairs:
        pid = units[pair.pair_id]
        by_pair[pair.pair_id], fallback[pair.pair_id] = parsed[pid]
    fell_back = sum(flag for _, flag in parsed.values())
    counts = {
        "prompts": len(prompts),
        "generated": len(missing),
        "generate_calls": generator.calls,
        "cache_hits": len(prompts) - len(missing),
        "parsed_ok": len(prompts) - fell_back,
        "fallback": fell_back,
        "pairs_fallback": sum(fallback.values()),
    }
    examples = [
        {"generation": texts[pid][:300], "principles": parsed[pid][0], "fallback": parsed[pid][1]}
        for pid in list(prompts)[:3]
    ]
    return Principles(by_pair, fallback, counts, examples)


def node_weights(q: np.ndarray, weighting: str) -> np.ndarray:
    """Information of a node's judgement: |2q − 1| (`confidence`) or 1 − H₂(q) in bits (`entropy`)."""
    if weighting == "confidence":
        return np.abs(2.0 * q - 1.0)
    p = np.clip(q, 1e-12, 1.0 - 1e-12)
    return 1.0 + p * np.log2(p) + (1.0 - p) * np.log2(1.0 - p)


def aggregate(node_q: np.ndarray, keep_top_k: int, weighting: str) -> tuple[np.ndarray, np.ndarray]:
    """(q, nodes kept) per row of a (pairs × nodes) matrix; NaN marks a node a pair lacks.

    Rows with no node at all get q = NaN, so the caller decides (and counts) what to use.
    """
    present = ~np.isnan(node_q)
    confidence = np.where(present, np.abs(node_q - 0.5), -1.0)
    rank = np.argsort(np.argsort(-confidence, axis=1, kind="stable"), axis=1, kind="stable")
    kept = present & (rank < keep_top_k)
    values = np.where(kept, node_q, 0.0)
    weights = np.where(kept, node_weights(values, weighting), 0.0)
    total = weights.sum(axis=1)
    mean = np.divide((weights * values).sum(axis=1), total, out=np.full(len(values), 0.5), where=total > 0)
    n_kept = kept.sum(axis=1)
    return np.where(n_kept > 0, mean, math.nan), n_kept


def node_pairs(pairs: Sequence[Pair], principles: dict[str, list[str]], params: Params) -> list[Pair]:
    """Every (pair, principle) node as a conditioned pair; node j ≥ 1 is the j-th principle."""
    position = params.seam.principle_position
    return [
        condition(pair, principle, position, j)
        for pair in pairs
        for j, principle in enumerate(principles[pair.pair_id], start=1)
    ]


def node_matrix(
    pairs: Sequence[Pair], plain: dict[str, float], nodes: dict[str, float], n_nodes: int, include_plain: bool
) -> np.ndarray:
    """(pairs × nodes) q matrix: column 0 the plain judgement (NaN unless included), then principles."""
    matrix = np.full((len(pairs), n_nodes + 1), math.nan)
    for row, pair in enumerate(pairs):
        if include_plain:
            matrix[row, 0] = plain[pair.pair_id]
        for j in range(1, n_nodes + 1):
            matrix[row, j] = nodes.get(f"{pair.pair_id}#{j}", math.nan)
    return matrix
