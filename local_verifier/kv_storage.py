"""K/V tensors of every layer for a fixed number of token slots (the engine's pool owns which
slot holds what)."""

from __future__ import annotations

import torch

from local_verifier import huge_pages
from local_verifier.config import ModelConfig

KEY_TILE = 16
"""Slots per tile of K: a tile holds each head's dimensions across its slots (``key_tiles``),
so that attention reads a block of keys as it lies instead of transposing it per step."""


def key_index(slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(tile, offset) of each slot in K's stored layout: a layer's K of slot s is
    ``k[tile, :, :, offset]``."""
    return slots // KEY_TILE, slots % KEY_TILE


def key_tiles(rows: torch.Tensor) -> torch.Tensor:
    """K of ``[..., slots, heads, head_dim]`` (slots a multiple of KEY_TILE) in the stored
    layout ``[..., slots / KEY_TILE, heads, head_dim, KEY_TILE]``."""
    *lead, slots, heads, dim = rows.shape
    tiles = rows.reshape(*lead, slots // KEY_TILE, KEY_TILE, heads, dim)
    return tiles.movedim(-3, -1).contiguous()


class KVStorage:
    """K/V of every layer for ``n_slots`` token slots (a multiple of KEY_TILE: a request
    is rounded up). slot = block * block_size + offset.

    ``v`` is ``[n_layers, n_slots, n_kv_heads, head_dim]``; ``k`` is
    ``[n_layers, n_slots / KEY_TILE, n_kv_heads, head_dim, KEY_TILE]`` (slot s at
    ``k[:, s // KEY_TILE, :, :, s % KEY_TILE]``). ``Transformer.step`` writes each new row's
    K/V to its slot and reads the slots a row attends to.
    """

    def __init__(
        self,
        cfg: ModelConfig,
        n_slots: int,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
    ) -> None:
        n_slots = -(-n_slots // KEY_TILE) * KEY_TILE
        heads, dim = cfg.n_kv_heads, cfg.head_dim
        k_shape = (cfg.n_layers, n_slots // KEY_TILE, heads, dim, KEY_TILE)
        v_shape = (cfg.n_layers, n_slots, heads, dim)
        if torch.device(device).type == "cpu":  # slots scattered over the pool: 2 MiB pages
            self.k, self.v = huge_pages.zeros(k_shape, dtype), huge_pages.zeros(v_shape, dtype)
        else:
            self.k = torch.zeros(k_shape, device=device, dtype=dtype)
            self.v = torch.zeros(v_shape, device=device, dtype=dtype)
        self.n_slots = n_slots

    def keys(self, slots: torch.Tensor) -> torch.Tensor:
        """The K of ``slots`` in every layer, ``[n_layers, len(slots), n_kv_heads, head_dim]``."""
        tile, offset = key_index(slots.to(self.k.device))
        return self.k[:, tile, :, :, offset].movedim(0, 1)

    def copy_slots(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        """K/V of slots ``src`` into slots ``dst`` in every layer (``src`` read first)."""
        dst, src = dst.to(self.v.device), src.to(self.v.device)
        tile, offset = key_index(dst)
        self.k[:, tile, :, :, offset] = self.keys(src).movedim(1, 0)
        self.v[:, dst] = self.v[:, src]

    def nbytes(self) -> int:
        """Bytes held by K and V."""
        return 2 * self.k.numel() * self.k.element_size()

    @staticmethod
    def bytes_per_slot(cfg: ModelConfig, dtype: torch.dtype) -> int:
        """Bytes one token slot takes over all layers, K and V."""
        itemsize = torch.empty((), dtype=dtype).element_size()
        return 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * itemsize
