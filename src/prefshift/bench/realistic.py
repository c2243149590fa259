"""Our trainer against TRL's RewardTrainer (at its defaults) on realistic sequence lengths.

Real preference data is far from the near-uniform synthetic lengths: measured on Anthropic
HH harmless with a SmolLM2 tokenizer, whole transcripts have p5 32, p25 74, median 136,
p75 225, p90 344, p95 427, p99 645 tokens, mean 170. Lengths are drawn from the piecewise
linear quantile function through those points (seeded), cut at max_length 512, and each
sequence is filled with token ids drawn from the tokenizer's vocabulary (throughput does
not depend on which ids); the last third of each is the response. Such skew is where
length-grouped batching and dynamic padding pay: TRL's defaults sample batches at random.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np

from prefshift.bench.common import Workload, interleave, isolated, load_tokenizer, ratio, summary
from prefshift.bench.training import run_ours, run_trl, trl_available

QUANTILES = (
    (0.0, 8),
    (0.05, 32),
    (0.25, 74),
    (0.5, 136),
    (0.75, 225),
    (0.9, 344),
    (0.95, 427),
    (0.99, 645),
    (1.0, 1024),
)
"""(probability, tokens): HH harmless transcripts; the 0 and 1 ends are our own bounds."""
MAX_LENGTH = 512
TARGET = 1.3


def draw_lengths(n: int, seed: int = 0) -> list[int]:
    """n lengths from the piecewise linear quantile function through QUANTILES."""
    probs, tokens = zip(*QUANTILES, strict=True)
    u = np.random.default_rng(seed).random(n)
    return [round(float(x)) for x in np.interp(u, probs, tokens)]


def realistic_items(tok_dir: Path, pairs: int, seed: int = 0) -> list:
    """Encoded pairs whose two transcripts have independently drawn realistic lengths."""
    from prefshift.data.encode import EncodedPair, EncodedSeq

    tokenizer = load_tokenizer(tok_dir)
    special = set(tokenizer.all_special_ids)
    vocab = [i for i in range(len(tokenizer)) if i not in special]
    rng = random.Random(seed)
    lengths = draw_lengths(2 * pairs, seed)

    def seq(length: int) -> EncodedSeq:
        kept = min(length, MAX_LENGTH)
        response = max(1, kept // 3)
        ids = [rng.choice(vocab) for _ in range(kept)]
        return EncodedSeq(ids, [0] * (kept - response) + [1] * response, response)

    return [
        EncodedPair(i, f"p{i}", seq(lengths[2 * i]), seq(lengths[2 * i + 1]), rng.random())
        for i in range(pairs)
    ]


def bench_realistic(tok_dir: Path, spec_name: str, pairs: int, reps: int, log: Callable[[str], None]) -> dict:
    """Pairs/s and peak RSS of ours and TRL at its defaults, one epoch, on realistic lengths."""
    skipped = trl_available()
    work = Workload(pairs=pairs, max_length=MAX_LENGTH)
    items = realistic_items(tok_dir, pairs, work.seed)
    items = items[: len(items) - len(items) % work.batch_size]
    steps = len(items) // work.batch_size
    drawn = draw_lengths(2 * pairs, work.seed)
    described = {
        "model": spec_name,
        "pairs": len(items),
        "optimizer_steps": steps,
        "batch_size": work.batch_size,
        "max_length": MAX_LENGTH,
        "drawn_length": {
            "mean": float(np.mean(drawn)),
            **{f"p{round(q * 100)}": float(np.quantile(drawn, q)) for q, _ in QUANTILES[1:-1]},
        },
        "mean_tokens_per_sequence": float(
            np.mean([len(s.input_ids) for it in items for s in (it.chosen, it.rejected)])
        ),
    }
    out: dict = {"trl_skipped": skipped, "workload": described}
    log(f"realistic lengths, {spec_name}")
    variants = {
        "ours": partial(isolated, run_ours, spec_name, work, tok_dir, items, 1, "shipped", label="ours")
    }
    if skipped is None:
        variants["trl_defaults"] = partial(
            isolated, run_trl, spec_name, work, tok_dir, items, steps, "random", label="trl_defaults"
        )
    runs = interleave(variants, reps, warmup=0, log=log)
    rates = {name: [r["pairs_per_s"] for r in rs] for name, rs in runs.items()}
    out["pairs_per_s"] = {name: summary(v) for name, v in rates.items()}
    out["peak_rss_mb"] = {name: summary([r["peak_rss_mb"] for r in rs]) for name, rs in runs.items()}
    if "trl_defaults" in rates:
        vs = ratio(rates["ours"], rates["trl_defaults"])
        out["ours_over_trl"] = vs
        out["target"] = {"ours_over_trl_min": TARGET, "met": vs["ratio"] >= TARGET}
    return out


def render(section: dict) -> list[str]:
    """The markdown section of bench.md."""
    work = section["workload"]
    drawn = work["drawn_length"]
    lines = [
        "## Training on realistic lengths vs TRL defaults",
        "",
        f"{work['model']}, {work['pairs']} pairs, 1 epoch ({work['optimizer_steps']} steps, batch"
        f" {work['batch_size']}), max length {work['max_length']}; lengths drawn to HH harmless"
        f" (drawn mean {drawn['mean']:.0f}, median {drawn['p50']:.0f}, p95 {drawn['p95']:.0f}; after the"
        f" cut {work['mean_tokens_per_sequence']:.0f} tokens per sequence). TRL: RewardTrainer defaults"
        " (random batches, padding to the batch's longest).",
        "",
    ]
    if section.get("trl_skipped"):
        return [*lines, f"TRL comparison skipped: {section['trl_skipped']}", ""]
    lines += ["| variant | pairs/s median (min–max) | peak RSS MB |", "|---|---|---|"]
    for name, rate in section["pairs_per_s"].items():
        lines.append(
            f"| {name} | {rate['median']:.2f} ({rate['min']:.2f}–{rate['max']:.2f})"
            f" | {section['peak_rss_mb'][name]['median']:.0f} |"
        )
    vs = section["ours_over_trl"]
    met = "met" if section["target"]["met"] else "**missed**"
    return [*lines, "", f"ours ÷ TRL defaults: {vs['ratio']:.2f}x; target >= {TARGET}: {met}.", ""]
