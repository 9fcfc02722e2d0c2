"""Prompt indexes reused across requests that share a long prefix (the drafter keeps up).

A prompt is cut into full blocks of tokens; block i's key chains a hash of the tenant and
every token up to the end of block i, as the KV pool's prefix index does. The cache keeps,
per key, the index over exactly those tokens (never appended to), LRU, bounded by bytes.
A request's index is the longest cached prefix's index extended by the rest of its prompt
(``TokenIndex.extended`` shares the numpy segments), so a shared prefix is indexed once.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence

import numpy as np

from lookup.index import TokenIndex

BLOCK_SIZE = 16
MAX_SEGMENTS = 8  # a longer chain of extensions is re-indexed in one piece


def block_keys(tenant: str, tokens: np.ndarray, block_size: int) -> list[bytes]:
    """Key i covers tokens [0, (i + 1) * block_size) of ``tenant``'s prompt."""
    parent = hashlib.blake2b(tenant.encode(), digest_size=16).digest()
    keys = []
    for start in range(0, len(tokens) - block_size + 1, block_size):
        block = tokens[start : start + block_size].tobytes()
        parent = hashlib.blake2b(parent + block, digest_size=16).digest()
        keys.append(parent)
    return keys


class PromptIndexCache:
    """LRU of prompt-prefix indexes keyed by chained block hashes, at most ``max_bytes`` (an
    index larger than that is not kept; 0 keeps none); used from one thread."""

    def __init__(
        self,
        block_size: int = BLOCK_SIZE,
        max_bytes: int = 64 << 20,
        max_segments: int = MAX_SEGMENTS,
    ) -> None:
        self.block_size = block_size
        self.max_bytes = max_bytes
        self.max_segments = max_segments
        self.indexed_tokens = 0  # tokens put through numpy indexing so far (the work done)
        self._entries: OrderedDict[bytes, TokenIndex] = OrderedDict()
        self._bytes = 0

    def index(self, prompt: Sequence[int], tenant: str = "") -> TokenIndex:
        """A fresh index over ``prompt`` (the caller may append to it); its full blocks'
        index is cached for the next request of ``tenant`` that starts the same way."""
        tokens = np.asarray(list(prompt), dtype=np.int64)
        keys = block_keys(tenant, tokens, self.block_size)
        base: TokenIndex | None = None
        covered = 0
        for i in range(len(keys) - 1, -1, -1):
            base = self._entries.get(keys[i])
            if base is not None:
                self._entries.move_to_end(keys[i])
                covered = (i + 1) * self.block_size
                break
        full = len(keys) * self.block_size
        if full > covered:
            if base is not None and base.segments >= self.max_segments:
                base, covered = None, 0  # re-index the chain in one piece
            base = self._extend(base, tokens, covered, full)
            self._put(keys[-1], base)
        return self._extend(base, tokens, full, len(tokens))

    def _extend(
        self, base: TokenIndex | None, tokens: np.ndarray, start: int, stop: int
    ) -> TokenIndex:
        """An index over ``tokens[:stop]`` from ``base`` (over ``tokens[:start]``)."""
        if base is None:
            self.indexed_tokens += stop
            return TokenIndex(tokens[:stop])
        self.indexed_tokens += stop - start
        return base.extended(tokens[start:stop])

    def _put(self, key: bytes, index: TokenIndex) -> None:
        self._entries[key] = index
        self._bytes += index.nbytes()
        while self._bytes > self.max_bytes:
            _, old = self._entries.popitem(last=False)
            self._bytes -= old.nbytes()

    def nbytes(self) -> int:
        """Bytes of the cached indexes (segments shared between entries count per entry)."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)
