"""Training throughput: our naive trainer against TRL's RewardTrainer on identical work.

Both sides get the same token ids (our encoding, passed to TRL pre-tokenised as
`chosen_ids`/`rejected_ids`, which it accepts as-is), the same freshly initialised
Llama-style classifier, batch size, learning-rate schedule, clipping, fp32 on CPU,
dropout off and number of optimizer steps. TRL's logging, saving and evaluation are
switched off, and so are its bf16 and gradient-checkpointing defaults (`run_trl`); its
length-grouped sampler reads a `length` column, which its collator ignores. Every run
counts the work it did (`bench.work`), and a result where any run trained on other pairs
or tokens is refused (`check_equal_work`). Our loop is timed whole (accelerator set-up,
drift probes included); TRL's `train()` call is timed, its dataset preparation and constructor are not.
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
from collections.abc import Callable, Collection
from dataclasses import replace
from functools import partial
from pathlib import Path

from prefshift.bench.common import (
    BenchError,
    Workload,
    interleave,
    isolated,
    load_tokenizer,
    model_label,
    padding_efficiency,
    peak_rss_kb,
    ratio,
    reset_peak,
    reward_classifier,
    summary,
)
from prefshift.bench.work import WorkCounter, cpu_bf16_features, fingerprint
from prefshift.config.params import TrainConfig

LR = 5e-4
WARMUP = 0.1


def train_config(work: Workload, epochs: int, precision: str = "fp32", **extra) -> TrainConfig:
    return TrainConfig(
        batch_size=work.batch_size, epochs=epochs, lr=LR, warmup_frac=WARMUP, precision=precision, **extra
    )


def measured(
    run: Callable[[], None], pairs: int, counter: WorkCounter | None = None, profile_top: int = 0
) -> dict:
    """Wall time, pairs/s and peak RSS of `run()`; with a `counter`, also the work it counted
    (real tokens/s among it) and the settings it observed; with `profile_top`, the run is
    profiled instead (its wall time then includes the profiler's cost) and the result
    carries its top operators by self CPU time."""
    from prefshift.bench.operators import operator_table, profiled

    before = reset_peak()
    with profiled(profile_top > 0) as prof:
        start = time.perf_counter()
        run()
        wall = time.perf_counter() - start
    peak = peak_rss_kb()
    out = {
        "wall_s": wall,
        "pairs_per_s": pairs / wall,
        "peak_rss_mb": peak / 1024,
        "rss_before_mb": before / 1024,
        "peak_increment_mb": (peak - before) / 1024,
    }
    if counter is not None:
        out.update(counter.summary())
        out["real_tokens_per_s"] = out["work"]["real_tokens"] / wall
    if prof is not None:
        out["profile"] = operator_table(prof, profile_top)
    return out


def run_ours(
    spec_name: str,
    work: Workload,
    tok_dir: Path,
    items,
    epochs: int,
    batching: str,
    profile_top: int = 0,
    precision: str = "fp32",
    pair_forward: str = "auto",
) -> dict:
    """Our trainer with the naive objective, in this (fresh) process; `pair_forward` as params
    `encode.pair_forward` (two_sequence: each pair as two whole sequences, as before issue 35)."""
    import prefshift.engine.train as train_module
    from prefshift.bench.batching import ablation
    from prefshift.methods.base import Objective
    from prefshift.models.reward import RewardModel

    tokenizer = load_tokenizer(tok_dir)

    def prepared(data, n_epochs: int) -> tuple[RewardModel, Callable[[], None]]:
        hf = reward_classifier(spec_name, tokenizer, work.max_length, work.seed)
        model = RewardModel(hf, pair_forward)

        def run() -> None:
            with ablation(train_module, batching, work.max_length):
                train_module.train_reward_model(
                    model,
                    tokenizer,
                    data,
                    Objective("naive"),
                    train_config(work, n_epochs, precision),
                    seed=work.seed,
                    name="bench",
                    progress=False,
                )

        return model, run

    prepared(items[: 2 * work.batch_size], 1)[1]()
    model, run = prepared(items, epochs)
    return measured(run, epochs * len(items), WorkCounter(model, pad_to_multiple_of=None), profile_top)


def run_trl(
    spec_name: str,
    work: Workload,
    tok_dir: Path,
    items,
    steps: int,
    sampling: str,
    aligned: bool = True,
    profile_top: int = 0,
) -> dict:
    """trl.RewardTrainer on the same token ids, in this (fresh) process.

    `aligned` turns off the two `RewardConfig` defaults that change the arithmetic rather than
    the trainer: bf16 autocast (on by default even on CPU) and gradient checkpointing (a second
    forward per layer in the backward). Without it TRL runs as shipped, for the record.
    """
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
            **({"bf16": False, "gradient_checkpointing": False} if aligned else {}),
        )
        model = reward_classifier(spec_name, tokenizer, work.max_length, work.seed)
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
        timed = trainer(items, steps, tmp)
        counter = WorkCounter(timed.model, pad_to_multiple_of=timed.args.pad_to_multiple_of)
        out = measured(timed.train, steps * work.batch_size, counter, profile_top)
        out["dropped_rows"] = len(items) - len(timed.train_dataset)  # TRL filters rows over max_length
        return out


def run_bare(
    spec_name: str, work: Workload, tok_dir: Path, items, epochs: int, batching: str, profile_top: int = 0
) -> dict:
    """The floor: a plain PyTorch loop over the same batches (no accelerate, probes or logging),
    with torch's defaults (AdamW's for-loop kernel on CPU)."""
    import torch
    import torch.nn.functional as F
    from transformers import get_scheduler

    from prefshift.bench.batching import random_batches
    from prefshift.data.encode import collate, length_grouped_batches

    tokenizer = load_tokenizer(tok_dir)
    make_batches = length_grouped_batches if batching == "shipped" else random_batches

    def prepared(data, n_epochs: int):
        model = reward_classifier(spec_name, tokenizer, work.max_length, work.seed)
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

        return model, run

    prepared(items[: 2 * work.batch_size], 1)[1]()
    model, run = prepared(items, epochs)
    return measured(run, epochs * len(items), WorkCounter(model, pad_to_multiple_of=None), profile_top)


def trl_available() -> str | None:
    """None when TRL can be imported, else why not (the comparison is then skipped, not failed)."""
    try:
        import trl  # noqa: F401
    except ImportError as err:
        return f"trl is not installed ({err}); pip install 'prefshift[bench]'"
    return None


def _workload(
    tok_dir: Path, pairs: int, epochs: int, workload: Workload | None = None
) -> tuple[Workload, list, dict]:
    """Encoded pairs (a whole number of batches) and a description with padding efficiencies;
    `workload` sets the rest of the workload (max length, a file of pairs)."""
    from prefshift.bench.batching import random_batches
    from prefshift.bench.common import encoded_items
    from prefshift.data.encode import length_grouped_batches

    work = replace(workload, pairs=pairs) if workload else Workload(pairs=pairs)
    # Equal work by construction: TRL drops a pair with a side over max_length (our encoder
    # truncates, so none should be), and a partial last batch would be a different step count.
    items = [it for it in encoded_items(load_tokenizer(tok_dir), work) if it.length <= work.max_length]
    items = items[: len(items) - len(items) % work.batch_size]
    lengths = [2 * it.length for it in items]
    shuffled = random_batches(lengths, work.batch_size, seed=0)
    tokens = [len(s.input_ids) for it in items for s in (it.chosen, it.rejected)]
    described = {
        "pairs": len(items),
        **({"source": str(work.source)} if work.source else {}),
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


TRL_VARIANTS = {
    "trl": ("random", True),
    "trl_group_by_length": ("group_by_length", True),
    "trl_group_by_length_as_shipped": ("group_by_length", False),
}
"""name -> (TRL sampler, aligned to our fp32 arithmetic); the last runs only when asked for."""


def ours_variants(spec_name: str, work: Workload, tok_dir: Path, items, epochs: int) -> dict:
    """Our loop as shipped (shared-prefix forward) and on two whole sequences per pair."""
    return {
        name: partial(
            isolated,
            run_ours,
            spec_name,
            work,
            tok_dir,
            items,
            epochs,
            "shipped",
            0,
            "fp32",
            pair_forward,
            label=name,
        )
        for name, pair_forward in (("ours", "auto"), ("ours_two_sequence", "two_sequence"))
    }


def limit_tokens(items) -> int:
    """Tokens the exact arithmetic cannot do without: per pair, prompt + chosen + rejected, i.e.
    both sequences less their longest common token prefix (counted once)."""
    total = 0
    for it in items:
        chosen, rejected = it.chosen.input_ids, it.rejected.input_ids
        common = 0
        while common < min(len(chosen), len(rejected)) and chosen[common] == rejected[common]:
            common += 1
        total += len(chosen) + len(rejected) - common
    return total


def tokens_per_pair(runs: dict[str, list[dict]], items, epochs: int) -> dict:
    """Computed tokens per pair of each variant (padding included), beside the limit and the two
    whole sequences without padding."""
    pairs = epochs * len(items)
    return {
        "limit": limit_tokens(items) / len(items),
        "two_sequences_unpadded": sum(len(s.input_ids) for it in items for s in (it.chosen, it.rejected))
        / len(items),
        **{name: rs[0]["work"]["computed_tokens"] / pairs for name, rs in runs.items()},
    }


def trl_target(vs: dict) -> dict | None:
    """Ours ÷ TRL (aligned, random sampler) >= 1.3, judged on the quoted median ratio."""
    return {"ours_over_trl_min": 1.3, "met": vs["trl"]["ratio"] >= 1.3} if "trl" in vs else None


def check_equal_work(runs: dict[str, list[dict]], items, epochs: int) -> dict:
    """The work every run must have done (pairs, real tokens and their fingerprint, `epochs`
    passes over `items`); raises BenchError naming the first run that did other work."""
    expected = {
        "pairs": epochs * len(items),
        "real_tokens": epochs * sum(len(s.input_ids) for it in items for s in (it.chosen, it.rejected)),
        "fingerprint": fingerprint(
            [s.input_ids for it in items for s in (it.chosen, it.rejected)], times=epochs
        ),
    }
    for name, rs in runs.items():
        for i, r in enumerate(rs):
            done = {key: r["work"][key] for key in expected}
            if done != expected or r.get("dropped_rows", 0):
                raise BenchError(
                    f"benchmark variant {name} (round {i + 1}) did different work: {done}"
                    f"{', dropped ' + str(r['dropped_rows']) + ' rows' if r.get('dropped_rows') else ''};"
                    f" every variant must train on {expected}. Its ratio would compare unequal work"
                )
    return expected


def bench_training(
    tok_dir: Path,
    plan: dict[str, tuple[int, int]],
    reps: int,
    log: Callable[[str], None],
    trl_as_shipped: bool = False,
    workload: Workload | None = None,
    only: Collection[str] | None = None,
) -> dict:
    """Pairs/s and real tokens/s of every variant per model (model -> (pairs, epochs); a model is
    a `MODELS` name, or a local model directory whose tokenizer `tok_dir` is), ratios against
    ours, the work each did (checked equal) and the settings it ran under. `workload` sets the rest
    of the workload (max length, a file of pairs); `only` keeps those variants (ours always)."""
    skipped = trl_available()
    out: dict = {"trl_skipped": skipped, "cpu_bf16_features": cpu_bf16_features(), "models": {}}
    for spec_name, (pairs, epochs) in plan.items():
        work, items, described = _workload(tok_dir, pairs, epochs, workload)
        steps = described["optimizer_steps"]
        log(f"training throughput, {model_label(spec_name)}")
        variants = ours_variants(spec_name, work, tok_dir, items, epochs)
        # The batching ablations are of the two-sequence path, where padding is what they vary
        # (the shared-prefix forward packs by real lengths, so fixed padding would not reach it).
        variants.update(
            {
                f"ours{suffix}": partial(
                    isolated,
                    run_ours,
                    spec_name,
                    work,
                    tok_dir,
                    items,
                    epochs,
                    kind,
                    0,
                    "fp32",
                    "two_sequence",
                    label=f"ours{suffix}",
                )
                for suffix, kind in (
                    ("_random_batches", "random_batches"),
                    ("_fixed_padding", "fixed_padding"),
                )
            }
        )
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
        if trl_as_shipped:  # our loop in the arithmetic TRL ships with (bf16 autocast), for comparison
            args = (spec_name, work, tok_dir, items, epochs, "shipped", 0, "bf16")
            variants["ours_bf16"] = partial(isolated, run_ours, *args, label="ours_bf16")
        if skipped is None:
            for name, (sampling, aligned) in TRL_VARIANTS.items():
                if aligned or trl_as_shipped:
                    args = (spec_name, work, tok_dir, items, steps, sampling, aligned)
                    variants[name] = partial(isolated, run_trl, *args, label=name)
        if only is not None:
            variants = {name: run for name, run in variants.items() if name == "ours" or name in only}
        runs = interleave(variants, reps, warmup=0, log=log)
        described["work"] = check_equal_work(runs, items, epochs)
        rates = {name: [r["pairs_per_s"] for r in rs] for name, rs in runs.items()}
        vs = {name: ratio(rates["ours"], v) for name, v in rates.items() if name != "ours"}
        steps_only = {
            name: [r["pairs_per_s"] * r["wall_s"] / (r["wall_s"] - r["side_work"]["wall_s"]) for r in rs]
            for name, rs in runs.items()
        }
        out["models"][model_label(spec_name)] = {
            "workload": described,
            "pairs_per_s": {name: summary(v) for name, v in rates.items()},
            "real_tokens_per_s": {
                name: summary([r["real_tokens_per_s"] for r in rs]) for name, rs in runs.items()
            },
            "computed_tokens": {name: rs[0]["work"]["computed_tokens"] for name, rs in runs.items()},
            "tokens_per_pair": tokens_per_pair(runs, items, epochs),
            "side_work": {
                name: {
                    "no_grad_forwards": rs[0]["side_work"]["no_grad_forwards"],
                    "real_tokens": rs[0]["side_work"]["real_tokens"],
                    "share_of_wall": summary([r["side_work"]["wall_s"] / r["wall_s"] for r in rs]),
                }
                for name, rs in runs.items()
            },
            "settings": {name: rs[0]["settings"] for name, rs in runs.items()},
            "peak_rss_mb": {name: summary([r["peak_rss_mb"] for r in rs]) for name, rs in runs.items()},
            "vs_ours": vs,
            "vs_ours_without_side_work": {
                name: ratio(steps_only["ours"], v) for name, v in steps_only.items() if name != "ours"
            },
            "target": trl_target(vs),
        }
    return out
