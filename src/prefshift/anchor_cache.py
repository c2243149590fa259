"""Reference hidden states for ANCHOR: computed once per example, or live from a frozen copy.

The reference (the student's starting checkpoint) never changes, so its states are
a function of the input alone. The cached path computes them once per (pair, side)
before training, keeps only the response tokens in half precision, holds them in
memory up to a budget and spills the rest to disk. The uncached path runs a frozen
copy every step (or, with LoRA, the same model with its adapters disabled).
"""

from __future__ import annotations

import copy
import shutil
from collections.abc import Callable, Iterable, Sequence
from contextlib import nullcontext
from pathlib import Path

import torch
from torch import nn

from prefshift.errors import PrefshiftError
from prefshift.methods.anchor import select_response

HiddenFn = Callable[[torch.Tensor, torch.Tensor], Sequence[torch.Tensor]]
Key = tuple[str, str]


def hidden_fn(model: nn.Module, disable_adapter: bool = False) -> HiddenFn:
    """A gradient-free `(input_ids, attention_mask) -> hidden_states` for a RewardModel."""

    def run(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> Sequence[torch.Tensor]:
        device = next(model.parameters()).device
        ctx = model.hf.disable_adapter() if disable_adapter else nullcontext()
        with torch.no_grad(), ctx:
            out = model(input_ids.to(device), attention_mask.to(device), output_hidden_states=True)
        return out.hidden_states

    return run


def frozen_copy(model: nn.Module) -> nn.Module:
    """A copy that never trains: eval mode, no gradients."""
    ref = copy.deepcopy(model)
    ref.eval()
    for param in ref.parameters():
        param.requires_grad_(False)
    return ref


def _to_half(states: torch.Tensor) -> torch.Tensor:
    """fp16 keeps more mantissa; fall back to bf16 where fp16 would overflow."""
    half = states.to(torch.float16)
    return half if torch.isfinite(half).all() else states.to(torch.bfloat16)


class ReferenceStates:
    """Reference states (K, N, D) at the response tokens of a collated batch."""

    def __init__(
        self,
        compute: HiddenFn | None,
        layers: Sequence[int],
        cache: bool,
        max_bytes: float = 2e9,
        spill_dir: Path | None = None,
    ):
        self.compute = compute
        self.module: nn.Module | None = None
        """The frozen copy behind `compute`, when there is one (kept for inspection)."""
        self.layers = tuple(layers)
        self.cache = cache
        self.max_bytes = max_bytes
        self.spill_dir = spill_dir
        self.entries: dict[Key, torch.Tensor | Path] = {}
        self.bytes_in_memory = 0
        self.spilled = 0
        self.forward_rows = 0
        if spill_dir is not None and spill_dir.exists():
            shutil.rmtree(spill_dir)

    def _run(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, response_mask: torch.Tensor):
        self.forward_rows += input_ids.shape[0]
        hidden = self.compute(input_ids, attention_mask)
        mask = response_mask.to(hidden[0].device)
        return [
            select_response([h[row : row + 1] for h in hidden], self.layers, mask[row : row + 1])
            for row in range(input_ids.shape[0])
        ]

    def _store(self, key: Key, states: torch.Tensor) -> None:
        states = _to_half(states.cpu())
        size = states.numel() * states.element_size()
        if self.bytes_in_memory + size <= self.max_bytes or self.spill_dir is None:
            self.entries[key] = states
            self.bytes_in_memory += size
            return
        self.spill_dir.mkdir(parents=True, exist_ok=True)
        path = self.spill_dir / f"{len(self.entries)}.pt"
        torch.save(states, path)
        self.entries[key] = path
        self.spilled += 1

    def _load(self, key: Key) -> torch.Tensor:
        entry = self.entries[key]
        return torch.load(entry, weights_only=True) if isinstance(entry, Path) else entry

    def fill(self, batches: Iterable[dict]) -> None:
        """Compute every missing (pair, side) once, before training, while `compute` is the start."""
        for batch in batches:
            missing = [i for i, key in enumerate(batch["keys"]) if key not in self.entries]
            if not missing:
                continue
            rows = torch.tensor(missing)
            states = self._run(
                batch["input_ids"][rows], batch["attention_mask"][rows], batch["response_mask"][rows]
            )
            for i, row_states in zip(missing, states, strict=True):
                self._store(batch["keys"][i], row_states)

    def get(self, batch: dict, device: torch.device) -> torch.Tensor:
        if not self.cache:
            hidden = self.compute(batch["input_ids"], batch["attention_mask"])
            self.forward_rows += batch["input_ids"].shape[0]
            mask = batch["response_mask"].to(hidden[0].device)
            return select_response(hidden, self.layers, mask).float().to(device)
        missing = [key for key in batch["keys"] if key not in self.entries]
        if missing:
            raise PrefshiftError(f"reference cache has no states for {missing[0]}; fill() it before training")
        parts = [self._load(key) for key in batch["keys"]]
        return torch.cat(parts, dim=1).to(device=device, dtype=torch.float32)

    def stats(self) -> dict[str, float]:
        return {
            "entries": len(self.entries),
            "memory_mb": self.bytes_in_memory / 2**20,
            "spilled": self.spilled,
            "forward_rows": self.forward_rows,
        }
