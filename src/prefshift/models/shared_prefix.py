"""The shared-prefix forward: a group of responses to one prompt computes the prompt once.

A preference pair is one prompt with two responses, and a causal decoder's states at the prompt
do not depend on what follows, so running chosen and rejected as two full sequences (what TRL's
`RewardTrainer` and OpenRLHF do, and what prefshift did) computes the prompt twice. Here the
sequences of a group (the two sides of a pair, or every response of a best-of-n group) are packed
into one segment: their longest common token prefix once, then each member's remaining tokens one
after another. A 4-D attention mask lets each token see the shared prefix and the earlier tokens of
its own member only, and position ids restart after the prefix, so every token sees exactly the
keys, at exactly the positions, it sees in its own sequence. Segments are then laid into rows as
tightly as they fit (first-fit decreasing, rows as wide as the widest segment), each seeing only
itself: on ragged lengths a batch pads to its widest pair once instead of every pair doing so.
The states are then gathered back into the two-sequence layout (`Packing.unpack`): rewards,
ANCHOR's response-token MSE, GRM's log-probabilities and drift read the same tensors as before,
and autograd sums the gradients of a shared token's two readers as the two-sequence path sums
those of its two copies.

The prefix is the longest common prefix of the members' *token ids*, not the prompt: the one
rendering tokenises the full text, so a BPE merge at the prompt/response boundary can make it
shorter than the prompt, and responses that begin alike make it longer. Either way it is exact.

Why packing and not a key/value cache (run the prompt, continue each response from its cache):
packing is one forward, so every layer's hidden states come out of one pass (ANCHOR, drift and
GRM need them), activation checkpointing, LoRA and DDP's hooks work unchanged (transformers turns
the cache off under checkpointing in training), and no cache has to be copied per response. Its
cost is attention over the packed width: the kernel computes the masked member-to-member blocks
too, a quadratic term that is small next to the linear layers at reward-model lengths. SDPA and
eager attention take a custom 4-D mask (transformers returns a 4-D mask as given); flash-attention
2 and sliding-window layers do not, and such models keep the two-sequence path.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

ATTENTION = ("sdpa", "eager")
"""Attention implementations that apply an arbitrary 4-D mask as given."""


@dataclass(frozen=True)
class Packing:
    """N sequences of G groups packed into R ≤ G rows of width W, and how to read them back."""

    input_ids: torch.Tensor
    """(R, W) the packed tokens; padding holds token 0 (masked, never read)."""
    position_ids: torch.Tensor
    """(R, W) each token's position in its own sequence."""
    branch: torch.Tensor
    """(R, W) 0 for a shared prefix, j + 1 for member j's own tokens, -1 for padding."""
    segment: torch.Tensor
    """(R, W) the group each token belongs to, -1 for padding."""
    source: torch.Tensor
    """(N, T) flat index into R·W of every (sequence, column); padding columns point at their
    group's first token."""
    last: torch.Tensor
    """(N,) flat index of each sequence's last real token, where a decoder reads its reward."""

    @property
    def tokens(self) -> int:
        """Real tokens the packed forward computes (padding excluded)."""
        return int((self.branch >= 0).sum())

    def attention_mask(self, dtype: torch.dtype | None) -> torch.Tensor:
        """(R, 1, W, W): query q sees key k ≤ q of its own group's shared prefix or its own member.

        Boolean (True = attend) for SDPA; for eager attention (`dtype` given) the additive form,
        0 or the dtype's minimum. Every query sees at least itself, so no softmax row is empty.
        """
        width = self.branch.shape[1]
        order = torch.arange(width, device=self.branch.device)
        causal = order[None, :] <= order[:, None]
        keys, queries = self.branch[:, None, :], self.branch[:, :, None]
        same_group = self.segment[:, None, :] == self.segment[:, :, None]
        allowed = (causal & same_group & ((keys == 0) | (keys == queries)))[:, None]
        if dtype is None:
            return allowed
        zero = torch.zeros((), dtype=dtype, device=allowed.device)
        return torch.where(allowed, zero, torch.finfo(dtype).min)

    def unpack(self, states: torch.Tensor) -> torch.Tensor:
        """(R, W, ...) packed states → (N, T, ...) in the sequences' own layout."""
        flat = states.reshape(-1, *states.shape[2:])
        picked = flat.index_select(0, self.source.reshape(-1))  # its backward is an index_add
        return picked.reshape(*self.source.shape, *states.shape[2:])

    def read_last(self, states: torch.Tensor) -> torch.Tensor:
        """(R, W, D) → (N, D): each sequence's state at its last real token."""
        return states.reshape(-1, states.shape[-1]).index_select(0, self.last)


def right_padded(attention_mask: torch.Tensor) -> bool:
    """Whether every row's real tokens come first (what `collate` gives)."""
    lengths = attention_mask.long().sum(-1, keepdim=True)
    columns = torch.arange(attention_mask.shape[-1], device=attention_mask.device)
    return bool(((columns < lengths) == attention_mask.bool()).all())


def pack(input_ids: torch.Tensor, attention_mask: torch.Tensor, groups: torch.Tensor) -> Packing:
    """Pack right-padded sequences (N, T) by `groups` (N,), values 0..G-1, members in row order.

    Every member of a group keeps its tokens up to the group's longest common prefix at the same
    packed columns; its remaining tokens follow those of the members before it. Groups are then
    placed into rows by `_first_fit`.
    """
    device = input_ids.device
    n, width = input_ids.shape
    lengths = attention_mask.long().sum(-1)
    count = int(groups.max()) + 1
    columns = torch.arange(width, device=device)
    first = torch.full((count,), n, dtype=torch.long, device=device)
    first = first.scatter_reduce(0, groups, torch.arange(n, device=device), "amin")
    leader = first[groups]
    same = (input_ids == input_ids[leader]) & (columns < torch.minimum(lengths, lengths[leader])[:, None])
    common = same.long().cumprod(-1).sum(-1)
    prefix = torch.full((count,), width, dtype=torch.long, device=device)
    prefix = prefix.scatter_reduce(0, groups, common, "amin")[groups]
    own = lengths - prefix
    member_order = torch.argsort(groups, stable=True)
    before = torch.zeros(n, dtype=torch.long, device=device)
    before[member_order] = _exclusive_group_cumsum(own[member_order], groups[member_order])
    member = torch.zeros(n, dtype=torch.long, device=device)
    member[member_order] = _exclusive_group_cumsum(torch.ones_like(own), groups[member_order])
    in_prefix = columns[None, :] < prefix[:, None]
    column = torch.where(in_prefix, columns[None, :], before[:, None] + columns[None, :])
    real = columns[None, :] < lengths[:, None]
    group_width = torch.zeros(count, dtype=torch.long, device=device)
    group_width = group_width.scatter_reduce(
        0, groups, prefix + _group_sum(own, groups, count)[groups], "amax"
    )
    packed_width = int(group_width.max())
    rows, starts = _first_fit(group_width.tolist(), packed_width)
    start = torch.tensor(rows, device=device) * packed_width + torch.tensor(starts, device=device)
    base = start[groups][:, None]
    source = torch.where(real, base + column, base)
    flat = source[real]
    size = len(set(rows)) * packed_width
    packed_ids = torch.zeros(size, dtype=input_ids.dtype, device=device)
    packed_ids[flat] = input_ids[real]
    positions = torch.zeros(size, dtype=torch.long, device=device)
    positions[flat] = columns.expand(n, width)[real]
    branch = torch.full((size,), -1, dtype=torch.long, device=device)
    branch[flat] = torch.where(in_prefix, 0, member[:, None] + 1).expand(n, width)[real]
    segment = torch.full((size,), -1, dtype=torch.long, device=device)
    segment[flat] = groups[:, None].expand(n, width)[real]
    last = source[torch.arange(n, device=device), (lengths - 1).clamp(min=0)]
    shape = (-1, packed_width)
    return Packing(
        packed_ids.view(shape), positions.view(shape), branch.view(shape), segment.view(shape), source, last
    )


def _first_fit(widths: list[int], capacity: int) -> tuple[list[int], list[int]]:
    """(row, start column) of each segment: widest first, each into the first row it fits."""
    free: list[int] = []
    rows, starts = [0] * len(widths), [0] * len(widths)
    for g in sorted(range(len(widths)), key=lambda g: (-widths[g], g)):
        row = next((r for r, left in enumerate(free) if left >= widths[g]), len(free))
        if row == len(free):
            free.append(capacity)
        rows[g], starts[g] = row, capacity - free[row]
        free[row] -= widths[g]
    return rows, starts


def _group_sum(values: torch.Tensor, groups: torch.Tensor, count: int) -> torch.Tensor:
    return torch.zeros(count, dtype=values.dtype, device=values.device).index_add(0, groups, values)


def _exclusive_group_cumsum(values: torch.Tensor, sorted_groups: torch.Tensor) -> torch.Tensor:
    """Sum of the earlier values of the same group, for rows sorted by group."""
    total = values.cumsum(0) - values
    starts = torch.ones_like(sorted_groups, dtype=torch.bool)
    starts[1:] = sorted_groups[1:] != sorted_groups[:-1]
    base = torch.where(starts, total, torch.zeros_like(total))
    return total - base.cummax(0).values
