"""Static, preallocated key/value cache for one sequence."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from local_verifier.model import ModelConfig


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
        shape = (cfg.n_layers, cfg.n_kv_heads, max_len, cfg.head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self._k_layers = self.k.unbind(0)  # per-layer views, indexed once per write
        self._v_layers = self.v.unbind(0)
        self.max_len = max_len
        self.length = 0

    def write(
        self, layer: int, k: torch.Tensor, v: torch.Tensor, t: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store k/v [kv_heads, t, head_dim] at [length, length + t); return keys/values so far."""
        end = self.length + t
        keys, values = self._k_layers[layer], self._v_layers[layer]
        keys[:, self.length : end] = k
        values[:, self.length : end] = v
        return keys[:, :end], values[:, :end]

    def truncate(self, n: int) -> None:
        """Keep the first ``n`` slots."""
        if not 0 <= n <= self.length:
            raise ValueError(f"cannot truncate a cache of length {self.length} to {n}")
        self.length = n

    def compact(self, slots: Sequence[int], start: int) -> None:
        """Copy the K/V at absolute ``slots`` to start, start + 1, ... in every layer."""
        if not slots:
            return
        src = torch.as_tensor(list(slots), device=self.k.device, dtype=torch.long)
        if start + len(slots) > self.max_len:
            raise ValueError("compacted slots exceed the cache")
        self.k[:, :, start : start + len(slots)] = self.k[:, :, src]
        self.v[:, :, start : start + len(slots)] = self.v[:, :, src]

    def reset(self) -> None:
        """Forget every slot."""
        self.length = 0

    def nbytes(self) -> int:
        """Bytes reserved by the cache."""
        return self.k.numel() * self.k.element_size() * 2
