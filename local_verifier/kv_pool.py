"""Paged KV memory shared by every sequence: fixed-size blocks over one ``KVStorage``.

A block holds ``block_size`` consecutive token slots (slot = block * block_size + offset).
Blocks are reference-counted: a sequence's :class:`BlockTable` holds one reference to each
of its blocks. A full block can be published in the prefix index under a key chained over
every token before it and its tenant (as vLLM's automatic prefix caching); an unreferenced
published block stays cached, counted to the owner that published it, until the pool needs
room.

Eviction is shared by weight, as the rest of the pool: an owner's usage is the blocks its
sequences hold plus its cached ones, its share is the weighted part of the pool admission
gives it (``shares``; none for an owner long idle). Room is taken from the cached blocks of
the owner furthest above its share first, least recently used first within an owner. An
owner may take all of its own cached blocks, all of an inactive owner's, and what lies
above an active one's share (``active``: with requests in the engine); beyond that, only
as many as its sequences hold below its own share, any number while they hold none (so a
request needing more than the free blocks always runs once its owner's others end). An
owner holding less than its share keeps its own cache while another's sequences hold more
than theirs: admission preempts those instead. A tenant's cache within its share thus
survives another tenant's growth while it has requests in the engine, and is the last
taken while it is briefly idle.
"""

from __future__ import annotations

import hashlib
from collections import Counter, OrderedDict, deque
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
        self._publisher: dict[int, str] = {}  # published block -> the owner it counts to
        self._held: dict[str, Counter[int]] = {}  # owner -> its references to each block
        # unreferenced published blocks per owner, least recently used first
        self._evictable: dict[str, OrderedDict[int, None]] = {}
        self.shares: dict[str, float] = {}  # each owner's weighted share of the blocks
        self.active: set[str] = set()  # owners whose caches within their shares are kept
        self.peak_used = 0  # most blocks referenced at once so far

    # -- accounting ---------------------------------------------------------------------

    def available(self, owner: str | None = None) -> int:
        """Blocks an ``allocate`` for ``owner`` can hand out now: free ones plus the cached
        ones it may evict (any owner's when None)."""
        if owner is None:
            return len(self._free) + sum(len(lru) for lru in self._evictable.values())
        return len(self._free) + sum(n for _, n in self._takeable(owner))

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

    def allocate(self, n: int, owner: str = "") -> list[int]:
        """``n`` blocks with one reference each, held by ``owner``; when the free ones run
        out, evicts the cached blocks ``owner`` may take (module docstring)."""
        takeable = self._takeable(owner) if n > len(self._free) else []
        if n > len(self._free) + sum(k for _, k in takeable):
            raise PoolExhausted(f"{n} blocks wanted, {self.available(owner)} available")
        out = [self._free.popleft() for _ in range(min(n, len(self._free)))]
        for other, k in takeable:
            out += [self._evict(other) for _ in range(min(k, n - len(out)))]
        for block in out:
            self._refs[block] = 1
        self._hold(owner, out)
        self.peak_used = max(self.peak_used, self.used())
        return out

    def release(self, blocks: Sequence[int], owner: str = "") -> None:
        """Drop one of ``owner``'s references to each block; unreferenced blocks become free
        or cached, the last block first: a chain's tail is evicted before its head (as in
        vLLM), so what remains cached is still a prefix."""
        held = self._held.get(owner, Counter())
        for block in reversed(blocks):
            refs = self._refs[block] - 1
            if refs < 0 or held[block] < 1:
                raise ValueError(f"block {block} released more often than held")
            self._refs[block] = refs
            held[block] -= 1
            if not held[block]:
                del held[block]
            if refs == 0:
                if block in self._key_of:
                    self._evictable.setdefault(self._publisher[block], OrderedDict())[block] = None
                else:
                    self._free.append(block)

    def _hold(self, owner: str, blocks: Sequence[int]) -> None:
        held = self._held.setdefault(owner, Counter())
        for block in blocks:
            held[block] += 1

    def _usage_over_share(self, owner: str) -> float:
        """``owner``'s held and cached blocks less its share (an idle owner has none)."""
        usage = len(self._held.get(owner, ())) + len(self._evictable.get(owner, ()))
        return usage - self.shares.get(owner, 0.0)

    def _takeable(self, owner: str) -> list[tuple[str, int]]:
        """How many of each owner's cached blocks an allocation for ``owner`` may evict,
        furthest above share first: all of its own (none while it holds less than its
        share and another owner's sequences hold more than theirs) and of an inactive
        owner's; of an active one's, what lies above its share, and beyond that as many as
        ``owner`` holds below its own share (any number while it holds none)."""
        over = {o: self._usage_over_share(o) for o, lru in self._evictable.items() if lru}
        held = len(self._held.get(owner, ()))
        share = self.shares.get(owner, 0.0)
        room = float("inf") if not held else max(0.0, share - held)
        if held < share and any(
            len(h) > self.shares.get(o, 0.0) for o, h in self._held.items() if o != owner
        ):
            over.pop(owner, None)  # its own cache stays: admission takes those blocks back
        out: list[tuple[str, int]] = []
        for other in sorted(over, key=over.__getitem__, reverse=True):
            cached = len(self._evictable[other])
            if other == owner or other not in self.active:
                out.append((other, cached))
                continue
            excess = min(cached, max(0, int(over[other])))
            extra = int(min(cached - excess, room))
            room -= extra
            out.append((other, excess + extra))
        return out

    def _evict(self, owner: str) -> int:
        """``owner``'s least recently used cached block, taken out of the index."""
        block, _ = self._evictable[owner].popitem(last=False)
        del self._index[self._key_of.pop(block)]
        del self._publisher[block]
        return block

    # -- prefix index ---------------------------------------------------------------------

    def publish(self, block: int, key: bytes, owner: str = "") -> None:
        """Index a full, committed block under ``key``, cached to ``owner`` once unreferenced
        (no-op if the key is already cached)."""
        if key in self._index or block in self._key_of:
            return
        self._index[key] = block
        self._key_of[block] = key
        self._publisher[block] = owner

    def lookup(self, keys: Sequence[bytes], owner: str = "") -> list[int]:
        """The cached blocks of the longest prefix of ``keys``, each with a new reference
        held by ``owner``."""
        found: list[int] = []
        for key in keys:
            block = self._index.get(key)
            if block is None:
                break
            found.append(block)
        for block in found:
            if self._refs[block] == 0:
                del self._evictable[self._publisher[block]][block]
            self._refs[block] += 1
        self._hold(owner, found)
        self.peak_used = max(self.peak_used, self.used())
        return found


class BlockTable:
    """One sequence's blocks, held by its owner: token position p lives in slot
    ``slot_of(p)``."""

    def __init__(self, pool: KVPool, owner: str = "") -> None:
        self.pool = pool
        self.owner = owner
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
            self.blocks += self.pool.allocate(missing, self.owner)

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
        self.pool.release(self.blocks, self.owner)
        self.blocks = []
