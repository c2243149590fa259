"""ANCHOR's cost: anchor_last against naive on the same run, by where its reference comes from.

`anchor_shared` reads the states the pipeline's `reference` stage stores once
(prefshift.engine.reference_store); that one-off fill is timed on its own and amortised over
the anchor runs it serves (a 4-point λ sweep × 2 anchor variants). `anchor_cached` fills
an in-run cache (what a run outside the pipeline does), `anchor_uncached` runs a frozen copy.

Each run is a fresh process (see `common.isolated`), so its peak RSS is its own. We
report the whole-process peak (what the machine must have) and the increment over
the RSS just before training (what the training itself adds: activations, the cache
or the frozen copy), because on small models the libraries dominate the first.
The LoRA variant anchors to the same model with its adapters disabled: no copy.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import replace
from functools import partial
from pathlib import Path

from prefshift.bench.common import (
    Workload,
    encoded_items,
    interleave,
    isolated,
    load_tokenizer,
    model_label,
    ratio,
    reward_classifier,
    summary,
)
from prefshift.bench.training import measured, train_config
from prefshift.config.params import AnchorConfig, LoraConfig, Params

VARIANTS = {
    "naive": ("naive", True, False),
    "anchor_shared": ("anchor_last", True, False),
    "anchor_cached": ("anchor_last", True, False),
    "anchor_uncached": ("anchor_last", False, False),
    "lora_naive": ("naive", True, True),
    "lora_anchor_shared_base": ("anchor_last", False, True),
}
"""name -> (method, anchor.cache, LoRA)."""
COMPARED = {
    "anchor_shared": "naive",
    "anchor_cached": "naive",
    "anchor_uncached": "naive",
    "lora_anchor_shared_base": "lora_naive",
}
TARGETS = {
    "anchor_shared": {"wall": 1.05, "peak_rss": 1.05},
    "anchor_cached": {"wall": 1.10, "peak_rss": 1.15},
}
SWEEP_RUNS = 4 * 2
"""Anchor runs one stored reference serves in the amortised figure: 4 λ values × anchor_last, anchor_mid."""


def fill_reference(spec_name: str, work: Workload, tok_dir: Path, items, directory: str) -> dict:
    """The reference stage's pass (anchor_last's layer) over `items`, in this (fresh) process."""
    import time

    from prefshift.models.reward import RewardModel
    from prefshift.pipeline.stages.reference import compute_reference

    tokenizer = load_tokenizer(tok_dir)
    model = RewardModel(reward_classifier(spec_name, tokenizer, work.max_length, work.seed)).eval()
    start = time.perf_counter()
    layers = (model.num_layers,)
    compute_reference(model, items, layers, Path(directory), 16, tokenizer.pad_token_id).finish()
    return {"fill_s": time.perf_counter() - start, "layers": list(layers)}


def run_variant(
    spec_name: str, work: Workload, tok_dir: Path, items, epochs: int, variant: str, shared: str | None = None
) -> dict:
    """One training run of `variant`, in this (fresh) process, after a two-step warm-up run."""
    from prefshift.engine.reference_store import StoredReference
    from prefshift.engine.train import train_reward_model
    from prefshift.methods import build_objective
    from prefshift.models.reward import RewardModel

    method, cache, lora = VARIANTS[variant]
    tokenizer = load_tokenizer(tok_dir)
    anchor = AnchorConfig(cache=cache)
    params = Params(anchor=anchor)
    cfg = train_config(work, 1, lora=LoraConfig(enabled=lora))

    def prepared(data, n_epochs: int) -> Callable[[], dict]:
        model = RewardModel(reward_classifier(spec_name, tokenizer, work.max_length, work.seed))
        objective = build_objective(method, params, model.num_layers)
        stored = StoredReference(Path(shared), objective.layers) if variant == "anchor_shared" else None
        return partial(
            train_reward_model,
            model,
            tokenizer,
            data,
            objective,
            cfg.model_copy(update={"epochs": n_epochs}),
            seed=work.seed,
            name=variant,
            anchor=anchor,
            reference=stored,
            progress=False,
        )

    prepared(items[: 2 * work.batch_size], 1)()
    train, logs = prepared(items, epochs), []
    result = measured(lambda: logs.append(train()[1]), epochs * len(items))
    timings = {key: logs[0].get(key, 0.0) for key in ("reference_fill_s", "reference_read_s")}
    return {**result, **timings}


def set_targets(ratios: dict) -> None:
    """Judge each target on the quoted median ratios (again after invocations are merged)."""
    for name, target in TARGETS.items():
        if name not in ratios:  # not run (`bench_anchor`'s `only`)
            continue
        ratios[name]["target"] = {
            **target,
            "met": all(ratios[name][key]["ratio"] <= limit for key, limit in target.items()),
        }


def bench_anchor(
    tok_dir: Path,
    spec_name: str,
    pairs: int,
    epochs: int,
    reps: int,
    log: Callable[[str], None],
    workload: Workload | None = None,
    only: Collection[str] | None = None,
) -> dict:
    """Wall time and peak RSS of each variant (`only`: those, naive always) and each anchor
    variant ÷ its baseline; `spec_name` and `workload` as in `training.bench_training`."""
    import tempfile

    work = replace(workload, pairs=pairs) if workload else Workload(pairs=pairs)
    items = encoded_items(load_tokenizer(tok_dir), work)
    names = [name for name in VARIANTS if only is None or name == "naive" or name in only]
    log(f"ANCHOR overhead, {model_label(spec_name)}")
    with tempfile.TemporaryDirectory(prefix="prefshift-reference-") as shared:
        fill = isolated(fill_reference, spec_name, work, tok_dir, items, shared, label="reference fill")
        variants = {
            name: partial(
                isolated, run_variant, spec_name, work, tok_dir, items, epochs, name, shared, label=name
            )
            for name in names
        }
        runs = interleave(variants, reps, warmup=0, log=log)
    walls = {name: [r["wall_s"] for r in rs] for name, rs in runs.items()}
    peaks = {name: [r["peak_rss_mb"] for r in rs] for name, rs in runs.items()}
    increments = {name: [max(r["peak_increment_mb"], 1e-3) for r in rs] for name, rs in runs.items()}
    fills = {name: [r["reference_fill_s"] for r in rs] for name, rs in runs.items()}
    reads = {name: [r["reference_read_s"] for r in rs] for name, rs in runs.items()}
    steps_only = {name: [w - f for w, f in zip(walls[name], fills[name], strict=True)] for name in walls}
    ratios = {
        name: {
            "baseline": base,
            "wall": ratio(walls[name], walls[base], higher_is_better=False),
            "wall_without_cache_fill": ratio(steps_only[name], walls[base], higher_is_better=False),
            "peak_rss": ratio(peaks[name], peaks[base], higher_is_better=False),
            "peak_increment": ratio(increments[name], increments[base], higher_is_better=False),
        }
        for name, base in COMPARED.items()
        if name in walls and base in walls
    }
    if "anchor_shared" in walls:
        amortised = [w + fill["fill_s"] / SWEEP_RUNS for w in walls["anchor_shared"]]
        ratios["anchor_shared"]["wall_with_fill_amortised"] = ratio(
            amortised, walls["naive"], higher_is_better=False
        )
    set_targets(ratios)
    return {
        "workload": {
            "model": model_label(spec_name),
            "pairs": len(items),
            **({"source": str(work.source)} if work.source else {}),
            "max_length": work.max_length,
            "epochs": epochs,
            "batch_size": work.batch_size,
        },
        "wall_s": {name: summary(v) for name, v in walls.items()},
        "reference_fill_s": {name: summary(v) for name, v in fills.items()},
        "reference_read_s": {name: summary(v) for name, v in reads.items()},
        "shared_reference": {
            "fill_s": fill["fill_s"],
            "layers": fill["layers"],
            "amortised_over_runs": SWEEP_RUNS,
        },
        "peak_rss_mb": {name: summary(v) for name, v in peaks.items()},
        "peak_increment_mb": {name: summary(v) for name, v in increments.items()},
        "ratios": ratios,
    }
