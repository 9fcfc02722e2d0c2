"""K/V tensors of every layer for a fixed number of token slots (the engine's pool owns which
slot holds what)."""

from __future__ import annotations

import torch

from local_verifier import huge_pages
from local_verifier.config import ModelConfig


class KVStorage:
    """K/V of every layer for ``n_slots`` token slots. slot = block * block_size + offset.

    ``k`` and ``v`` are ``[n_layers, n_slots, n_kv_heads, head_dim]``; ``Transformer.step``
    writes each new row's K/V to its slot and reads the slots a row attends to.
    """

    def __init__(
        self,
        cfg: ModelConfig,
        n_slots: int,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
    ) -> None:
        shape = (cfg.n_layers, n_slots, cfg.n_kv_heads, cfg.head_dim)
        if torch.device(device).type == "cpu":  # slots scattered over the pool: 2 MiB pages
            self.k, self.v = huge_pages.zeros(shape, dtype), huge_pages.zeros(shape, dtype)
        else:
            self.k = torch.zeros(shape, device=device, dtype=dtype)
            self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.n_slots = n_slots

    def nbytes(self) -> int:
        """Bytes held by K and V."""
        return 2 * self.k.numel() * self.k.element_size()

    @staticmethod
    def bytes_per_slot(cfg: ModelConfig, dtype: torch.dtype) -> int:
        """Bytes one token slot takes over all layers, K and V."""
        itemsize = torch.empty((), dtype=dtype).element_size()
        return 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * itemsize
