"""Polynomial n-gram hashes (mod 2**64), computed the same way in numpy and in Python.

The hash of the n tokens ending at index i is ``sum(x[i - j] * BASE**j for j < n)`` with
``x = (token + 1) * MIX``. numpy computes whole levels by doubling (level 2n from level
n); Python keeps a rolling prefix hash so a suffix hash costs two multiplications.
"""

from __future__ import annotations

import numpy as np

LEVELS: tuple[int, ...] = (2, 4, 8, 16)
"""n-gram lengths that are indexed (each level doubles the one before)."""

MASK = (1 << 64) - 1
BASE = 0x100000001B3
MIX = 0x9E3779B97F4A7C15
_POW = {n: pow(BASE, n, 1 << 64) for n in range(LEVELS[-1] + 1)}


def level_hashes(tokens: np.ndarray, top: int = LEVELS[-1]) -> list[np.ndarray]:
    """Per level n up to ``top``, the uint64 hash of every window; entry j is the window
    ending at j + n - 1."""
    with np.errstate(over="ignore"):
        h = (tokens.astype(np.uint64) + np.uint64(1)) * np.uint64(MIX)
        out: list[np.ndarray] = []
        n = 1
        while n < top:
            h = h[:-n] * np.uint64(_POW[n]) + h[n:] if len(h) > n else h[:0]
            n *= 2
            if n in LEVELS:
                out.append(h)
    return out


def mixed(token: int) -> int:
    """The per-token value the polynomial hash sums over."""
    return ((token + 1) * MIX) & MASK


class RollingHash:
    """Suffix hashes of a growing token sequence (keeps only the last ``LEVELS[-1]`` tokens)."""

    __slots__ = ("_prefix",)

    def __init__(self, tail: list[int]) -> None:
        self._prefix: list[int] = [0]
        for token in tail[-LEVELS[-1] :]:
            self.push(token)

    def push(self, token: int) -> None:
        """Append one token."""
        prefix = self._prefix
        prefix.append((prefix[-1] * BASE + mixed(token)) & MASK)
        if len(prefix) > 2 * LEVELS[-1] + 1:
            del prefix[: LEVELS[-1]]

    def suffix(self, n: int) -> int | None:
        """Hash of the last n tokens, None when fewer than n were pushed."""
        prefix = self._prefix
        if len(prefix) <= n:
            return None
        return (prefix[-1] - prefix[-1 - n] * _POW[n]) & MASK

    def suffixes(self) -> list[int | None]:
        """The suffix hash for every level."""
        return [self.suffix(n) for n in LEVELS]
