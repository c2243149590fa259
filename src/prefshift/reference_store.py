"""The shared ANCHOR reference on disk: the strong base's states at every response token, once.

The reference states are a pure function of (strong base, student_train, encoding,
layer), so the reference stage computes them in one gradient-free pass and every
anchor student and sweep point reads them. Layout of the directory:

- `shard-NNNNN.safetensors`: one (tokens, hidden) half-precision tensor per layer
  (`layer_<k>`, k a hidden_states index), rows of many sequences back to back;
  safetensors is memory-mapped, so a student reads only the rows of its batch.
- `index.json`: pair_id, side, shard, offset, n_tokens (one list each): where each sequence's
  rows are. JSON, not parquet: reading a parquet index pulled pyarrow's reader into every anchor
  student, 21 MB of resident memory for a 4,000-row table (what made the shared route's peak RSS
  5-7% above naive's in `prefshift bench`).
- `manifest.json`: layers, hidden size, split version, encoding, totals, each layer's
  mean squared activation over response tokens (the `anchor.normalize` constant), and
  whether the states were stored at all (above `anchor.reference_max_gb` only the
  constants are kept and students fall back to a frozen forward).

A student checks every one of its sequences against the index (present, same token
count) before training, so a reference built from other data or another encoding is
refused instead of silently misaligned.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from prefshift.data.encode import SIDES, EncodedPair
from prefshift.reference_manifest import FORMAT, MANIFEST, ReferenceMismatchError, mean_squares, read_manifest

INDEX = "index.json"
INDEX_COLUMNS = ("pair_id", "side", "shard", "offset", "n_tokens")
SHARD_BYTES = 256 * 2**20
Key = tuple[str, str]


def half(states: torch.Tensor) -> torch.Tensor:
    """fp16 keeps more mantissa; fall back to bf16 where fp16 would overflow."""
    out = states.to(torch.float16)
    return out if torch.isfinite(out).all() else states.to(torch.bfloat16)


def stored_bytes(items: Sequence[EncodedPair], layers: Sequence[int], hidden_size: int) -> int:
    """Size of the shards: response tokens (both sides) × layers × hidden size × 2 bytes."""
    tokens = sum(sum(getattr(it, side).response_mask) for it in items for side in SIDES)
    return tokens * len(layers) * hidden_size * 2


class ReferenceWriter:
    """Accumulates per-sequence states into shards and each layer's sum of squares."""

    def __init__(self, directory: Path, layers: Sequence[int], hidden_size: int, store: bool):
        self.directory = Path(directory)
        self.layers = tuple(layers)
        self.hidden_size = hidden_size
        self.store = store
        self.rows: list[dict[str, Any]] = []
        self.shards: list[str] = []
        self._buffer: list[torch.Tensor] = []
        self._buffer_tokens = 0
        self._squares = torch.zeros(len(self.layers), dtype=torch.float64)
        self.tokens = 0

    def add(self, key: Key, states: torch.Tensor) -> None:
        """`states`: (K, n, D) of one sequence's response tokens, layers in `self.layers` order."""
        n = states.shape[1]
        self._squares += states.double().pow(2).sum(dim=(1, 2))
        self.tokens += n
        if not self.store:
            return
        self.rows.append(
            {
                "pair_id": key[0],
                "side": key[1],
                "shard": len(self.shards),
                "offset": self._buffer_tokens,
                "n_tokens": n,
            }
        )
        self._buffer.append(states.cpu())
        self._buffer_tokens += n
        if self._buffer_tokens * len(self.layers) * self.hidden_size * 2 >= SHARD_BYTES:
            self._flush()

    def _flush(self) -> None:
        from safetensors.torch import save_file

        if not self._buffer:
            return
        joined = torch.cat(self._buffer, dim=1)
        name = f"shard-{len(self.shards):05d}.safetensors"
        save_file(
            {f"layer_{k}": half(joined[i]).contiguous() for i, k in enumerate(self.layers)},
            str(self.directory / name),
        )
        self.shards.append(name)
        self._buffer, self._buffer_tokens = [], 0

    def mean_squares(self) -> dict[int, float]:
        denom = max(self.tokens * self.hidden_size, 1)
        return {k: float(self._squares[i] / denom) for i, k in enumerate(self.layers)}

    def finish(self, **manifest: Any) -> dict[str, Any]:
        """Write the last shard, the index and the manifest; returns the manifest."""
        self._flush()
        if self.store:
            columns = {name: [row[name] for row in self.rows] for name in INDEX_COLUMNS}
            (self.directory / INDEX).write_text(json.dumps(columns) + "\n")
        document = {
            "format": FORMAT,
            "stored": self.store,
            "layers": list(self.layers),
            "hidden_size": self.hidden_size,
            "tokens": self.tokens,
            "sequences": len(self.rows) if self.store else None,
            "shards": self.shards,
            "mean_square": {str(k): v for k, v in self.mean_squares().items()},
            **manifest,
        }
        (self.directory / MANIFEST).write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")
        return document


class StoredReference:
    """Reference states (K, N, D) for a collated batch, read from the shards; never computes.

    Same `get(batch, device)` contract as anchor_cache.ReferenceStates, so the training
    loop does not care where its reference comes from.
    """

    cache = True
    compute = None
    module = None
    route = "shared"

    def __init__(self, directory: Path, layers: Sequence[int]):
        from safetensors import safe_open

        self.directory = Path(directory)
        self.manifest = read_manifest(self.directory)
        if not self.manifest["stored"]:
            raise ReferenceMismatchError(
                f"{self.directory}: the reference was too large to store; {self.manifest.get('reason')}"
            )
        stored = self.manifest["layers"]
        missing = [k for k in layers if k not in stored]
        if missing:
            raise ReferenceMismatchError(
                f"{self.directory} holds layers {stored}, not {missing}: the reference was built for other "
                "anchor methods or anchor.mid_fractions; rerun `prefshift reference`"
            )
        self.layers = tuple(layers)
        self._names = [f"layer_{k}" for k in layers]
        index = json.loads((self.directory / INDEX).read_text())
        self.entries: dict[Key, tuple[int, int, int]] = {
            (p, s): (int(sh), int(o), int(n))
            for p, s, sh, o, n in zip(*map(index.get, INDEX_COLUMNS), strict=True)
        }
        self._files = [
            safe_open(str(self.directory / name), framework="pt") for name in self.manifest["shards"]
        ]
        self._slices = [{name: f.get_slice(name) for name in self._names} for f in self._files]
        self.forward_rows = 0
        self.rows_read = 0

    def check(self, items: Sequence[EncodedPair]) -> None:
        """Refuse a reference that does not match these encoded pairs row for row."""
        for it in items:
            for side in SIDES:
                n = sum(getattr(it, side).response_mask)
                entry = self.entries.get((it.pair_id, side))
                if entry is None:
                    raise ReferenceMismatchError(
                        f"{self.directory}: no reference states for pair {it.pair_id} ({side}); it was built "
                        "from other student_train data: rerun `prefshift reference`"
                    )
                if entry[2] != n:
                    raise ReferenceMismatchError(
                        f"{self.directory}: pair {it.pair_id} ({side}) has {entry[2]} reference tokens but "
                        f"{n} response tokens here: the reference used another encoding (encode.*); "
                        "rerun `prefshift reference`"
                    )

    def mean_squares(self) -> dict[int, float]:
        return mean_squares(self.manifest)

    def get(self, batch: dict, device: torch.device) -> torch.Tensor:
        parts = []
        for key in batch["keys"]:
            shard, offset, n = self.entries[key]
            slices = self._slices[shard]
            parts.append(torch.stack([slices[name][offset : offset + n] for name in self._names]))
        self.rows_read += len(parts)
        return torch.cat(parts, dim=1).to(device=device, dtype=torch.float32)

    def stats(self) -> dict[str, float]:
        return {
            "entries": len(self.entries),
            "shards": len(self._files),
            "forward_rows": 0,
        }
