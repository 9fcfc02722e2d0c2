"""One sequence's K/V in slots [0, max_len) of its own ``KVStorage``, and batch-1 steps over
it: the plain decoding the engine's answers are checked against."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from local_verifier.config import ModelConfig
from local_verifier.kv_storage import KVStorage
from local_verifier.loader import LoadedModel
from local_verifier.model import SeqStep, Transformer


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


def new_cache(lm: LoadedModel, max_len: int | None = None) -> KVCache:
    """A KV cache for one sequence of ``lm``'s of up to ``max_len`` (default: the context)
    tokens."""
    length = max_len or lm.context_length
    return KVCache(lm.config, length, lm.device, lm.model.kv_dtype)


def forward(
    model: Transformer,
    tokens: torch.Tensor,
    cache: KVCache,
    positions: torch.Tensor | None = None,
    tree_mask: torch.Tensor | None = None,
    *,
    last_only: bool = False,
) -> torch.Tensor:
    """Batch-1 ``model.step``: T new tokens; float32 logits [T, vocab] ([1, vocab] with
    ``last_only``).

    The tokens' K/V go to cache slots [cache.length, cache.length + T) and cache.length
    advances by T. ``tree_mask[i, j]``: new token i may attend to new token j (None =
    causal); every new token attends to the whole committed prefix.
    """
    t = tokens.shape[0]
    start = cache.length
    if start + t > cache.max_len:
        raise ValueError(f"{start + t} tokens exceed the cache's {cache.max_len} slots")
    new_slots = torch.arange(start, start + t)
    seq = SeqStep(
        tokens=tokens,
        positions=new_slots if positions is None else positions,
        new_slots=new_slots,
        context_slots=torch.arange(start),
        mask=tree_mask,
        logits="last" if last_only else "all",
    )
    (logits,) = model.step([seq], cache.storage)
    cache.length = start + t
    return logits
