"""What every benchmark shares: the workload, isolated runs, interleaving and summaries."""

from __future__ import annotations

import contextlib
import multiprocessing
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any

from prefshift.config.params import EncodeConfig, LMSpec, SyntheticConfig
from prefshift.core.errors import PrefshiftError

PRELOAD = [
    "torch",
    "transformers",
    "transformers.optimization",
    "accelerate",
    "datasets",
    "peft",
    "trl",
    "prefshift.engine.train",
    "prefshift.engine.scoring",
]
"""Imported once by the fork server (a missing one, e.g. trl, is skipped), not by every run."""
MODELS = {
    "tiny_2x64": LMSpec(hidden_size=64, num_layers=2, num_heads=2, intermediate_size=128),
    "small_4x256": LMSpec(hidden_size=256, num_layers=4, num_heads=4, intermediate_size=512),
}
SOURCE = "syn_help_forum"


class BenchError(PrefshiftError):
    """A benchmark that could not run (a failed child process names its variant)."""


@dataclass(frozen=True)
class Workload:
    """The data every variant of one comparison sees: same pairs, same encoding, same batches."""

    pairs: int
    max_length: int = 128
    batch_size: int = 8
    vocab_size: int = 600
    seed: int = 0
    source: Path | None = None
    """A file of HH-style pairs (`chosen`/`rejected` transcripts, `file_pairs`); None: synthetic pairs."""


def versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in ("torch", "transformers", "accelerate", "trl", "peft", "dvc", "prefshift"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def machine() -> dict[str, Any]:
    import os

    from prefshift.core.host import cpu_model

    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "load_avg_1_5_15": list(load) if load else None,
    }


@cache
def tokenizer_dir(root: Path, vocab_size: int) -> Path:
    """A byte-level BPE tokenizer trained on the synthetic corpus, saved once per bench run."""
    from prefshift.data.synthetic import generate_corpus
    from prefshift.models.backbone import train_tokenizer

    out = root / f"tokenizer-{vocab_size}"
    if not out.exists():
        tok = train_tokenizer(generate_corpus(SyntheticConfig(corpus_docs=600)), vocab_size)
        tok.save_pretrained(out)
    return out


def is_model_dir(model: str | Path) -> bool:
    """Whether a benchmark's model is a local Hugging Face directory rather than a `MODELS` name."""
    return str(model) not in MODELS and (Path(model) / "config.json").is_file()


def model_label(model: str | Path) -> str:
    """The name a model's rows carry: a `MODELS` name, or a model directory's own name."""
    return Path(model).name if is_model_dir(model) else str(model)


def load_tokenizer(path: Path):
    """The bench's trained tokenizer, or a model directory's own (as `load_reward_model` loads it)."""
    if is_model_dir(path):
        from transformers import AutoTokenizer

        from prefshift.data.encode import clear_backend_limits
        from prefshift.models.reward import ensure_pad_token, quiet_transformers

        quiet_transformers()
        tokenizer = AutoTokenizer.from_pretrained(str(path))
        clear_backend_limits(tokenizer)  # MiniLM's tokenizer.json cuts at 128; the Encoder cuts
        ensure_pad_token(tokenizer)
        return tokenizer
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(str(path))


def synthetic_pairs(n: int, split: str = "train"):
    """`n` validated pairs of the embedded default's source dataset."""
    from prefshift.data.schema import make_pair
    from prefshift.data.synthetic import generate_pairs

    cfg = SyntheticConfig(train_pairs=max(n, 10), test_pairs=max(n, 10))
    rows = generate_pairs(SOURCE, split, cfg)[:n]
    return [
        make_pair(
            dataset=SOURCE,
            category="helpful",
            prompt=r["prompt"],
            chosen=r["chosen"],
            rejected=r["rejected"],
            gold=r.get("gold", 1.0),
            where=f"synthetic {split} row {i}",
        )
        for i, r in enumerate(rows)
    ]


def file_pairs(path: Path, n: int):
    """The first `n` pairs of a file of HH-style rows (`chosen` and `rejected` whole transcripts,
    as Anthropic HH-RLHF's `.jsonl.gz`); rows that make no pair (differing prompts) are passed over."""
    from prefshift.data.adapters.base import read_records
    from prefshift.data.adapters.hh_rlhf import transcripts_to_pair
    from prefshift.data.schema import RowError

    out = []
    for where, row in read_records(path, ("chosen", "rejected")):
        if len(out) == n:
            break
        try:
            out.append(transcripts_to_pair(path.name, "helpful", row["chosen"], row["rejected"], where))
        except RowError:
            continue
    if len(out) < n:
        raise BenchError(f"{path}: {len(out)} usable pairs, the benchmark asks for {n}")
    return out


def encoded_items(tokenizer, work: Workload, split: str = "train"):
    from prefshift.data.encode import Encoder

    pairs = file_pairs(work.source, work.pairs) if work.source else synthetic_pairs(work.pairs, split)
    return Encoder(tokenizer, EncodeConfig(max_length=work.max_length)).encode_pairs(pairs)


def hf_reward_model(spec: LMSpec, tokenizer, max_length: int, seed: int):
    """A freshly initialised Llama-style sequence classifier, dropout off, pad id set."""
    import torch
    from transformers import LlamaForSequenceClassification

    from prefshift.models.backbone import tiny_config
    from prefshift.models.reward import disable_dropout, ensure_pad_token

    torch.manual_seed(seed)
    config = tiny_config(spec, tokenizer, max_length)
    config.num_labels = 1
    model = LlamaForSequenceClassification(config)
    disable_dropout(model)
    ensure_pad_token(tokenizer, model)
    return model


def reward_classifier(model: str, tokenizer, max_length: int, seed: int):
    """The classifier a benchmark trains: a fresh Llama-style one for a `MODELS` name, else the
    pretrained local directory `model` with a fresh head seeded by `seed` (`load_reward_model`:
    dropout off, the tokenizer's pad id set), as a real run's train stage loads it."""
    if not is_model_dir(model):
        return hf_reward_model(MODELS[model], tokenizer, max_length, seed)
    from prefshift.models.reward import ensure_pad_token, load_reward_model

    hf = load_reward_model(model, seed=seed)[0].hf
    ensure_pad_token(tokenizer, hf)
    return hf


def padding_efficiency(batches: Sequence[Sequence[int]], lengths: Sequence[int], width: int | None) -> float:
    """Real tokens / computed tokens over `batches` (1.0 = no padding waste)."""
    real = sum(lengths[i] for b in batches for i in b)
    computed = sum(len(b) * (width or max(lengths[i] for i in b)) for b in batches)
    return real / computed


# --- isolated runs -------------------------------------------------------------------------


def _vm_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def reset_peak() -> int:
    """Reset this process's peak RSS (Linux clear_refs 5) and return its current RSS in KiB."""
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")
    return _vm_kb("VmRSS")


def peak_rss_kb() -> int:
    import resource

    hwm = _vm_kb("VmHWM")
    return hwm or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


_threads = {"n": 1}


def set_threads(n: int) -> None:
    """Intra-op threads for this process and every isolated run started after this call.

    On a shared 2-core machine two OpenMP threads spin against other processes and a
    step can take 30x longer than with one; one thread measures the work, not the contention.
    """
    import torch

    _threads["n"] = n
    torch.set_num_threads(n)


def _child(fn: Callable[..., dict], args: tuple, threads: int, conn) -> None:
    try:
        import torch

        torch.set_num_threads(threads)
        conn.send(("ok", fn(*args)))
    except BaseException as err:  # reported to the parent, which raises with the variant's name
        conn.send(("error", f"{type(err).__name__}: {err}"))
    finally:
        conn.close()


@cache
def _context():
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx


def isolated(fn: Callable[..., dict], *args: Any, label: str = "") -> dict:
    """Run `fn(*args)` in a fresh process (torch already imported) and return its dict."""
    ctx = _context()
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(fn, args, _threads["n"], child))
    proc.start()
    child.close()
    try:
        status, payload = parent.recv()
    except EOFError:
        status, payload = "error", "the process died without a result"
    proc.join()
    if status != "ok":
        raise BenchError(f"benchmark variant {label or fn.__name__} failed: {payload}")
    return payload


# --- interleaving and summaries ----------------------------------------------------------------


_rounds = {"first": 0}


def number_rounds_from(first: int) -> None:
    """Count this process's timed rounds from `first`, so that a later invocation of the bench
    continues the alternation of `interleave` where the earlier one stopped."""
    _rounds["first"] = first


def interleave(
    variants: dict[str, Callable[[], dict]], reps: int, warmup: int = 1, log: Callable[[str], None] = print
) -> dict[str, list[dict]]:
    """`warmup` discarded rounds, then `reps` timed rounds; results per variant.

    Even rounds run the variants in order (A B C), odd rounds in reverse (C B A). In a fixed
    order one variant always runs straight after another, and that slot alone moved a ratio:
    anchor_shared ÷ naive on tiny_2x64 read 1.07x with naive run first and 1.03x with it
    second. Alternating puts every pair both ways round equally often over an even number of
    rounds (`number_rounds_from` carries the count across invocations).
    """
    results: dict[str, list[dict]] = {name: [] for name in variants}
    forward = list(variants.items())
    for round_ in range(warmup + reps):
        timed = round_ >= warmup
        number = _rounds["first"] + round_ - warmup
        for name, run in forward if number % 2 == 0 else forward[::-1]:
            start = time.perf_counter()
            out = run()
            tag = f"rep {round_ - warmup + 1}/{reps}" if timed else "warm-up"
            log(f"  {name:<24} {tag:<10} {time.perf_counter() - start:6.2f} s")
            if timed:
                results[name].append(out)
    return results


def summary(values: Sequence[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def ratio(a: Sequence[float], b: Sequence[float], higher_is_better: bool = True) -> dict[str, float]:
    """median(a) / median(b), the min–max of the per-round ratios (rounds were interleaved), and
    the ratio of the best runs (under machine load, the least disturbed run of each variant)."""
    per_round = [x / y for x, y in zip(a, b, strict=True)]
    best = max if higher_is_better else min
    return {
        "ratio": statistics.median(a) / statistics.median(b),
        "best_runs": best(a) / best(b),
        "round_min": min(per_round),
        "round_max": max(per_round),
    }
