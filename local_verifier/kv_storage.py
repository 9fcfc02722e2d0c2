"""K/V tensors of every layer for a fixed number of token slots (the engine's pool owns which
slot holds what)."""

from __future__ import annotations

import math
import mmap

import torch

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
        if torch.device(device).type == "cpu":
            self.k, self.v = zeros_on_huge_pages(shape, dtype), zeros_on_huge_pages(shape, dtype)
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


HUGE_PAGE = 2 * 2**20


def zeros_on_huge_pages(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """CPU zeros of ``shape`` in fresh anonymous memory (zero pages, committed as they are
    first written, as torch.zeros'), 2 MiB-aligned and advised onto transparent huge pages
    where the OS has them: attention reads each sequence's slots scattered over the pool, and
    on 4 KiB pages nearly every block of slots is a TLB miss. The values are the same."""
    nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if nbytes == 0 or advice is None:  # no transparent huge pages here (not Linux)
        return torch.zeros(shape, dtype=dtype)
    memory = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    raw = torch.frombuffer(memory, dtype=torch.uint8)  # keeps memory alive
    start = -raw.data_ptr() % HUGE_PAGE
    memory.madvise(advice, start, nbytes // HUGE_PAGE * HUGE_PAGE)
    return raw[start : start + nbytes].view(dtype).view(shape)
