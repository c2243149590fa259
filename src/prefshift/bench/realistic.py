"""Our trainer against TRL's RewardTrainer (at its defaults) on realistic sequence lengths.

Real preference data is far from the near-uniform synthetic lengths: measured on Anthropic
HH harmless with a SmolLM2 tokenizer, whole transcripts have p5 32, p25 74, median 136,
p75 225, p90 344, p95 427, p99 645 tokens, mean 170. Lengths are drawn from the piecewise
linear quantile function through those points (seeded), cut at max_length 512, and each
sequence is filled with token ids drawn from the tokenizer's vocabulary (throughput does
not depend on which ids). Such skew is where length-grouped batching and dynamic padding pay:
TRL's defaults sample batches at random.

The two sides of a pair answer one prompt, as in HH (first 1,000 harmless-base test pairs:
median prompt 79, chosen 29, rejected 38 tokens, so the prompt is about 70% of a transcript).
So a pair draws one transcript length L from those quantiles; its prompt is 70% of L, the same
ids on both sides, and each response 30% of L times its own factor in [0.5, 1.5]. Two whole
sequences then cost about 1.54x the tokens of prompt + chosen + rejected, as the same HH pairs
do: the work the shared-prefix forward removes (`tokens_per_pair` in the result).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np

from prefshift.bench.common import Workload, interleave, isolated, load_tokenizer, ratio, summary
from prefshift.bench.training import check_equal_work, ours_variants, run_trl, tokens_per_pair, trl_available

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
TARGETS = {
    "ours_over_trl_min": 1.8,
    "shared_over_two_sequence_min": 1.4,
    "rss_shared_over_two_sequence_max": 1.0,
}
"""Issue 35: the shared-prefix forward ≥ 1.4x our two-sequence loop and ≥ 1.8x TRL's defaults in
pairs/s, at no more peak RSS than the two-sequence loop."""


def draw_lengths(n: int, seed: int = 0) -> list[int]:
    """n lengths from the piecewise linear quantile function through QUANTILES."""
    probs, tokens = zip(*QUANTILES, strict=True)
    u = np.random.default_rng(seed).random(n)
    return [round(float(x)) for x in np.interp(u, probs, tokens)]


PROMPT_SHARE = 0.7
"""HH harmless-base: median prompt 79 of a median transcript of about 79 + 33 tokens."""


def realistic_items(tok_dir: Path, pairs: int, seed: int = 0) -> list:
    """Encoded pairs of realistic transcript lengths whose two sides share their prompt."""
    from prefshift.data.encode import EncodedPair, EncodedSeq

    tokenizer = load_tokenizer(tok_dir)
    special = set(tokenizer.all_special_ids)
    vocab = [i for i in range(len(tokenizer)) if i not in special]
    rng = random.Random(seed)
    lengths = draw_lengths(pairs, seed)

    def pair(i: int) -> EncodedPair:
        responses = [max(1, round((1 - PROMPT_SHARE) * lengths[i] * rng.uniform(0.5, 1.5))) for _ in range(2)]
        responses = [min(r, MAX_LENGTH // 2) for r in responses]
        prompt_len = max(1, min(round(PROMPT_SHARE * lengths[i]), MAX_LENGTH - max(responses)))
        prompt = [rng.choice(vocab) for _ in range(prompt_len)]
        seqs = [
            EncodedSeq(
                prompt + [rng.choice(vocab) for _ in range(response)],
                [0] * prompt_len + [1] * response,
                response,
            )
            for response in responses
        ]
        return EncodedPair(i, f"p{i}", seqs[0], seqs[1], rng.random())

    return [pair(i) for i in range(pairs)]


def targets(section: dict) -> dict:
    """The issue-35 targets, judged on the (merged) median ratios."""
    shared = section["shared_over_two_sequence"]["ratio"]
    rss = section["peak_rss_mb"]["ours"]["median"] / section["peak_rss_mb"]["ours_two_sequence"]["median"]
    out = {
        **TARGETS,
        "shared_over_two_sequence_met": shared >= TARGETS["shared_over_two_sequence_min"],
        "rss_shared_over_two_sequence": rss,
        "rss_met": rss <= TARGETS["rss_shared_over_two_sequence_max"],
    }
    if "ours_over_trl" in section:
        out["ours_over_trl_met"] = section["ours_over_trl"]["ratio"] >= TARGETS["ours_over_trl_min"]
    out["met"] = all(value for key, value in out.items() if key.endswith("_met"))
    return out


def bench_realistic(tok_dir: Path, spec_name: str, pairs: int, reps: int, log: Callable[[str], None]) -> dict:
    """Pairs/s and peak RSS of ours and TRL at its defaults, one epoch, on realistic lengths."""
    skipped = trl_available()
    work = Workload(pairs=pairs, max_length=MAX_LENGTH)
    items = realistic_items(tok_dir, pairs, work.seed)
    items = items[: len(items) - len(items) % work.batch_size]
    steps = len(items) // work.batch_size
    drawn = draw_lengths(pairs, work.seed)
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
    variants = ours_variants(spec_name, work, tok_dir, items, 1)
    if skipped is None:
        variants["trl_defaults"] = partial(
            isolated, run_trl, spec_name, work, tok_dir, items, steps, "random", label="trl_defaults"
        )
    runs = interleave(variants, reps, warmup=0, log=log)
    described["work"] = check_equal_work(runs, items, 1)
    rates = {name: [r["pairs_per_s"] for r in rs] for name, rs in runs.items()}
    out["pairs_per_s"] = {name: summary(v) for name, v in rates.items()}
    out["peak_rss_mb"] = {name: summary([r["peak_rss_mb"] for r in rs]) for name, rs in runs.items()}
    out["tokens_per_pair"] = tokens_per_pair(runs, items, 1)
    out["shared_over_two_sequence"] = ratio(rates["ours"], rates["ours_two_sequence"])
    if "trl_defaults" in rates:
        out["ours_over_trl"] = ratio(rates["ours"], rates["trl_defaults"])
        out["two_sequence_over_trl"] = ratio(rates["ours_two_sequence"], rates["trl_defaults"])
    out["target"] = targets(out)
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
        f" (transcripts drawn: mean {drawn['mean']:.0f}, median {drawn['p50']:.0f}, p95 {drawn['p95']:.0f};"
        f" built {work['mean_tokens_per_sequence']:.0f} tokens per sequence, prompt shared)."
        " TRL: RewardTrainer defaults (random batches, padding to the batch's longest).",
        "",
    ]
    lines += [
        "| variant | pairs/s median (min–max) | peak RSS MB | computed tokens per pair |",
        "|---|---|---|---|",
    ]
    per_pair = section["tokens_per_pair"]
    for name, rate in section["pairs_per_s"].items():
        lines.append(
            f"| {name} | {rate['median']:.2f} ({rate['min']:.2f}–{rate['max']:.2f})"
            f" | {section['peak_rss_mb'][name]['median']:.0f} | {per_pair[name]:.0f} |"
        )
    target = section["target"]
    met = {True: "met", False: "**missed**"}
    lines += [
        "",
        f"Every variant trained on the same {section['workload']['work']['pairs']} pairs and"
        f" {section['workload']['work']['real_tokens']} real tokens (fingerprint"
        f" {section['workload']['work']['fingerprint']}, checked per run). Tokens per pair: the limit"
        f" (prompt + chosen + rejected) {per_pair['limit']:.0f}; two whole sequences without padding"
        f" {per_pair['two_sequences_unpadded']:.0f}.",
        "",
        f"Shared prefix ÷ two sequences (our loop): {section['shared_over_two_sequence']['ratio']:.2f}x;"
        f" target >= {TARGETS['shared_over_two_sequence_min']}:"
        f" {met[target['shared_over_two_sequence_met']]}."
        f" Peak RSS shared ÷ two sequences {target['rss_shared_over_two_sequence']:.3f};"
        f" target <= {TARGETS['rss_shared_over_two_sequence_max']}: {met[target['rss_met']]}.",
    ]
    if section.get("trl_skipped"):
        return [*lines, "", f"TRL comparison skipped: {section['trl_skipped']}", ""]
    return [
        *lines,
        f"Ours ÷ TRL defaults: {section['ours_over_trl']['ratio']:.2f}x (two sequences ÷ TRL"
        f" {section['two_sequence_over_trl']['ratio']:.2f}x); target >= {TARGETS['ours_over_trl_min']}:"
        f" {met[target['ours_over_trl_met']]}.",
        "",
    ]
