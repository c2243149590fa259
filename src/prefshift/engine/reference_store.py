"""The shared ANCHOR reference on disk: the strong base's states at every response token, once.

The reference states are a pure function of (strong base, student_train, encoding,
layer), so the reference stage computes them in one gradient-free pass and every
anchor student and sweep point reads them. Layout of the directory:

- `shard-NNNNN.safetensors`: one (tokens, hidden) half-precision tensor per layer
  (`layer_<k>`, k a hidden_states index), rows of many sequences back to back;
  a student memory-maps each layer whole and gathers its batch's rows in one indexed read.
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
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from prefshift.data.encode import SIDES, EncodedPair
from prefshift.engine.reference_manifest import (
    FORMAT,
    MANIFEST,
    ReferenceMismatchError,
    mean_squares,
    read_manifest,
)

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


DTYPES = {"F16": torch.float16, "BF16": torch.bfloat16}
"""The dtypes `half` writes."""


def mapped_layers(path: Path, names: Sequence[str], hidden_size: int) -> list[torch.Tensor]:
    """The named (tokens, hidden) tensors of a shard, in order, as views of the memory-mapped file.

    safetensors' reader copies every slice it hands out, so a batch of 16 sequences took 16
    slice calls (1.35 ms per batch in a micro-benchmark, against 0.2 ms for one indexed read of
    the mapped tensor). The layout is safetensors' documented one: an 8-byte little-endian
    header size, a JSON header of dtype, shape and data offsets per tensor, then the data.
    Anything else is refused with the file's name, so a truncated or foreign shard never
    reads as garbage states.
    """

    def broken(what: str) -> ReferenceMismatchError:
        return ReferenceMismatchError(f"{path}: {what}; rerun `prefshift reference` (or dvc repro)")

    if not path.is_file():
        raise broken("shard listed in the manifest is missing")
    size = path.stat().st_size
    with path.open("rb") as handle:
        head = handle.read(8)
        header_size = struct.unpack("<Q", head)[0] if len(head) == 8 else size
        if header_size > size - 8:
            raise broken("not a safetensors file (truncated or no header)")
        try:
            header = json.loads(handle.read(header_size))
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise broken(f"unreadable safetensors header ({err})") from None
    start_of_data = 8 + header_size
    raw = torch.empty(0, dtype=torch.uint8).set_(torch.UntypedStorage.from_file(str(path), False, size))
    layers = []
    for name in names:
        info = header.get(name) if isinstance(header, dict) else None
        if not isinstance(info, dict) or info.get("dtype") not in DTYPES:
            raise broken(f"no half-precision tensor {name!r}")
        dtype, shape = DTYPES[info["dtype"]], info.get("shape")
        begin, end = (start_of_data + int(o) for o in info.get("data_offsets", (0, -1)))
        rows = shape[0] if isinstance(shape, list) and len(shape) == 2 else -1
        if shape != [rows, hidden_size] or end - begin != rows * hidden_size * 2:
            raise broken(f"tensor {name!r} is {shape} over bytes {begin}-{end}, not (tokens, {hidden_size})")
        if end > size:
            raise broken(f"tensor {name!r} needs bytes up to {end} but the file has {size} (truncated)")
        if begin % 2:
            raise broken(f"tensor {name!r} starts at an odd byte offset ({begin})")
        layers.append(raw[begin:end].view(dtype).view(rows, hidden_size))
    return layers


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
        names = [f"layer_{k}" for k in layers]
        self.hidden_size = int(self.manifest["hidden_size"])
        self._shards = [
            mapped_layers(self.directory / shard, names, self.hidden_size)
            for shard in self.manifest["shards"]
        ]
        index = json.loads((self.directory / INDEX).read_text())
        self.entries: dict[Key, tuple[int, int, int]] = {
            (p, s): (int(sh), int(o), int(n))
            for p, s, sh, o, n in zip(*map(index.get, INDEX_COLUMNS), strict=True)
        }
        for key, (shard, offset, n) in self.entries.items():
            if not (
                0 <= shard < len(self._shards) and offset >= 0 and offset + n <= len(self._shards[shard][0])
            ):
                raise ReferenceMismatchError(
                    f"{self.directory / INDEX}: pair {key[0]} ({key[1]}) points past its shard; "
                    "rerun `prefshift reference` (or dvc repro)"
                )
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
        """One gather per shard and layer: the rows of every sequence of the batch, in batch order."""
        where = torch.tensor([self.entries[key] for key in batch["keys"]], dtype=torch.long)
        shard, offset, n = where.unbind(1)
        first_of_each = torch.cumsum(n, 0) - n
        rows = torch.repeat_interleave(offset - first_of_each, n) + torch.arange(int(n.sum()))
        owner = torch.repeat_interleave(shard, n)
        out = torch.empty(len(self.layers), len(rows), self.hidden_size, dtype=torch.float32)
        for s in torch.unique(shard).tolist():
            picked = owner == s
            for i, layer in enumerate(self._shards[s]):
                out[i, picked] = layer.index_select(0, rows[picked]).float()
        self.rows_read += len(batch["keys"])
        return out.to(device)

    def stats(self) -> dict[str, float]:
        return {
            "entries": len(self.entries),
            "shards": len(self._shards),
            "forward_rows": 0,
        }
