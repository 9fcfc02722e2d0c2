"""What every row of a step attends to, packed for the attention kernels."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import torch


@dataclass
class AttentionPlan:
    """Per sequence s: rows ``[row_start[s], row_start[s+1])`` and the key list
    ``keys[key_start[s]:key_start[s+1]]`` = its ``ctx_len[s]`` context slots, then its new
    rows' slots. Row i attends to every context key, then to new row j when
    ``masks[mask_start[s] + i * T + j]`` (T = the sequence's rows) or, with
    ``mask_start[s] == -1``, when j <= i. Index tensors are int64 on the CPU."""

    keys: torch.Tensor
    key_start: torch.Tensor
    row_start: torch.Tensor
    ctx_len: torch.Tensor
    masks: torch.Tensor
    mask_start: torch.Tensor
    _pointers: tuple[int, ...] | None = field(default=None, init=False, repr=False)
    _rows_on: dict[torch.device, tuple[torch.Tensor, list[int]]] = field(
        default_factory=dict, init=False, repr=False
    )

    @classmethod
    def build(
        cls,
        context_slots: list[torch.Tensor],
        new_slots: list[torch.Tensor],
        masks: list[torch.Tensor | None],
    ) -> AttentionPlan:
        """The plan for sequences given by their context slots, new slots and masks."""
        rows = [len(s) for s in new_slots]
        contexts = [len(c) for c in context_slots]
        keys = [t for c, n in zip(context_slots, new_slots, strict=True) for t in (c, n)]
        starts, flat, offset = [], [], 0
        for mask in masks:
            if mask is None:
                starts.append(-1)
                continue
            starts.append(offset)
            flat.append(mask.to(device="cpu", dtype=torch.bool).reshape(-1))
            offset += flat[-1].numel()
        return cls(
            keys=torch.cat([k.to("cpu", torch.long) for k in keys]),
            key_start=_offsets([c + n for c, n in zip(contexts, rows, strict=True)]),
            row_start=_offsets(rows),
            ctx_len=torch.tensor(contexts, dtype=torch.long),
            masks=torch.cat(flat) if flat else torch.zeros(0, dtype=torch.bool),
            mask_start=torch.tensor(starts, dtype=torch.long),
        )

    def pointers(self) -> tuple[int, ...]:
        """The addresses of keys, key_start, row_start, ctx_len, masks and mask_start (for
        the C++ kernel; taken once per plan)."""
        if self._pointers is None:
            tensors = (
                self.keys, self.key_start, self.row_start, self.ctx_len, self.masks,
                self.mask_start,
            )  # fmt: skip
            self._pointers = tuple(t.data_ptr() for t in tensors)
        return self._pointers

    def row_key_lists(self, device: torch.device) -> tuple[torch.Tensor, list[int]]:
        """Every row's ``row_keys`` joined in row order on ``device``, and their lengths:
        built and copied once per plan, for all the layers of its step."""
        if device not in self._rows_on:
            rows = [self.row_keys(r) for r in range(int(self.row_start[-1]))]
            joined = torch.cat(rows) if rows else self.keys[:0]
            self._rows_on[device] = (joined.to(device), [len(r) for r in rows])
        return self._rows_on[device]

    def windowed(self, window: int) -> AttentionPlan:
        """The plan with every row's key list cut to its last ``window`` keys (sliding-window
        attention), each row then its own one-row sequence: the cut list depends on the row
        alone, so chunks, trees and batches keep the same bits. ``self`` where no list is
        longer than ``window``."""
        longest = int((self.ctx_len + self.row_start.diff()).max()) if len(self.ctx_len) else 0
        if longest <= window:
            return self
        rows = [self.row_keys(r)[-window:] for r in range(int(self.row_start[-1]))]
        return AttentionPlan.build(
            [r[:-1] for r in rows], [r[-1:] for r in rows], [None] * len(rows)
        )

    def row_keys(self, row: int) -> torch.Tensor:
        """The slots ``row`` attends to, in attention order."""
        s = int(torch.searchsorted(self.row_start, row, right=True)) - 1
        i = row - int(self.row_start[s])
        t = int(self.row_start[s + 1] - self.row_start[s])
        c = int(self.ctx_len[s])
        keys = self.keys[int(self.key_start[s]) : int(self.key_start[s + 1])]
        start = int(self.mask_start[s])
        if start < 0:
            return keys[: c + i + 1]
        allowed = self.masks[start + i * t : start + (i + 1) * t]
        return torch.cat([keys[:c], keys[c:][allowed]])


def _offsets(counts: list[int]) -> torch.Tensor:
    return torch.tensor([0, *itertools.accumulate(counts)], dtype=torch.long)
