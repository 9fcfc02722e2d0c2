"""One sequence's K/V in slots [0, max_len) of its own ``KVStorage`` (batch-1 decoding)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from local_verifier.config import ModelConfig
from local_verifier.kv_storage import KVStorage


class KVCache:
    """K/V for every layer in slots [0, max_len); ``length`` slots are committed.

    Truncation is O(1) (slots past ``length`` are overwritten by later writes).
    """

    def __init__(
        self,
        cfg: ModelConfig,
        max_len: int,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
    ) -> None:
        self.storage = KVStorage(cfg, max_len, device, dtype)
        self.max_len = max_len
        self.length = 0

    def truncate(self, n: int) -> None:
        """Keep the first ``n`` slots."""
        if not 0 <= n <= self.length:
            raise ValueError(f"cannot truncate a cache of length {self.length} to {n}")
        self.length = n

    def compact(self, slots: Sequence[int], start: int) -> None:
        """Copy the K/V at absolute ``slots`` to start, start + 1, ... in every layer."""
        if not slots:
            return
        if start + len(slots) > self.max_len:
            raise ValueError("compacted slots exceed the cache")
        src = torch.as_tensor(list(slots), dtype=torch.long)
        self.storage.copy_slots(torch.arange(start, start + len(slots)), src)

    def reset(self) -> None:
        """Forget every slot."""
        self.length = 0

    def nbytes(self) -> int:
        """Bytes reserved by the cache."""
        return self.storage.nbytes()
