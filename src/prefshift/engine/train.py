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
import sys
import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from prefshift.config.params import AnchorConfig, TrainConfig
from prefshift.core.atomic import atomic_path, recover_interrupted_swap
from prefshift.core.errors import PrefshiftError
from prefshift.core.host import cpu_only, process_state
from prefshift.core.progress import ProgressReporter, track
from prefshift.data.encode import EncodedPair, collate, length_grouped_batches, sorted_batches
from prefshift.data.schema import content_hash
from prefshift.engine.anchor_cache import ReferenceStates, frozen_copy, hidden_fn
from prefshift.engine.reference_store import StoredReference
from prefshift.methods.anchor import select_response
from prefshift.methods.base import BatchOut, Objective
from prefshift.models.reward import (
    RewardModel,
    _peft_base,
    is_decoder_head,
    shared_prefix_refusal,
)

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

    The flag is set on torch's core directly: `torch.use_deterministic_algorithms` also imports
    TorchInductor to set its compiler's flag, 1.3 s of every stage process's start-up here, and
    nothing in prefshift compiles (no `torch.compile`).
    """
    random.seed(seed)
    torch.manual_seed(seed)
    if not torch.cuda.is_available():
        torch._C._set_deterministic_algorithms(True, warn_only=True)
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
    hidden = hidden_fn(model)(batch["input_ids"], batch["attention_mask"], batch["groups"])
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
    input_ids = batch["input_ids"].to(device)
    out = model(
        input_ids,
        batch["attention_mask"].to(device),
        output_hidden_states=bool(objective.layers),
        groups=batch["groups"].to(device),
    )
    half = len(batch["keys"]) // 2
    delta = out.rewards[:half] - out.rewards[half:]
    read_start = time.perf_counter()
    ref_states = reference.get(batch, device) if reference is not None else None
    read_s = time.perf_counter() - read_start
    mask = batch["response_mask"].to(device)
    batch_out = BatchOut(delta, targets, out.hidden_states, mask, ref_states, input_ids)
    loss, extra = objective.loss(batch_out, step, total_steps)
    return loss, delta.detach(), extra, read_s


def pair_forward_log(model: RewardModel) -> dict:
    """Which path computed the pairs (`shared_prefix` or `two_sequence`), the setting and why a
    decoder could not share, and the forwards and tokens (padding included) each path computed in
    this run and process (a resumed run counts only what it computed after resuming)."""
    return {
        "path": model.pair_path(),
        "setting": model.pair_forward,
        "refusal": shared_prefix_refusal(model.hf),
        **model.pair_counts,
    }


def _ignore(series: str, row: dict) -> None:
    """The observer when nobody watches."""


@dataclass
class _Window:
    """Sums over the current logging window, carried in checkpoints so a resumed run logs the
    same averages as an uninterrupted one."""

    loss: float = 0.0
    acc: float = 0.0
    n: int = 0

    def add(self, loss: float, acc: float) -> None:
        self.loss += loss
        self.acc += acc
        self.n += 1

    def as_list(self) -> list:
        return [self.loss, self.acc, self.n]


@dataclass
class _Loop:
    """What one training run holds from batch to batch; its methods are the loop's phases."""

    name: str
    cfg: TrainConfig
    accelerator: object
    model: torch.nn.Module
    unwrapped: RewardModel
    optimizer: torch.optim.Optimizer
    scheduler: object
    objective: Objective
    reference: ReferenceStates | StoredReference | None
    trainable: list
    total_steps: int
    fingerprint: str
    probe: dict
    probe_ref: torch.Tensor
    checkpoint_dir: Path | None
    log: RunLog
    step: int
    window: _Window
    last_ckpt: Path | None
    record: Observer = _ignore
    read_s: float = 0.0
    pairs_done: int = 0
    extra: dict = field(default_factory=dict)

    def run(
        self,
        items: Sequence[EncodedPair],
        schedule: list[list[list[int]]],
        start: tuple[int, int],
        pad_id: int,
        progress: bool,
    ) -> None:
        """Every batch from `start` (epoch, batch) on, with plain progress lines; drift at the end."""
        for series, rows in (
            ("train", self.log.steps),
            ("drift", self.log.drift),
            ("drift_mse", self.log.drift_mse),
        ):
            for row in rows:  # a resumed run's observer still sees the whole history
                self.record(series, row)
        report = ProgressReporter(
            f"train {self.name}",
            self.total_steps,
            "steps",
            rate_unit="pairs",
            start=self.step,
            enabled=progress and self.accelerator.is_main_process,
        )
        start_epoch, start_batch = start
        with report:
            for epoch in range(start_epoch, self.cfg.epochs):
                batches = schedule[epoch]
                for bi, idx in enumerate(batches):
                    if epoch == start_epoch and bi < start_batch:
                        continue
                    self.batch(collate([items[i] for i in idx], pad_id), len(idx), epoch)
                    if self.accelerator.sync_gradients:
                        self.optimizer_step(epoch, report)
                        self.checkpoint_if_due(epoch, bi, len(batches))
        if not self.log.drift or self.log.drift[-1]["step"] != self.step:
            self.drift()

    def batch(self, batch: dict, pairs: int, epoch: int) -> None:
        """Forward, loss, backward and (when the accumulation window closes) the optimizer step."""
        accelerator = self.accelerator
        targets = batch["targets"].to(accelerator.device)
        with accelerator.accumulate(self.model):
            loss, delta, self.extra, read = _batch_loss(
                self.model,
                batch,
                targets,
                self.objective,
                self.reference,
                accelerator.device,
                self.step,
                self.total_steps,
            )
            self.read_s += read
            if not torch.isfinite(loss):
                where = (
                    f"; last good checkpoint: {self.last_ckpt}"
                    if self.last_ckpt
                    else "; no checkpoint was written"
                )
                raise TrainingError(
                    f"{self.name}: loss is {loss.item()} at step {self.step} (epoch {epoch}){where}"
                )
            accelerator.backward(loss)
            if accelerator.sync_gradients:
                accelerator.clip_grad_norm_(self.trainable, self.cfg.max_grad_norm)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        acc = ((delta > 0) == (targets > 0.5)).float().mean()
        batch_loss, batch_acc = accelerator.reduce(torch.stack([loss.detach(), acc]), "mean").tolist()
        if self.extra and accelerator.num_processes > 1:
            values = torch.tensor(list(self.extra.values()), dtype=torch.float64).to(accelerator.device)
            self.extra = dict(zip(self.extra, accelerator.reduce(values, "mean").tolist(), strict=True))
        self.window.add(batch_loss, batch_acc)
        self.pairs_done += pairs * accelerator.num_processes

    def optimizer_step(self, epoch: int, report: ProgressReporter) -> None:
        """After a synchronised step: schedule, progress, the log row and drift when they are due."""
        self.scheduler.step()
        self.step += 1
        window = self.window
        report.update(
            self.step, items=self.pairs_done, loss=window.loss / window.n, acc=window.acc / window.n
        )
        if self.step % self.cfg.log_every == 0 or self.step == self.total_steps:
            row = {
                "step": self.step,
                "epoch": epoch,
                "loss": window.loss / window.n,
                "acc": window.acc / window.n,
                "lr": self.scheduler.get_last_lr()[0],
                **self.extra,
            }
            self.log.steps.append(row)
            self.record("train", row)
            self.window = _Window()
        if self.step % self.cfg.drift_every == 0:
            self.drift()

    def checkpoint_if_due(self, epoch: int, bi: int, batches_in_epoch: int) -> None:
        """Save a resumable state every checkpoint_every steps, or at each epoch's end."""
        at_epoch_end = bi == batches_in_epoch - 1
        every = self.cfg.checkpoint_every
        due = self.step % every == 0 if every else at_epoch_end
        if self.checkpoint_dir is None or not due:
            return
        next_epoch, next_batch = (epoch + 1, 0) if at_epoch_end else (epoch, bi + 1)
        state = {
            "step": self.step,
            "epoch": next_epoch,
            "batch": next_batch,
            "fingerprint": self.fingerprint,
            "window": self.window.as_list(),
            "scheduler": self.scheduler.state_dict(),
        }
        _save_checkpoint(self.accelerator, self.checkpoint_dir, {**state, **asdict(self.log)})
        self.last_ckpt = self.checkpoint_dir / "last"

    def drift(self) -> None:
        rows = measure_drift(self.unwrapped, self.probe, self.probe_ref, self.step)
        self.log.add_drift(rows)
        self.record("drift", rows[0])
        self.record("drift_mse", rows[1])


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

    The phases run in a fixed order (seeding, adapters, probe, schedule, reference, optimizer,
    resume) because each may draw random numbers: reordering them changes the trained weights.
    """
    from accelerate import Accelerator

    if not items:
        raise TrainingError(f"{name}: no training pairs left after encoding")
    start_time = time.perf_counter()
    model.pair_counts.clear()  # the log counts this run's forwards, not an earlier phase's
    seed_everything(seed)
    process_state()
    accelerator = Accelerator(
        mixed_precision=mixed_precision(cfg.precision),
        gradient_accumulation_steps=cfg.grad_accum,
        cpu=cpu_only(),
    )
    _prepare_model(model, cfg, accelerator.device)
    if progress and accelerator.is_main_process:
        refusal = shared_prefix_refusal(model.hf)
        why = f" ({refusal})" if refusal and model.pair_forward == "auto" else ""
        print(f"{name}: pairs take the {model.pair_path()} forward{why}", file=sys.stderr)
    pad_id = tokenizer.pad_token_id
    probe_idx = sorted(random.Random(seed).sample(range(len(items)), min(cfg.probe_size, len(items))))
    probe = collate([items[i] for i in probe_idx], pad_id)
    probe_ref = _probe_states(model, probe, list(range(1, model.num_layers + 1)))
    rank, world = accelerator.process_index, accelerator.num_processes
    lengths = [it.length for it in items]
    schedule = [
        rank_batches(lengths, cfg.batch_size, seed * 1000 + e, rank, world) for e in range(cfg.epochs)
    ]
    own = [items[i] for i in sorted({i for batches in schedule for idx in batches for i in idx})]
    fill_s = 0.0
    if reference is None and objective.reference_layers:
        reference, fill_s = _fill_reference(
            model, own, objective, anchor, cfg, pad_id, checkpoint_dir, rank, world
        )
    _set_anchor_scale(objective, reference, accelerator, own, cfg, pad_id)
    loop, start_epoch, start_batch = _open_loop(
        accelerator,
        model,
        objective,
        reference,
        cfg,
        schedule,
        items,
        (probe, probe_ref),
        seed,
        name,
        checkpoint_dir,
    )
    loop.record = on_record or _ignore
    loop.run(items, schedule, (start_epoch, start_batch), pad_id, progress)
    return loop.unwrapped, _result(loop, len(items), time.perf_counter() - start_time, fill_s)


def _prepare_model(model: RewardModel, cfg: TrainConfig, device: torch.device) -> None:
    """LoRA adapters and activation checkpointing when asked for; then onto the device, in train mode."""
    if cfg.lora.enabled:
        apply_lora(model, cfg)
    if cfg.gradient_checkpointing:
        enable_checkpointing(_peft_base(model.hf))
    model.to(device)
    model.train()


def _fill_reference(
    model: RewardModel,
    own: Sequence[EncodedPair],
    objective: Objective,
    anchor: AnchorConfig | None,
    cfg: TrainConfig,
    pad_id: int,
    checkpoint_dir: Path | None,
    rank: int,
    world: int,
) -> tuple[ReferenceStates, float]:
    """The starting checkpoint's states over this process's pairs, and the seconds it took.
    A spilled cache lives beside the checkpoint, one directory per rank."""
    spill = checkpoint_dir / "reference_cache" if checkpoint_dir is not None else None
    if spill is not None and world > 1:
        spill = spill / f"rank{rank}"
    fill_start = time.perf_counter()
    reference = build_reference(
        model, own, objective.reference_layers, anchor or AnchorConfig(), cfg, pad_id, spill
    )
    return reference, time.perf_counter() - fill_start


def _set_anchor_scale(
    objective: Objective, reference, accelerator, own, cfg: TrainConfig, pad_id: int
) -> None:
    """anchor.normalize=reference: per-layer constants from the stored reference, or measured
    here over the training data, unless the caller already set them."""
    if (
        reference is None
        or getattr(objective, "normalize", "none") != "reference"
        or objective.scale is not None
    ):
        return
    if isinstance(reference, StoredReference):
        objective.set_scale(reference.mean_squares())
    else:
        objective.set_scale(_in_run_mean_squares(accelerator, reference, own, cfg.batch_size, pad_id))


def _open_loop(
    accelerator,
    model: RewardModel,
    objective: Objective,
    reference,
    cfg: TrainConfig,
    schedule: list[list[list[int]]],
    items: Sequence[EncodedPair],
    probe: tuple[dict, torch.Tensor],
    seed: int,
    name: str,
    checkpoint_dir: Path | None,
) -> tuple[_Loop, int, int]:
    """Optimizer, linear schedule and accelerate's wrapping; then the checkpoint to resume from,
    if one was written under the same settings. Returns the loop and the (epoch, batch) to start at."""
    from transformers import get_scheduler

    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = adamw(trainable, cfg)
    total_steps = max(1, sum(len(batches) for batches in schedule) // cfg.grad_accum)
    scheduler = get_scheduler(
        "linear",
        optimizer,
        num_warmup_steps=round(cfg.warmup_frac * total_steps),
        num_training_steps=total_steps,
    )
    wrapped, optimizer = accelerator.prepare(model, optimizer)
    fingerprint = content_hash(
        name, objective.name, cfg.model_dump(), seed, [(it.pair_id, it.target) for it in items]
    )
    step, start_epoch, start_batch, log, last_ckpt, window = _restore(
        accelerator, scheduler, checkpoint_dir, fingerprint
    )
    loop = _Loop(
        name=name,
        cfg=cfg,
        accelerator=accelerator,
        model=wrapped,
        unwrapped=accelerator.unwrap_model(wrapped),
        optimizer=optimizer,
        scheduler=scheduler,
        objective=objective,
        reference=reference,
        trainable=trainable,
        total_steps=total_steps,
        fingerprint=fingerprint,
        probe=probe[0],
        probe_ref=probe[1],
        checkpoint_dir=checkpoint_dir,
        log=log,
        step=step,
        window=_Window(*window),
        last_ckpt=last_ckpt,
    )
    return loop, start_epoch, start_batch


def _result(loop: _Loop, pairs: int, wall_s: float, fill_s: float) -> dict:
    """The run's log: the reproducible rows, then timings and memory, kept under their own keys."""
    result = {
        "name": loop.name,
        "objective": loop.objective.name,
        "steps": loop.log.steps,
        "drift": loop.log.drift,
        "drift_mse": loop.log.drift_mse,
        "total_steps": loop.total_steps,
        "pairs": pairs,
        "wall_s": wall_s,
        "peak_rss_mb": _peak_rss_mb(),
        "pair_forward": pair_forward_log(loop.unwrapped),
    }
    if torch.cuda.is_available():
        result["peak_gpu_mb"] = torch.cuda.max_memory_allocated() / 2**20
    reference = loop.reference
    if reference is not None:
        result["reference"] = {"cache": reference.cache, "route": reference.route, **reference.stats()}
        result["reference_fill_s"] = fill_s  # timings, like wall_s: kept out of the reproducible log keys
        result["reference_read_s"] = (
            loop.read_s
        )  # per step: a stored read, a cache lookup or a frozen forward
        if hasattr(reference, "rows_read"):  # stored states read: fewer when a run resumes, so kept apart too
            result["reference_rows_read"] = reference.rows_read
    return result
