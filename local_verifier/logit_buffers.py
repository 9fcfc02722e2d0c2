"""Memory for a CPU step's logits that later steps reuse.

A step's logits are its largest transient block (32 rows of a 128,256-token vocabulary:
16 MiB), in a size that follows its rows. From the C heap, blocks of changing sizes leave
fragments the heap keeps: a 1B model's engine grew 14 MiB over its start-up steps of 8-16
rows and 24 MiB over its chunked ones. Here they lie over mappings of their own, each reused
once no tensor holds it, so a step neither grows the heap nor faults its pages in again."""

from __future__ import annotations

import mmap
import sys
import threading

import torch


class LogitBuffers:
    """Float32 ``[rows, vocab]`` tensors over up to ``count`` mappings of ``max_rows`` rows.

    A mapping is free when nothing but this pool refers to it: a tensor over it, or any view
    of one, holds a reference until its storage is freed. A caller that keeps a step's logits
    keeps its mapping out of use; past ``count`` mappings in use, or more rows than
    ``max_rows``, a tensor comes from torch's allocator."""

    def __init__(self, vocab: int, max_rows: int, count: int = 2) -> None:
        self.vocab = vocab
        self.max_rows = max_rows
        self._count = count
        self._maps: list[mmap.mmap] = []
        self._lock = threading.Lock()  # a free mapping is handed to one caller

    def empty(self, rows: int) -> torch.Tensor:
        """An uninitialised float32 ``[rows, vocab]`` tensor."""
        if not 0 < rows <= self.max_rows:
            return torch.empty(rows, self.vocab)
        with self._lock:
            for i in range(len(self._maps)):
                if sys.getrefcount(self._maps[i]) == 2:  # the list's and this call's only
                    return self._view(self._maps[i], rows)
            if len(self._maps) < self._count:
                size = self.max_rows * self.vocab * 4
                self._maps.append(mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS))
                return self._view(self._maps[-1], rows)
        return torch.empty(rows, self.vocab)

    def _view(self, mapping: mmap.mmap, rows: int) -> torch.Tensor:
        values = torch.frombuffer(mapping, dtype=torch.float32, count=rows * self.vocab)
        return values.view(rows, self.vocab)
