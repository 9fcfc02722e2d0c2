"""Paged KV memory shared by every sequence: fixed-size blocks over one ``KVStorage``.

A block holds ``block_size`` consecutive token slots (slot = block * block_size + offset).
Blocks are reference-counted: a sequence's :class:`BlockTable` holds one reference to each
of its blocks. A full block can be published in the prefix index under a key chained over
every token before it and its tenant (as vLLM's automatic prefix caching); an unreferenced
published block stays cached until the pool needs room, least recently used first.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict, deque
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    from local_verifier.kv_storage import KVStorage

DEFAULT_BLOCK_SIZE = 16


class PoolExhausted(RuntimeError):
    """Fewer free blocks than asked for."""


def root_key(tenant: str) -> bytes:
    """The key the chain of a tenant's first block starts from."""
    return hashlib.blake2b(tenant.encode(), digest_size=16).digest()


def chain_key(parent: bytes, block_tokens: Sequence[int]) -> bytes:
    """The key of a block: its parent's key and its own tokens."""
    chunk = np.asarray(block_tokens, dtype=np.int64).tobytes()
    return hashlib.blake2b(parent + chunk, digest_size=16).digest()


def block_keys(tenant: str, tokens: Sequence[int], block_size: int) -> list[bytes]:
    """Prefix-index keys of the full blocks of ``tokens``: key i covers tokens [0, (i+1)*bs)."""
    keys: list[bytes] = []
    parent = root_key(tenant)
    for start in range(0, len(tokens) - block_size + 1, block_size):
        parent = chain_key(parent, tokens[start : start + block_size])
        keys.append(parent)
    return keys


class KVPool:
    """Block allocator with reference counts and a prefix index over one ``KVStorage``."""

    def __init__(self, storage: KVStorage, block_size: int = DEFAULT_BLOCK_SIZE) -> None:
        n_blocks = storage.n_slots // block_size
        if n_blocks < 1:
            raise ValueError(f"the KV storage holds fewer than one block of {block_size} slots")
        self.storage = storage
        self.block_size = block_size
        self.n_blocks = n_blocks
        self._refs = [0] * n_blocks
        self._free: deque[int] = deque(range(n_blocks))
        self._key_of: dict[int, bytes] = {}  # published block -> its key
        self._index: dict[bytes, int] = {}  # key -> published block
        self._evictable: OrderedDict[int, None] = OrderedDict()  # unreferenced, published; LRU
        self.peak_used = 0  # most blocks referenced at once so far

    # -- accounting ---------------------------------------------------------------------

    def available(self) -> int:
        """Blocks an ``allocate`` can hand out now (free plus evictable cached ones)."""
        return len(self._free) + len(self._evictable)

    def used(self) -> int:
        """Blocks referenced by some sequence."""
        return self.n_blocks - self.available()

    def cached(self) -> int:
        """Published blocks (referenced or not)."""
        return len(self._index)

    def block_bytes(self) -> int:
        """Bytes of K/V one block holds."""
        return self.storage.nbytes() // self.n_blocks

    # -- allocation ---------------------------------------------------------------------

    def allocate(self, n: int) -> list[int]:
        """``n`` blocks with one reference each; evicts cached blocks LRU first if needed."""
        if n > self.available():
            raise PoolExhausted(f"{n} blocks wanted, {self.available()} available")
        out: list[int] = []
        for _ in range(n):
            if self._free:
                block = self._free.popleft()
            else:
                block, _ = self._evictable.popitem(last=False)
                del self._index[self._key_of.pop(block)]
            self._refs[block] = 1
            out.append(block)
        self.peak_used = max(self.peak_used, self.used())
        return out

    def release(self, blocks: Sequence[int]) -> None:
        """Drop one reference to each block; unreferenced blocks become free or evictable."""
        for block in blocks:
            refs = self._refs[block] - 1
            if refs < 0:
                raise ValueError(f"block {block} released more often than held")
            self._refs[block] = refs
            if refs == 0:
                if block in self._key_of:
                    self._evictable[block] = None
                else:
                    self._free.append(block)

    # -- prefix index ---------------------------------------------------------------------

    def publish(self, block: int, key: bytes) -> None:
        """Index a full, committed block under ``key`` (no-op if the key is already cached)."""
        if key in self._index or block in self._key_of:
            return
        self._index[key] = block
        self._key_of[block] = key

    def lookup(self, keys: Sequence[bytes]) -> list[int]:
        """The cached blocks of the longest prefix of ``keys``, each with a new reference."""
        found: list[int] = []
        for key in keys:
            block = self._index.get(key)
            if block is None:
                break
            found.append(block)
        for block in found:
            if self._refs[block] == 0:
                del self._evictable[block]
            self._refs[block] += 1
        self.peak_used = max(self.peak_used, self.used())
        return found


class BlockTable:
    """One sequence's blocks: token position p lives in slot ``slot_of(p)``."""

    def __init__(self, pool: KVPool) -> None:
        self.pool = pool
        self.blocks: list[int] = []
        self._covered: list[int] = []  # the blocks whose slots _slots holds
        self._slots = torch.empty(0, dtype=torch.long)

    @property
    def capacity(self) -> int:
        """Token positions the table's blocks cover."""
        return len(self.blocks) * self.pool.block_size

    def reserve(self, n_tokens: int) -> None:
        """Hold enough blocks for positions [0, n_tokens) (raises ``PoolExhausted``)."""
        missing = -(-n_tokens // self.pool.block_size) - len(self.blocks)
        if missing > 0:
            self.blocks += self.pool.allocate(missing)

    def slots(self, start: int, end: int) -> torch.Tensor:
        """Slots of positions [start, end) (long, on the CPU)."""
        if end > self.capacity:
            raise ValueError(f"positions up to {end} exceed the table's {self.capacity}")
        if self._covered != self.blocks:  # blocks added, replaced or released since
            bs = self.pool.block_size
            blocks = torch.as_tensor(self.blocks, dtype=torch.long)
            self._slots = (blocks[:, None] * bs + torch.arange(bs)).flatten()
            self._covered = list(self.blocks)
        return self._slots[start:end].clone()

    def release(self) -> None:
        """Give every block back to the pool."""
        self.pool.release(self.blocks)
        self.blocks = []
