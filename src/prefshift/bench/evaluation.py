"""Scoring throughput: the batched, length-sorted `score_pairs` against batch 1 and fixed padding.

All call the shipped `score_pairs` (encoding included); batch 1 sets
evaluate.batch_size=1, fixed padding swaps its collate for one that pads every batch
to encode.max_length. They must agree on every margin, which we check. Since issue 35 the
shipped scorer computes each pair's prompt once (the shared-prefix forward); `batched_two_sequence`
is the same batching on two whole sequences per pair, and fixed padding runs on that path too,
since padding is what it varies (the shared-prefix forward packs by real lengths).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from prefshift.bench.common import (
    MODELS,
    interleave,
    load_tokenizer,
    ratio,
    summary,
    synthetic_pairs,
)

BATCH = 32
MAX_LENGTH = 128
TARGET = 5.0


def scoring_target(vs: dict) -> dict:
    """Batched ÷ per-pair >= TARGET, judged on the quoted median ratio."""
    return {"batched_over_per_pair_min": TARGET, "met": vs["per_pair"]["ratio"] >= TARGET}


def bench_evaluation(tok_dir: Path, plan: dict[str, int], reps: int, log: Callable[[str], None]) -> dict:
    """Per model (model -> test pairs): pairs/s of each scorer and the batched scorer's speed-up."""
    return {"models": {name: _bench_model(tok_dir, name, pairs, reps, log) for name, pairs in plan.items()}}


def _bench_model(tok_dir: Path, spec_name: str, pairs: int, reps: int, log: Callable[[str], None]) -> dict:
    import prefshift.engine.scoring as scoring
    from prefshift.bench.batching import ablation
    from prefshift.bench.common import hf_reward_model
    from prefshift.config.params import Params
    from prefshift.models.reward import RewardModel

    tokenizer = load_tokenizer(tok_dir)
    model = RewardModel(hf_reward_model(MODELS[spec_name], tokenizer, MAX_LENGTH, seed=0)).eval()
    data = synthetic_pairs(pairs, split="test")
    batched = Params(evaluate={"batch_size": BATCH}, encode={"max_length": MAX_LENGTH})
    single = Params(evaluate={"batch_size": 1}, encode={"max_length": MAX_LENGTH})
    frames: dict = {}

    def variant(name: str, params: Params, kind: str, pair_forward: str = "auto") -> Callable[[], dict]:
        def run() -> dict:
            model.pair_forward = pair_forward
            with ablation(scoring, kind, MAX_LENGTH):
                start = time.perf_counter()
                frames[name] = scoring.score_pairs(model, tokenizer, data, params)
                wall = time.perf_counter() - start
            model.pair_forward = "auto"
            return {"wall_s": wall, "pairs_per_s": len(frames[name]) / wall}

        return run

    log(f"evaluation throughput, {spec_name}")
    runs = interleave(
        {
            "batched_sorted": variant("batched_sorted", batched, "shipped"),
            "per_pair": variant("per_pair", single, "shipped"),
            "batched_two_sequence": variant("batched_two_sequence", batched, "shipped", "two_sequence"),
            "fixed_padding": variant("fixed_padding", batched, "fixed_padding", "two_sequence"),
        },
        reps,
        log=log,
    )
    rates = {name: [r["pairs_per_s"] for r in rs] for name, rs in runs.items()}
    reference = frames["batched_sorted"]["delta"]
    vs = {name: ratio(rates["batched_sorted"], v) for name, v in rates.items() if name != "batched_sorted"}
    return {
        "workload": {
            "model": spec_name,
            "pairs": len(reference),
            "batch_size": BATCH,
            "max_length": MAX_LENGTH,
        },
        "pairs_per_s": {name: summary(v) for name, v in rates.items()},
        "batched_over": vs,
        "max_abs_margin_difference": {
            name: float((frame["delta"] - reference).abs().max()) for name, frame in frames.items()
        },
        "target": scoring_target(vs),
    }
