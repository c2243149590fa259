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
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import nullcontext
from pathlib import Path

import torch
from torch import nn

from prefshift.core.errors import PrefshiftError
from prefshift.engine.reference_store import half
from prefshift.methods.anchor import select_response

HiddenFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None], Sequence[torch.Tensor]]
"""(input_ids, attention_mask, groups) → hidden states; `groups` as in `RewardModel.forward`."""
Key = tuple[str, str]


def hidden_fn(model: nn.Module, disable_adapter: bool = False) -> HiddenFn:
    """A gradient-free `(input_ids, attention_mask, groups) -> hidden_states` for a RewardModel."""

    def run(
        input_ids: torch.Tensor, attention_mask: torch.Tensor, groups: torch.Tensor | None = None
    ) -> Sequence[torch.Tensor]:
        device = next(model.parameters()).device
        ctx = model.hf.disable_adapter() if disable_adapter else nullcontext()
        groups = groups.to(device) if groups is not None else None
        with torch.no_grad(), ctx:
            out = model(
                input_ids.to(device), attention_mask.to(device), output_hidden_states=True, groups=groups
            )
        return out.hidden_states

    return run


class _Stop(Exception):
    """Raised by the hook of the deepest needed layer: nothing above it is computed."""


def _decoder_layers(model: nn.Module) -> nn.ModuleList | None:
    base = model.hf.base_model
    layers = getattr(base, "layers", None)
    if layers is None and hasattr(base, "encoder"):
        layers = getattr(base.encoder, "layer", None)
    return layers if isinstance(layers, nn.ModuleList) and len(layers) == model.num_layers else None


def hidden_upto(model: nn.Module, deepest: int) -> HiddenFn:
    """Like `hidden_fn`, but the forward stops after layer `deepest` (hidden_states index).

    hidden_states[k] for k < L is the raw output of block k; hidden_states[L] is the
    final-norm output, so a reference that needs layer L runs the whole model. Entries
    above `deepest` are returned as None. With `groups`, the blocks see the shared-prefix packing
    (`RewardModel.packing`) and their outputs are unpacked into the sequences' own layout.
    """
    blocks = _decoder_layers(model)
    if deepest >= model.num_layers or blocks is None:
        return hidden_fn(model)

    def run(
        input_ids: torch.Tensor, attention_mask: torch.Tensor, groups: torch.Tensor | None = None
    ) -> Sequence[torch.Tensor | None]:
        captured: list[torch.Tensor | None] = [None] * (model.num_layers + 1)
        device = next(model.parameters()).device
        input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
        groups = groups.to(device) if groups is not None else None
        packing = model.packing(input_ids, attention_mask, groups)

        def keep(k: int):
            def hook(_module, _args, output):
                captured[k] = output[0] if isinstance(output, tuple) else output
                if k == deepest:
                    raise _Stop

            return hook

        handles = [blocks[k - 1].register_forward_hook(keep(k)) for k in range(1, deepest + 1)]
        try:
            with torch.no_grad():
                model(input_ids, attention_mask, groups=groups)
        except _Stop:
            pass
        finally:
            for handle in handles:
                handle.remove()
        if packing is None:
            return captured
        return [h if h is None else packing.unpack(h) for h in captured]

    return run


def frozen_copy(model: nn.Module) -> nn.Module:
    """A copy that never trains: eval mode, no gradients."""
    ref = copy.deepcopy(model)
    ref.eval()
    for param in ref.parameters():
        param.requires_grad_(False)
    return ref


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
        self.route = "in-run cache" if cache else "frozen forward"
        """Where the states come from, for the run log."""
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

    def _run(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        response_mask: torch.Tensor,
        groups: torch.Tensor | None,
    ):
        self.forward_rows += input_ids.shape[0]
        hidden = self.compute(input_ids, attention_mask, groups)
        mask = response_mask.to(hidden[0].device)
        return [
            select_response([h[row : row + 1] for h in hidden], self.layers, mask[row : row + 1])
            for row in range(input_ids.shape[0])
        ]

    def _store(self, key: Key, states: torch.Tensor) -> None:
        states = half(states.cpu())
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
            whole = len(missing) == len(batch["keys"])  # a pair's two sides together: they may share
            states = self._run(
                batch["input_ids"][rows],
                batch["attention_mask"][rows],
                batch["response_mask"][rows],
                batch["groups"] if whole else None,
            )
            for i, row_states in zip(missing, states, strict=True):
                self._store(batch["keys"][i], row_states)

    def get(self, batch: dict, device: torch.device) -> torch.Tensor:
        if not self.cache:
            hidden = self.compute(batch["input_ids"], batch["attention_mask"], batch["groups"])
            self.forward_rows += batch["input_ids"].shape[0]
            mask = batch["response_mask"].to(hidden[0].device)
            return select_response(hidden, self.layers, mask).float().to(device)
        missing = [key for key in batch["keys"] if key not in self.entries]
        if missing:
            raise PrefshiftError(f"reference cache has no states for {missing[0]}; fill() it before training")
        parts = [self._load(key) for key in batch["keys"]]
        return torch.cat(parts, dim=1).to(device=device, dtype=torch.float32)

    def square_sums(self, batches: Iterable[dict] = ()) -> tuple[torch.Tensor, int]:
        """(per-layer sum of squared states, number of token-dims) over response tokens.

        Cached: over the stored states. Uncached: one gradient-free pass of the reference over
        `batches` (the training data), since nothing is stored to measure. Sums, not means, so
        that processes holding different shares of the data can add theirs up.
        """
        parts = (self._load(key) for key in self.entries) if self.cache else self._states(batches)
        totals = torch.zeros(len(self.layers), dtype=torch.float64)
        count = 0
        for states in parts:
            totals += states.double().pow(2).sum(dim=(1, 2)).cpu()
            count += states.shape[1] * states.shape[2]
        return totals, count

    def _states(self, batches: Iterable[dict]) -> Iterator[torch.Tensor]:
        for batch in batches:
            hidden = self.compute(batch["input_ids"], batch["attention_mask"], batch["groups"])
            yield select_response(hidden, self.layers, batch["response_mask"].to(hidden[0].device))

    def stats(self) -> dict[str, float]:
        return {
            "entries": len(self.entries),
            "memory_mb": self.bytes_in_memory / 2**20,
            "spilled": self.spilled,
            "forward_rows": self.forward_rows,
        }
