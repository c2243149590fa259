"""The one training loop: teacher, ceiling and every student go through `train_reward_model`.

Chosen and rejected rows share one forward pass; batches are length-grouped with
dynamic padding; accelerate handles devices, mixed precision and gradient
accumulation. Every run measures representation drift against its starting
checkpoint on a fixed probe batch, because drift is the mechanism ANCHOR targets.
"""

from __future__ import annotations

import json
import random
import resource
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from prefshift.config.params import AnchorConfig, Params, TrainConfig
from prefshift.core.atomic import atomic_path, recover_interrupted_swap, write_json
from prefshift.core.errors import PrefshiftError
from prefshift.core.host import cpu_only, process_state
from prefshift.core.paths import Layout
from prefshift.core.progress import ProgressReporter, track
from prefshift.data.encode import EncodedPair, Encoder, collate, length_grouped_batches, sorted_batches
from prefshift.data.schema import Pair, SkipCounter, content_hash
from prefshift.engine.anchor_cache import ReferenceStates, frozen_copy, hidden_fn
from prefshift.engine.reference_manifest import (
    FINGERPRINT,
    MANIFEST,
    ReferenceMismatchError,
    fingerprint,
    mean_squares,
    read_manifest,
)
from prefshift.engine.reference_store import StoredReference
from prefshift.methods.anchor import select_response
from prefshift.methods.base import BatchOut, Objective
from prefshift.models.reward import (
    RewardModel,
    _peft_base,
    is_decoder_head,
    load_reward_model,
    save_reward_model,
)
from prefshift.pipeline.output_set import output_set

STATE_FILE = "trainer_state.json"

Observer = Callable[[str, dict], None]
"""Called with (series, row) as a row joins the training log; see `train_reward_model`."""


class TrainingError(PrefshiftError):
    """Training cannot go on (non-finite loss, no data); the message gives the step."""


@dataclass
class RunLog:
    steps: list[dict] = field(default_factory=list)
    drift: list[dict] = field(default_factory=list)
    drift_mse: list[dict] = field(default_factory=list)

    def add_drift(self, rows: tuple[dict, dict]) -> None:
        self.drift.append(rows[0])
        self.drift_mse.append(rows[1])


def seed_everything(seed: int) -> None:
    """Seed Python and torch; on CPU, deterministic algorithms too.

    Deterministic mode also fills every newly allocated tensor with NaN by default, a guard
    for programs that read memory they never wrote. Ours does not (the determinism tests
    check byte-identical results), and the fills were 1.5% of a small_4x256 training run's
    CPU time in the issue-18 profile, so they are off; the algorithms stay deterministic.
    """
    random.seed(seed)
    torch.manual_seed(seed)
    if not torch.cuda.is_available():
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.utils.deterministic.fill_uninitialized_memory = False


def mixed_precision(precision: str) -> str:
    if precision == "bf16":
        return "bf16"
    if precision == "auto" and torch.cuda.is_available() and torch.cuda.is_bf16_supported():
        return "bf16"
    return "no"


def adamw(params: Sequence[torch.nn.Parameter], cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW with its fused kernel, as transformers' Trainer (hence TRL) uses: one pass per
    parameter instead of a chain of elementwise ops. On CPU torch's default is the for-loop
    kernel, which took about twice as long per step in the issue-18 profile. The update is
    the same up to float rounding (last-bit differences), and just as deterministic."""
    return torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay, fused=True)


def apply_lora(model: RewardModel, cfg: TrainConfig) -> None:
    """Wrap the HF model with LoRA adapters; the scalar head is trained in full and saved."""
    from peft import LoraConfig, TaskType, get_peft_model

    head = "score" if is_decoder_head(model.hf) else "classifier"
    lora = LoraConfig(
        task_type=TaskType.SEQ_CLS,
        r=cfg.lora.r,
        lora_alpha=cfg.lora.alpha,
        lora_dropout=cfg.lora.dropout,
        target_modules=cfg.lora.target_modules,
        modules_to_save=[head],
    )
    model.hf = get_peft_model(model.hf, lora)


def enable_checkpointing(hf_model) -> None:
    """Activation checkpointing under its transformers-5 name, or the older one."""
    kwargs = {"use_reentrant": False}
    if hasattr(hf_model, "activation_checkpointing_enable"):
        hf_model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        hf_model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def _probe_states(model: RewardModel, batch: dict, layers: Sequence[int]) -> torch.Tensor:
    hidden = hidden_fn(model)(batch["input_ids"], batch["attention_mask"])
    return select_response(hidden, layers, batch["response_mask"].to(hidden[0].device)).float()


def measure_drift(model: RewardModel, probe: dict, reference: torch.Tensor, step: int) -> tuple[dict, dict]:
    """Per-layer mean cosine similarity, and MSE, between current and starting states."""
    layers = range(1, reference.shape[0] + 1)
    current = _probe_states(model, probe, layers)
    cos: dict = {"step": step}
    mse: dict = {"step": step}
    for i, k in enumerate(layers):
        cos[f"layer_{k}"] = F.cosine_similarity(current[i], reference[i], dim=-1).mean().item()
        mse[f"layer_{k}"] = (current[i] - reference[i]).pow(2).mean().item()
    return cos, mse


def build_reference(
    model: RewardModel,
    items: Sequence[EncodedPair],
    layers: Sequence[int],
    anchor: AnchorConfig,
    cfg: TrainConfig,
    pad_id: int,
    spill_dir: Path | None = None,
) -> ReferenceStates:
    """Reference states of the starting checkpoint: call before any update.

    Cached: one gradient-free pass over the data now, no copy of the model kept.
    Uncached: a frozen copy (or, with LoRA, the same model with adapters disabled).
    """
    if anchor.cache:
        reference = ReferenceStates(
            hidden_fn(model), layers, cache=True, max_bytes=anchor.cache_max_gb * 1e9, spill_dir=spill_dir
        )
        lengths = [it.length for it in items]
        batches = (collate([items[i] for i in b], pad_id) for b in sorted_batches(lengths, cfg.batch_size))
        reference.fill(track(batches, "reference (in-run cache)", len(items), size=_pairs_in))
        reference.compute = None
        reference.route = "in-run cache"
        return reference
    if cfg.lora.enabled:
        reference = ReferenceStates(hidden_fn(model, disable_adapter=True), layers, cache=False)
        reference.route = "lora base, adapters disabled"
        return reference
    ref_model = frozen_copy(model)
    reference = ReferenceStates(hidden_fn(ref_model), layers, cache=False)
    reference.module = ref_model
    reference.route = "frozen copy"
    return reference


def _pairs_in(batch: dict) -> int:
    """Pairs in a collated batch: its rows are every chosen response, then every rejected one."""
    return len(batch["keys"]) // 2


def rank_batches(
    lengths: Sequence[int], batch_size: int, seed: int, rank: int, world: int
) -> list[list[int]]:
    """This process's share of each global batch of `batch_size * world` length-grouped pairs.

    The global batches are the ones a single process with batch `batch_size * world` draws;
    each rank takes a contiguous, near-equal slice, and a global batch too small to give
    every rank a row is dropped. So every rank runs the same number of steps on disjoint
    pairs, and DDP's mean of per-rank gradients is the single-process gradient whenever the
    slices are equal in size. With one process this is `length_grouped_batches` unchanged.
    """
    shares = []
    for idx in length_grouped_batches(lengths, batch_size * world, seed=seed):
        if len(idx) < world:
            continue
        base, extra = divmod(len(idx), world)
        start = rank * base + min(rank, extra)
        shares.append(idx[start : start + base + (rank < extra)])
    return shares


def _save_checkpoint(accelerator, ckpt_dir: Path, state: dict) -> None:
    """Every rank saves into the main process's temporary directory (accelerate writes the
    weights and optimizer from the main process, RNG states per rank); the main process
    renames it once all ranks are done."""
    from accelerate.utils import broadcast_object_list

    accelerator.wait_for_everyone()
    main = accelerator.is_main_process
    with atomic_path(ckpt_dir / "last", directory=True) if main else nullcontext(None) as tmp:
        tmp = broadcast_object_list([tmp])[0]
        accelerator.save_state(str(tmp))
        if main:
            (tmp / STATE_FILE).write_text(json.dumps(state, sort_keys=True))
        accelerator.wait_for_everyone()


def _restore(accelerator, scheduler, checkpoint_dir: Path | None, fingerprint: str):
    """(step, epoch, batch, log, checkpoint, window) to resume from; other settings' checkpoints are ignored.

    `window` is the (loss, acc, n) sum of the logging window the checkpoint fell into, so
    a resumed run logs the same averages as an uninterrupted one. The scheduler's state
    lives in our JSON rather than in accelerate's custom-object pickle, which accelerate
    reads back with `weights_only=False`; a checkpoint then holds no pickle that can run code.
    """
    if checkpoint_dir is not None:
        recover_interrupted_swap(checkpoint_dir / "last")
    state_file = checkpoint_dir / "last" / STATE_FILE if checkpoint_dir is not None else None
    if state_file is None or not state_file.exists():
        return 0, 0, 0, RunLog(), None, (0.0, 0.0, 0)
    state = json.loads(state_file.read_text())
    if state.get("fingerprint") != fingerprint:
        return 0, 0, 0, RunLog(), None, (0.0, 0.0, 0)
    try:
        accelerator.load_state(str(state_file.parent))
        scheduler.load_state_dict(state["scheduler"])
    except Exception as err:  # safetensors, torch.load and pickle fail with unrelated types
        raise TrainingError(
            f"checkpoint {state_file.parent} is unreadable ({type(err).__name__}: {err}); "
            f"delete {checkpoint_dir} to train from the start"
        ) from None
    log = RunLog(state["steps"], state["drift"], state["drift_mse"])
    print(f"resuming from step {state['step']} of {state_file.parent}", file=sys.stderr)
    window = tuple(state.get("window", (0.0, 0.0, 0)))
    return state["step"], state["epoch"], state["batch"], log, state_file.parent, window


def _in_run_mean_squares(
    accelerator, reference: ReferenceStates, own: Sequence[EncodedPair], batch_size: int, pad_id: int
) -> dict[int, float]:
    """anchor.normalize=reference without the reference stage: per-layer mean squared reference state
    over every process's share of the training data, so all processes weigh the anchor alike."""
    order = sorted_batches([it.length for it in own], batch_size)
    batches = (collate([own[i] for i in b], pad_id) for b in order)
    totals, count = reference.square_sums(track(batches, "reference mean squares", len(own), size=_pairs_in))
    summed = accelerator.reduce(torch.cat([totals, torch.tensor([float(count)], dtype=torch.float64)]), "sum")
    summed = summed.cpu()
    if not summed[-1] > 0:
        raise TrainingError("anchor.normalize=reference: no response tokens to measure the reference on")
    return {k: float(summed[i] / summed[-1]) for i, k in enumerate(reference.layers)}


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _batch_loss(
    model: torch.nn.Module,
    batch: dict,
    targets: torch.Tensor,
    objective: Objective,
    reference: ReferenceStates | StoredReference | None,
    device: torch.device,
    step: int,
    total_steps: int,
) -> tuple[torch.Tensor, torch.Tensor, dict[str, float], float]:
    """One forward and the objective's loss: (loss, detached reward margins, loss terms, seconds
    spent getting the reference states).

    A function of its own so that the batch's hidden states and reference states are freed when
    it returns. Held by loop variables into the next batch's forward, they put anchor_shared's
    peak RSS 3-8% above naive's on small_4x256 in `prefshift bench`.
    """
    out = model(
        batch["input_ids"].to(device),
        batch["attention_mask"].to(device),
        output_hidden_states=bool(objective.layers),
    )
    half = len(batch["keys"]) // 2
    delta = out.rewards[:half] - out.rewards[half:]
    read_start = time.perf_counter()
    ref_states = reference.get(batch, device) if reference is not None else None
    read_s = time.perf_counter() - read_start
    batch_out = BatchOut(delta, targets, out.hidden_states, batch["response_mask"].to(device), ref_states)
    loss, extra = objective.loss(batch_out, step, total_steps)
    return loss, delta.detach(), extra, read_s


def train_reward_model(
    model: RewardModel,
    tokenizer,
    items: Sequence[EncodedPair],
    objective: Objective,
    cfg: TrainConfig,
    *,
    seed: int,
    name: str,
    anchor: AnchorConfig | None = None,
    checkpoint_dir: Path | None = None,
    reference: ReferenceStates | None = None,
    progress: bool = True,
    on_record: Observer | None = None,
) -> tuple[RewardModel, dict]:
    """Train `model` in place on `items` (targets inside them); returns (model, log dict).

    `reference` is built from the starting weights when the objective needs one; pass
    your own only to inspect it afterwards (tests). `progress` prints plain progress lines
    (prefshift.core.progress). `on_record(series, row)` sees each row as it joins the log ("train"
    every log_every steps, "drift" and "drift_mse" every drift_every), so a caller can publish
    metrics while the run goes on; on resume it first sees the rows restored from the checkpoint.
    """
    from accelerate import Accelerator
    from transformers import get_scheduler

    if not items:
        raise TrainingError(f"{name}: no training pairs left after encoding")
    start_time = time.perf_counter()
    seed_everything(seed)
    process_state()
    accelerator = Accelerator(
        mixed_precision=mixed_precision(cfg.precision),
        gradient_accumulation_steps=cfg.grad_accum,
        cpu=cpu_only(),
    )
    if cfg.lora.enabled:
        apply_lora(model, cfg)
    if cfg.gradient_checkpointing:
        enable_checkpointing(_peft_base(model.hf))
    model.to(accelerator.device)
    model.train()
    pad_id = tokenizer.pad_token_id
    all_layers = list(range(1, model.num_layers + 1))

    probe_idx = sorted(random.Random(seed).sample(range(len(items)), min(cfg.probe_size, len(items))))
    probe = collate([items[i] for i in probe_idx], pad_id)
    probe_ref = _probe_states(model, probe, all_layers)

    lengths = [it.length for it in items]
    rank, world = accelerator.process_index, accelerator.num_processes
    schedule = [
        rank_batches(lengths, cfg.batch_size, seed * 1000 + e, rank, world) for e in range(cfg.epochs)
    ]
    fill_s, read_s = 0.0, 0.0
    own = [items[i] for i in sorted({i for batches in schedule for idx in batches for i in idx})]
    if reference is None and objective.layers:
        spill = checkpoint_dir / "reference_cache" if checkpoint_dir is not None else None
        if spill is not None and world > 1:
            spill = spill / f"rank{rank}"
        fill_start = time.perf_counter()
        settings = anchor or AnchorConfig()
        reference = build_reference(model, own, objective.layers, settings, cfg, pad_id, spill)
        fill_s = time.perf_counter() - fill_start
    normalized = getattr(objective, "normalize", "none") == "reference"
    if isinstance(reference, StoredReference) and normalized and objective.scale is None:
        objective.set_scale(reference.mean_squares())
    elif reference is not None and normalized and objective.scale is None:
        objective.set_scale(_in_run_mean_squares(accelerator, reference, own, cfg.batch_size, pad_id))

    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = adamw(trainable, cfg)
    total_steps = max(1, sum(len(batches) for batches in schedule) // cfg.grad_accum)
    scheduler = get_scheduler(
        "linear",
        optimizer,
        num_warmup_steps=round(cfg.warmup_frac * total_steps),
        num_training_steps=total_steps,
    )
    model, optimizer = accelerator.prepare(model, optimizer)

    fingerprint = content_hash(
        name, objective.name, cfg.model_dump(), seed, [(it.pair_id, it.target) for it in items]
    )
    restored = _restore(accelerator, scheduler, checkpoint_dir, fingerprint)
    step, start_epoch, start_batch, log, last_ckpt, window = restored

    unwrapped = accelerator.unwrap_model(model)
    window_loss, window_acc, window_n = window
    extra: dict[str, float] = {}
    record = on_record or _ignore
    for series, rows in (("train", log.steps), ("drift", log.drift), ("drift_mse", log.drift_mse)):
        for row in rows:  # a resumed run's observer still sees the whole history
            record(series, row)
    report = ProgressReporter(
        f"train {name}",
        total_steps,
        "steps",
        rate_unit="pairs",
        start=step,
        enabled=progress and accelerator.is_main_process,
    )
    pairs_done = 0
    with report:
        for epoch in range(start_epoch, cfg.epochs):
            batches = schedule[epoch]
            for bi, idx in enumerate(batches):
                if epoch == start_epoch and bi < start_batch:
                    continue
                batch = collate([items[i] for i in idx], pad_id)
                targets = batch["targets"].to(accelerator.device)
                with accelerator.accumulate(model):
                    loss, delta, extra, read = _batch_loss(
                        model, batch, targets, objective, reference, accelerator.device, step, total_steps
                    )
                    read_s += read
                    if not torch.isfinite(loss):
                        where = (
                            f"; last good checkpoint: {last_ckpt}"
                            if last_ckpt
                            else "; no checkpoint was written"
                        )
                        raise TrainingError(
                            f"{name}: loss is {loss.item()} at step {step} (epoch {epoch}){where}"
                        )
                    accelerator.backward(loss)
                    if accelerator.sync_gradients:
                        accelerator.clip_grad_norm_(trainable, cfg.max_grad_norm)
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
                acc = ((delta > 0) == (targets > 0.5)).float().mean()
                batch_loss, batch_acc = accelerator.reduce(torch.stack([loss.detach(), acc]), "mean").tolist()
                if extra and world > 1:
                    values = torch.tensor(list(extra.values()), dtype=torch.float64).to(accelerator.device)
                    extra = dict(zip(extra, accelerator.reduce(values, "mean").tolist(), strict=True))
                window_loss += batch_loss
                window_acc += batch_acc
                window_n += 1
                pairs_done += len(idx) * world
                if not accelerator.sync_gradients:
                    continue
                scheduler.step()
                step += 1
                report.update(step, items=pairs_done, loss=window_loss / window_n, acc=window_acc / window_n)
                if step % cfg.log_every == 0 or step == total_steps:
                    row = {
                        "step": step,
                        "epoch": epoch,
                        "loss": window_loss / window_n,
                        "acc": window_acc / window_n,
                        "lr": scheduler.get_last_lr()[0],
                        **extra,
                    }
                    log.steps.append(row)
                    record("train", row)
                    window_loss, window_acc, window_n = 0.0, 0.0, 0
                if step % cfg.drift_every == 0:
                    _add_drift(log, measure_drift(unwrapped, probe, probe_ref, step), record)
                at_epoch_end = bi == len(batches) - 1
                due = step % cfg.checkpoint_every == 0 if cfg.checkpoint_every else at_epoch_end
                if checkpoint_dir is not None and due:
                    next_epoch, next_batch = (epoch + 1, 0) if at_epoch_end else (epoch, bi + 1)
                    state = {
                        "step": step,
                        "epoch": next_epoch,
                        "batch": next_batch,
                        "fingerprint": fingerprint,
                        "window": [window_loss, window_acc, window_n],
                        "scheduler": scheduler.state_dict(),
                    }
                    _save_checkpoint(accelerator, checkpoint_dir, {**state, **asdict(log)})
                    last_ckpt = checkpoint_dir / "last"
    if not log.drift or log.drift[-1]["step"] != step:
        _add_drift(log, measure_drift(unwrapped, probe, probe_ref, step), record)
    result = {
        "name": name,
        "objective": objective.name,
        "steps": log.steps,
        "drift": log.drift,
        "drift_mse": log.drift_mse,
        "total_steps": total_steps,
        "pairs": len(items),
        "wall_s": time.perf_counter() - start_time,
        "peak_rss_mb": _peak_rss_mb(),
    }
    if torch.cuda.is_available():
        result["peak_gpu_mb"] = torch.cuda.max_memory_allocated() / 2**20
    if reference is not None:
        result["reference"] = {"cache": reference.cache, "route": reference.route, **reference.stats()}
        result["reference_fill_s"] = fill_s  # timings, like wall_s: kept out of the reproducible log keys
        result["reference_read_s"] = read_s  # per step: a stored read, a cache lookup or a frozen forward
        if hasattr(reference, "rows_read"):  # stored states read: fewer when a run resumes, so kept apart too
            result["reference_rows_read"] = reference.rows_read
    return unwrapped, result


def _ignore(series: str, row: dict) -> None:
    """The observer when nobody watches."""


def _add_drift(log: RunLog, rows: tuple[dict, dict], record: Observer) -> None:
    log.add_drift(rows)
    record("drift", rows[0])
    record("drift_mse", rows[1])


def _save(
    model, tokenizer, log: dict, params: Params, layout: Layout, *, name: str, method: str, out_dir: Path
):
    """Model, training log and its scores (held-out splits; the teacher's also student_train, its
    labels), replaced together or not at all. The reward mean/std of id_test go into the saved
    config. A kill while scoring leaves the previous set whole and the checkpoint in place, so the
    rerun resumes instead of starting over.
    """
    from prefshift.pipeline.heldout_scores import score_heldout

    teacher = method == "teacher"
    command = "prefshift teacher" if teacher else f"prefshift train --method {method}"
    with output_set(
        layout.root,
        command,
        files=[layout.train_log(name)],
        directories=[layout.scores_dir(name)],
        bare=[out_dir],
    ) as out:
        save_reward_model(model, tokenizer, out.path(out_dir))
        also = ("student_train",) if teacher else ()
        heldout = score_heldout(out.path(out_dir), params, layout, name, out, also)
        log["heldout_skips"], log["reward_stats"] = heldout["skips"], heldout["reward_stats"]
        _record_reward_stats(out.path(out_dir), heldout["reward_stats"])
        write_json(out.path(layout.train_log(name)), log)


def _record_reward_stats(model_dir: Path, stats: dict[str, float]) -> None:
    """Write mean/std into a saved model's config.json in transformers' own layout (indent 2,
    sorted keys). They do not change its rewards, so the scores it was just given stand."""
    path = model_dir / "config.json"
    config = {**json.loads(path.read_text(encoding="utf-8")), **stats}
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _mean_layers(row: dict) -> float:
    values = [v for k, v in row.items() if k.startswith("layer_")]
    return sum(values) / len(values)


def shared_reference(
    params: Params, layout: Layout, objective: Objective, items: Sequence[EncodedPair], cfg: TrainConfig
) -> tuple[StoredReference | None, AnchorConfig]:
    """The reference stage's states for an anchor objective, checked against `items`, and the
    anchor settings the loop should use: when the states were too large to store (or
    anchor.cache is off) the loop runs a frozen forward (with LoRA: the base, adapters
    disabled). normalize=reference takes its per-layer constants from the stage either way.
    Outside the pipeline, with no reference stage output, the loop fills its own in-run cache."""
    if not objective.layers:
        return None, params.anchor
    if not (layout.reference_dir / MANIFEST).exists():
        print(f"reference: no {layout.reference_dir}; filling an in-run cache", file=sys.stderr)
        return None, params.anchor
    manifest = read_manifest(layout.reference_dir)
    recorded = layout.targets_dir(objective.name) / FINGERPRINT
    if recorded.exists() and json.loads(recorded.read_text()) != fingerprint(manifest, objective.layers):
        raise ReferenceMismatchError(
            f"{layout.reference_dir} changed after {recorded} was written; run `dvc repro` (or "
            f"`prefshift targets --method {objective.name}`) so the student trains on the reference it tracks"
        )
    if getattr(objective, "normalize", "none") == "reference":
        objective.set_scale(mean_squares(manifest))
    uncached = params.anchor.model_copy(update={"cache": False})
    if not params.anchor.cache or not manifest["stored"]:
        if not manifest["stored"]:
            print(f"reference: {manifest['reason']}", file=sys.stderr)
        return None, uncached
    reference = StoredReference(layout.reference_dir, objective.layers)
    reference.check(items)
    return reference, params.anchor


def _publish(run) -> Observer:
    """Log each training-log row to the stage's MLflow run as it is written (`train/loss` at its
    step, `drift/layer_2`...), so a long run's curves fill in while it trains, not at its end."""

    def record(series: str, row: dict) -> None:
        run.log_history([row], prefix=f"{series}/")

    return record


def fit(
    params: Params,
    layout: Layout,
    *,
    name: str,
    method: str,
    base_dir: Path,
    pairs: Sequence[Pair],
    targets: Sequence[float],
    cfg: TrainConfig,
    out_dir: Path,
) -> dict:
    """Train one reward model from `base_dir` on (pairs, targets), save it to `out_dir`, log the run.

    Shared by the teacher and student stages; the resumable checkpoint is removed once
    the model is saved. Under `accelerate launch` every process trains, but only the main
    one opens the MLflow run and writes the model, log and checkpoint removal.
    """
    from prefshift.methods import build_objective
    from prefshift.tracking import runs as tracking

    state = process_state()
    stage = "teacher" if method == "teacher" else "train"
    opened = (
        tracking.stage_run(params, layout, stage, None if method == "teacher" else method)
        if state.is_main_process
        else nullcontext(None)
    )
    with opened as run:
        seed_everything(params.seed)
        model, tokenizer = load_reward_model(base_dir, trust_remote_code=params.backbone.trust_remote_code)
        objective = build_objective(method, params, model.num_layers)
        skips = SkipCounter()
        items = Encoder(tokenizer, params.encode).encode_pairs(pairs, targets, skips)
        ckpt = layout.checkpoint_dir(name)
        reference, anchor = shared_reference(params, layout, objective, items, cfg)
        model, log = train_reward_model(
            model,
            tokenizer,
            items,
            objective,
            cfg,
            seed=params.seed,
            name=name,
            anchor=anchor,
            checkpoint_dir=ckpt,
            reference=reference,
            on_record=None if run is None else _publish(run),
        )
        log["skips"] = skips.as_dict()
        state.wait_for_everyone()
        if run is None:
            return log
        _save(model, tokenizer, log, params, layout, name=name, method=method, out_dir=out_dir)
        shutil.rmtree(ckpt, ignore_errors=True)
        run.log_metrics({"wall_s": log["wall_s"], "peak_rss_mb": log["peak_rss_mb"], "skips": log["skips"]})
        final = log["drift"][-1]
        run.log_metrics({"final_drift_mean_cosine": _mean_layers(final)})
        if "reference" in log:
            run.set_tags({"anchor.reference_route": log["reference"]["route"]})
        run.log_artifact(layout.train_log(name), "train")
    return log
