"""A step's logits computed from its picked rows' hidden states a chunk of rows at a time."""

from __future__ import annotations

import time
from bisect import bisect_right
from collections.abc import Callable, Iterator, Sequence
from itertools import accumulate
from typing import overload

import torch

# rows of logits a step holds at once where it picks more (a 128,256-token vocabulary's 192
# rows are 94 MiB, 32 rows 16 MiB); each further chunk reads the head's weights again
LOGIT_ROWS = 32


class ChunkedLogits(Sequence[torch.Tensor]):
    """Per sequence float32 logits of a step, as ``Transformer.step`` returns them, computed
    by ``head`` from the picked rows' final-normed states (``hidden`` [P, dim], ``counts``
    rows per sequence) when first read, with the rest of their chunk: consecutive sequences
    of at most ``max_rows`` rows in all (a longer sequence alone). Reading another chunk
    frees the last one's logits, so a step with many rows holds about ``max_rows`` rows of
    them at a time, read in order. ``head`` on fewer rows gives each row the same bits (its
    kernels are batch-invariant), so the logits are the unchunked step's."""

    def __init__(
        self,
        hidden: torch.Tensor,
        counts: Sequence[int],
        head: Callable[[torch.Tensor], torch.Tensor],
        max_rows: int,
    ) -> None:
        self._hidden = hidden
        self._counts = list(counts)
        self._head = head
        self._starts = [0, *accumulate(self._counts)]  # each sequence's first row
        self._bounds = [0]  # each chunk's first sequence, then the sequence count
        for i in range(1, len(self._counts)):
            if self._starts[i + 1] - self._starts[self._bounds[-1]] > max_rows:
                self._bounds.append(i)
        self._bounds.append(len(self._counts))
        self._first = -1  # the held chunk's first sequence
        self._held: list[torch.Tensor] = []
        self.head_seconds = 0.0  # spent in ``head`` so far (the step's cost includes it)

    def __len__(self) -> int:
        return len(self._counts)

    @overload
    def __getitem__(self, index: int) -> torch.Tensor: ...
    @overload
    def __getitem__(self, index: slice) -> list[torch.Tensor]: ...
    def __getitem__(self, index: int | slice) -> torch.Tensor | list[torch.Tensor]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError("sequence index out of range")
        first = self._hold(bisect_right(self._bounds, index) - 1)
        return self._held[index - first]

    def __iter__(self) -> Iterator[torch.Tensor]:
        # Sequence's own iterator keeps the last item it gave in its frame, and so that
        # item's chunk while the next one is computed
        for index in range(len(self)):
            yield self[index]

    def read_all(self) -> None:
        """Compute every chunk in order, handing none out (a step timed, its logits unused):
        at most one chunk's logits are held at a time."""
        for chunk in range(len(self._bounds) - 1):
            self._hold(chunk)
        self._held, self._first = [], -1

    def _hold(self, chunk: int) -> int:
        """Chunk ``chunk``'s logits held (computed unless they are); its first sequence.
        The last chunk's are let go first: a caller that holds none of its tensors has it
        freed before the next one is computed."""
        first, end = self._bounds[chunk], self._bounds[chunk + 1]
        if first != self._first:
            self._held = []
            began = time.perf_counter()
            rows = self._hidden[self._starts[first] : self._starts[end]]
            self._held = list(self._head(rows).split(self._counts[first:end]))
            self.head_seconds += time.perf_counter() - began
            self._first = first
        return first
