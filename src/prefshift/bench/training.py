"""Training throughput: our naive trainer against TRL's RewardTrainer on identical work.

Both sides get the same token ids (our encoding, passed to TRL pre-tokenised as
`chosen_ids`/`rejected_ids`, which it accepts as-is), the same freshly initialised
Llama-style classifier, batch size, learning-rate schedule, clipping, fp32 on CPU,
dropout off and number of optimizer steps. TRL's logging, saving and evaluation are
switched off; its length-grouped sampler reads a `length` column, which its collator
ignores. Our loop is timed whole (accelerator set-up, drift probes included);
TRL's `train()` call is timed, its dataset preparation and constructor are not.
Each process first runs its variant for two steps on a slice of the data, so import
and first-call costs never land in a timed run; model construction is never timed.
Ablations of our loop (random batches, fixed padding), TRL with its own length-grouped
sampler and a bare PyTorch loop over random batches (the floor any trainer adds to)
show where the difference comes from.
"""

from __future__ import annotations

import math
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

from prefshift.bench.common import (
    MODELS,
    Workload,
    hf_reward_model,
    interleave,
    isolated,
    load_tokenizer,
    padding_efficiency,
    peak_rss_kb,
    ratio,
    reset_peak,
    summary,
)
from prefshift.config import TrainConfig

LR = 5e-4
WARMUP = 0.1


def train_config(work: Workload, epochs: int, **extra) -> TrainConfig:
    return TrainConfig(
        batch_size=work.batch_size, epochs=epochs, lr=LR, warmup_frac=WARMUP, precision="fp32", **extra
    )


def measured(run: Callable[[], None], pairs: int) -> dict:
    before = reset_peak()
    start = time.perf_counter()
    run()
    wall = time.perf_counter() - start
    peak = peak_rss_kb()
    return {
        "wall_s": wall,
        "pairs_per_s": pairs / wall,
        "peak_rss_mb": peak / 1024,
        "rss_before_mb": before / 1024,
        "peak_increment_mb": (peak - before) / 1024,
    }


def run_ours(spec_name: str, work: Workload, tok_dir: Path, items, epochs: int, batching: str) -> dict:
    """Our trainer with the naive objective, in this (fresh) process."""
    import prefshift.train as train_module
    from prefshift.bench.batching import ablation
    from prefshift.methods.base import Objective
    from prefshift.models.reward import RewardModel

    tokenizer = load_tokenizer(tok_dir)

    def prepared(data, n_epochs: int) -> Callable[[], None]:
        model = RewardModel(hf_reward_model(MODELS[spec_name], tokenizer, work.max_length, work.seed))

        def run() -> None:
            with ablation(train_module, batching, work.max_length):
                train_module.train_reward_model(
                    model,
                    tokenizer,
                    data,
                    Objective("naive"),
                    train_config(work, n_epochs),
                    seed=work.seed,
                    name="bench",
                    progress=False,
                )

        return run

    prepared(items[: 2 * work.batch_size], 1)()
    return measured(prepared(items, epochs), epochs * len(items))


def run_trl(spec_name: str, work: Workload, tok_dir: Path, items, steps: int, sampling: str) -> dict:
    """trl.RewardTrainer on the same token ids, in this (fresh) process."""
    from datasets import Dataset, disable_progress_bars
    from trl import RewardConfig, RewardTrainer

    disable_progress_bars()
    tokenizer = load_tokenizer(tok_dir)

    def trainer(data, n_steps: int, tmp: str):
        args = RewardConfig(
            output_dir=tmp,
            per_device_train_batch_size=work.batch_size,
            max_steps=n_steps,
            learning_rate=LR,
            lr_scheduler_type="linear",
            warmup_steps=round(WARMUP * n_steps),
            weight_decay=0.0,
            max_grad_norm=1.0,
            max_length=work.max_length,
            report_to="none",
            save_strategy="no",
            eval_strategy="no",
            logging_strategy="no",
            disable_tqdm=True,
            use_cpu=True,
            dataloader_num_workers=0,
            seed=work.seed,
            train_sampling_strategy=sampling,
            length_column_name="length",
            remove_unused_columns=False,
        )
        model = hf_reward_model(MODELS[spec_name], tokenizer, work.max_length, work.seed)
        dataset = Dataset.from_dict(
            {
                "chosen_ids": [it.chosen.input_ids for it in data],
                "rejected_ids": [it.rejected.input_ids for it in data],
                "length": [it.length for it in data],
            }
        )
        return RewardTrainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer)

    with tempfile.TemporaryDirectory() as tmp:
        trainer(items[: 2 * work.batch_size], 2, tmp).train()
        return measured(trainer(items, steps, tmp).train, steps * work.batch_size)


def run_bare(spec_name: str, work: Workload, tok_dir: Path, items, epochs: int, batching: str) -> dict:
    """The floor: a plain PyTorch loop over the same batches (no accelerate, probes or logging)."""
    import torch
    import torch.nn.functional as F
    from transformers import get_scheduler

    from prefshift.bench.batching import random_batches
    from prefshift.data.encode import collate, length_grouped_batches

    tokenizer = load_tokenizer(tok_dir)
    make_batches = length_grouped_batches if batching == "shipped" else random_batches

    def prepared(data, n_epochs: int) -> Callable[[], None]:
        model = hf_reward_model(MODELS[spec_name], tokenizer, work.max_length, work.seed)
        model.train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
        steps = n_epochs * math.ceil(len(data) / work.batch_size)
        scheduler = get_scheduler("linear", optimizer, round(WARMUP * steps), steps)
        lengths = [it.length for it in data]

        def run() -> None:
            for epoch in range(n_epochs):
                for idx in make_batches(lengths, work.batch_size, seed=epoch):
                    batch = collate([data[i] for i in idx], tokenizer.pad_token_id)
                    rewards = model(
                        input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]
                    ).logits
                    delta = rewards[: len(idx), 0] - rewards[len(idx) :, 0]
                    loss = F.binary_cross_entropy_with_logits(delta, batch["targets"])
                    loss.backward()
                    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                    optimizer.step()
                    scheduler.step()
                    optimizer.zero_grad(set_to_none=True)

        return run

    prepared(items[: 2 * work.batch_size], 1)()
    return measured(prepared(items, epochs), epochs * len(items))


def trl_available() -> str | None:
    """None when TRL can be imported, else why not (the comparison is then skipped, not failed)."""
    try:
        import trl  # noqa: F401
    except ImportError as err:
        return f"trl is not installed ({err}); pip install 'prefshift[bench]'"
    return None


def _workload(tok_dir: Path, pairs: int, epochs: int) -> tuple[Workload, list, dict]:
    """Encoded pairs (a whole number of batches) and a description with padding efficiencies."""
    from prefshift.bench.batching import random_batches
    from prefshift.bench.common import encoded_items
    from prefshift.data.encode import length_grouped_batches

    work = Workload(pairs=pairs)
    items = encoded_items(load_tokenizer(tok_dir), work)
    items = items[: len(items) - len(items) % work.batch_size]
    lengths = [2 * it.length for it in items]
    shuffled = random_batches(lengths, work.batch_size, seed=0)
    tokens = [len(s.input_ids) for it in items for s in (it.chosen, it.rejected)]
    described = {
        "pairs": len(items),
        "epochs": epochs,
        "optimizer_steps": epochs * math.ceil(len(items) / work.batch_size),
        "batch_size": work.batch_size,
        "max_length": work.max_length,
        "precision": "fp32",
        "mean_tokens_per_sequence": sum(tokens) / len(tokens),
        "padding_efficiency": {
            "length_grouped": padding_efficiency(
                length_grouped_batches(lengths, work.batch_size, seed=0), lengths, None
            ),
            "random": padding_efficiency(shuffled, lengths, None),
            "fixed_max_length": padding_efficiency(shuffled, lengths, 2 * work.max_length),
        },
    }
    return work, items, described


def bench_training(
    tok_dir: Path, plan: dict[str, tuple[int, int]], reps: int, log: Callable[[str], None]
) -> dict:
    """Pairs/s of every variant per model config (model -> (pairs, epochs)), and ratios against TRL."""
    skipped = trl_available()
    out: dict = {"trl_skipped": skipped, "models": {}}
    for spec_name, (pairs, epochs) in plan.items():
        work, items, described = _workload(tok_dir, pairs, epochs)
        steps = described["optimizer_steps"]
        log(f"training throughput, {spec_name}")
        variants = {
            f"ours{suffix}": partial(
                isolated, run_ours, spec_name, work, tok_dir, items, epochs, kind, label=f"ours{suffix}"
            )
            for suffix, kind in (
                ("", "shipped"),
                ("_random_batches", "random_batches"),
                ("_fixed_padding", "fixed_padding"),
            )
        }
        variants["bare_torch_loop"] = partial(
            isolated,
            run_bare,
            spec_name,
            work,
            tok_dir,
            items,
            epochs,
            "random_batches",
            label="bare_torch_loop",
        )
        if skipped is None:
            for name, sampling in (("trl", "random"), ("trl_group_by_length", "group_by_length")):
                variants[name] = partial(
                    isolated, run_trl, spec_name, work, tok_dir, items, steps, sampling, label=name
                )
        runs = interleave(variants, reps, warmup=0, log=log)
        rates = {name: [r["pairs_per_s"] for r in rs] for name, rs in runs.items()}
        vs = {name: ratio(rates["ours"], v) for name, v in rates.items() if name != "ours"}
        out["models"][spec_name] = {
            "workload": described,
            "pairs_per_s": {name: summary(v) for name, v in rates.items()},
            "peak_rss_mb": {name: summary([r["peak_rss_mb"] for r in rs]) for name, rs in runs.items()},
            "vs_ours": vs,
            "target": {"ours_over_trl_min": 1.3, "met": vs["trl"]["ratio"] >= 1.3} if "trl" in vs else None,
        }
    return out
