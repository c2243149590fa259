"""The two batching choices our trainer and scorer make, and what they are measured against.

The ablations swap one function in the module that runs the loop (`prefshift.engine.train` or
`prefshift.engine.scoring`) inside a benchmark's own process, so the rest of the loop is
exactly the shipped one and only the batching differs.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from contextlib import contextmanager
from functools import partial
from types import ModuleType

import torch.nn.functional as F

from prefshift.data.encode import EncodedPair, collate


def random_batches(lengths: Sequence[int], batch_size: int, seed: int, mega: int = 50) -> list[list[int]]:
    """A seeded shuffle cut into batches: what a plain random sampler (TRL's default) does."""
    order = list(range(len(lengths)))
    random.Random(seed).shuffle(order)
    return [order[j : j + batch_size] for j in range(0, len(order), batch_size)]


def fixed_collate(items: Sequence[EncodedPair], pad_id: int, padding_side: str = "right", *, width: int):
    """`collate`, then right-padded to `width` tokens: every batch costs max_length per row."""
    batch = collate(items, pad_id, padding_side)
    extra = width - batch["input_ids"].shape[1]
    if extra > 0:
        batch["input_ids"] = F.pad(batch["input_ids"], (0, extra), value=pad_id)
        batch["attention_mask"] = F.pad(batch["attention_mask"], (0, extra), value=0)
        batch["response_mask"] = F.pad(batch["response_mask"], (0, extra), value=False)
    return batch


@contextmanager
def swapped(module: ModuleType, name: str, value):
    old = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, old)


def ablation(module: ModuleType, kind: str, width: int):
    """Context manager for `kind`: shipped | random_batches | fixed_padding."""
    if kind == "random_batches":
        return swapped(module, "length_grouped_batches", random_batches)
    if kind == "fixed_padding":
        return swapped(module, "collate", partial(fixed_collate, width=width))
    if kind == "shipped":
        return swapped(module, "collate", module.collate)
    raise ValueError(f"unknown batching ablation {kind!r}")
