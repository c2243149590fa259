"""What a training variant actually computed, read from inside its process.

A throughput ratio only means something when both sides did the same work in the same
arithmetic. So every variant's backbone gets a forward pre-hook that counts the training
forwards it runs (gradient-enabled calls only: drift probes and reference fills run under
`no_grad`) — pairs, real (attention-mask) tokens, computed (padded) tokens, and an
order-free fingerprint of the real token ids — and notes what the arithmetic was: autocast
dtype, parameter dtype, attention implementation, gradient checkpointing, torch threads.
A global optimizer hook notes the optimizer and its kernel (fused / foreach / for-loop).
The settings are observed, not taken from the configuration: TRL's `RewardConfig`
defaults to bf16 autocast and gradient checkpointing even when the run is on CPU.

Our `RewardModel` may pack a pair into one row (the shared-prefix forward), so for it the
sequences, real tokens and fingerprint are read where the pair enters the model, and only the
computed tokens (what the backbone actually ran, padding included) at the backbone.
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import torch
from torch import nn
from torch.autograd.profiler import record_function
from torch.optim.optimizer import register_optimizer_step_pre_hook

SIDE_RANGE = "prefshift::no_grad_forward"
MODULUS = 2**61 - 1
"""The fingerprint is a sum of per-sequence hashes modulo a prime: independent of order."""


def _sequence_hash(ids: list[int]) -> int:
    digest = hashlib.blake2b(repr(ids).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def fingerprint(sequences: list[list[int]], times: int = 1) -> str:
    """The fingerprint `WorkCounter` reports after training `times` times on `sequences`."""
    total = sum(_sequence_hash(ids) for ids in sequences) * times % MODULUS
    return f"{total:016x}"


def cpu_bf16_features() -> list[str]:
    """The CPU's native bf16 instructions (AVX512-BF16, AMX): without them bf16 autocast on CPU
    converts in software and a bf16 matmul can be many times slower than an fp32 one."""
    cpuinfo = Path("/proc/cpuinfo")
    if not cpuinfo.exists():
        return []
    for line in cpuinfo.read_text().splitlines():
        if line.startswith("flags"):
            return sorted({f for f in line.split(":", 1)[1].split() if "bf16" in f})
    return []


def backbone_of(model: nn.Module) -> nn.Module:
    """The transformer body under a `*ForSequenceClassification` (or our RewardModel around one)."""
    hf = getattr(model, "hf", model)
    hf = hf.get_base_model() if hasattr(hf, "get_base_model") else hf
    return getattr(hf, hf.base_model_prefix)


def _optimizer_kernel(optimizer: torch.optim.Optimizer) -> str:
    defaults = optimizer.defaults
    if defaults.get("fused"):
        return "fused"
    if defaults.get("foreach"):
        return "foreach"
    return "for-loop" if defaults.get("foreach") is False else "default (for-loop on CPU)"


class WorkCounter:
    """Attach to the model a variant trains (after warm-up), read `summary()` after the timed run."""

    def __init__(self, model: nn.Module, pad_to_multiple_of: int | None):
        self.backbone = backbone_of(model)
        self.pad_to_multiple_of = pad_to_multiple_of or 1
        self.forwards = 0
        self.sequences = 0
        self.real_tokens = 0
        self.computed_tokens = 0
        self._hash_sum = 0
        self.side_forwards = 0
        self.side_real_tokens = 0
        self.side_s = 0.0
        self._side_start = 0.0
        self.autocast: set[str] = set()
        self.optimizer: dict | None = None
        self._side_range: record_function | None = None
        self._outer = model if hasattr(model, "pair_counts") else None
        self._hooks = [
            self.backbone.register_forward_pre_hook(self._on_forward, with_kwargs=True),
            self.backbone.register_forward_hook(self._after_forward),
            register_optimizer_step_pre_hook(self._on_step),
        ]
        if self._outer is not None:
            self._hooks.append(self._outer.register_forward_pre_hook(self._on_sequences, with_kwargs=True))

    @staticmethod
    def _ids_and_mask(args: tuple, kwargs: dict) -> tuple[torch.Tensor, torch.Tensor]:
        input_ids = args[0] if args else kwargs["input_ids"]
        mask = kwargs.get("attention_mask")
        if mask is None:
            mask = args[1] if len(args) > 1 else torch.ones_like(input_ids)
        return input_ids, mask

    def _on_sequences(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        """Our RewardModel's input: the sequences a call scores, however it then computes them."""
        input_ids, mask = self._ids_and_mask(args, kwargs)
        if not torch.is_grad_enabled():
            self.side_real_tokens += int(mask.sum())
            return
        self._count_sequences(input_ids, mask)

    def _count_sequences(self, input_ids: torch.Tensor, mask: torch.Tensor) -> None:
        self.sequences += input_ids.shape[0]
        self.real_tokens += int(mask.sum())
        for row, keep in zip(input_ids.tolist(), mask.bool().tolist(), strict=True):
            real = [t for t, k in zip(row, keep, strict=True) if k]
            self._hash_sum = (self._hash_sum + _sequence_hash(real)) % MODULUS

    def _on_forward(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        input_ids, mask = self._ids_and_mask(args, kwargs)
        if not torch.is_grad_enabled():
            # Work a variant does besides training (our drift probes): counted apart, and
            # labelled so a profile can say what share of the time it takes.
            self.side_forwards += 1
            if self._outer is None:
                self.side_real_tokens += int(mask.sum())
            self._side_range = record_function(SIDE_RANGE)
            self._side_range.__enter__()
            self._side_start = time.perf_counter()
            return
        self.forwards += 1
        self.computed_tokens += input_ids.numel()
        if self._outer is None:
            self._count_sequences(input_ids, mask)
        device = input_ids.device.type
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else None
        self.autocast.add(str(dtype).removeprefix("torch.") if dtype is not None else "off")

    def _after_forward(self, module: nn.Module, args: tuple, output) -> None:
        if self._side_range is not None:
            self.side_s += time.perf_counter() - self._side_start
            self._side_range.__exit__(None, None, None)
            self._side_range = None

    def _on_step(self, optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
        inner = getattr(optimizer, "optimizer", optimizer)  # accelerate wraps the optimizer
        self.optimizer = {"name": type(inner).__name__, "kernel": _optimizer_kernel(inner)}

    def close(self) -> None:
        for hook in self._hooks:
            hook.remove()

    def summary(self) -> dict:
        """Work done and the arithmetic it was done in (call after the timed run)."""
        self.close()
        config = self.backbone.config
        param_dtype = next(self.backbone.parameters()).dtype
        autocast = sorted(self.autocast)
        return {
            "work": {
                "forwards": self.forwards,
                "pairs": self.sequences // 2,
                "real_tokens": self.real_tokens,
                "computed_tokens": self.computed_tokens,
                "fingerprint": f"{self._hash_sum:016x}",
            },
            "side_work": {
                "no_grad_forwards": self.side_forwards,
                "real_tokens": self.side_real_tokens,
                "wall_s": self.side_s,
            },
            "settings": {
                "precision": _precision(param_dtype, autocast),
                "autocast": autocast,
                "attn_implementation": config._attn_implementation,
                "gradient_checkpointing": _checkpointing(self.backbone),
                "pad_to_multiple_of": self.pad_to_multiple_of,
                "threads": torch.get_num_threads(),
                "optimizer": self.optimizer,
            },
        }


def _checkpointing(backbone: nn.Module) -> bool:
    return any(getattr(m, "gradient_checkpointing", False) is True for m in backbone.modules())


def _precision(param_dtype: torch.dtype, autocast: list[str]) -> str:
    params = str(param_dtype).removeprefix("torch.")
    mixed = [a for a in autocast if a != "off"]
    return f"{'/'.join(mixed)} autocast, {params} weights" if mixed else params
