"""Where the end of the context currently matches inside one source, kept up to date per token.

A track holds the continuation starts of the longest suffix matches of the context in
its source. Appending a committed token keeps the occurrences whose next token equals it
(O(occurrences)); only when none is left does the track look the context suffix up in
the source's index again, top-down from the longest n-gram that could match now (the
longest match can grow by at most one token per step), so matching is incremental.
"""

from __future__ import annotations

from lookup.draft import Source
from lookup.hashing import LEVELS
from lookup.index import TokenIndex


class Track:
    """The current longest suffix matches of the context in one source."""

    __slots__ = ("index", "source", "positions", "match", "complete")

    def __init__(self, index: TokenIndex, source: Source) -> None:
        self.index = index
        self.source = source
        self.positions: list[int] = []  # continuation starts, best first
        self.match = 0  # length of the suffix match at those positions
        self.complete = False  # positions holds every occurrence (not before a first anchor)

    def follow(self, token: int, max_match: int) -> bool:
        """Keep the occurrences that continue with ``token``; False when none is left."""
        if not self.positions:
            return False
        index = self.index
        size = index.size
        kept = [p + 1 for p in self.positions if p < size and index.token(p) == token]
        self.positions = kept
        if kept:
            self.match = min(self.match + 1, max_match)
            return self.complete
        return False

    def anchor(
        self, context: TokenIndex, hashes: list[int | None], cap: int, max_match: int
    ) -> None:
        """Find the longest suffix matches of ``context`` again after following failed."""
        # the longest match grows by at most one token per step (if every occurrence was kept)
        limit = min(max(self.match, LEVELS[0] - 1) + 1, max_match) if self.complete else max_match
        if limit <= LEVELS[0] and not self.index.may_contain(0, hashes[0]):
            self.positions, self.match, self.complete = [], 0, True  # the common miss, fast
            return
        checked_above = False
        for level in range(len(LEVELS) - 1, -1, -1):
            n = LEVELS[level]
            key = hashes[level]
            if n > limit or key is None:
                continue
            count, found = self.index.find(level, key, cap)
            if not found:
                checked_above = True
                continue
            bound = min(2 * n - 1, limit) if checked_above else limit
            self._keep_longest(context, found, n, bound)
            self.complete = count <= cap
            return
        self.positions = []
        self.match = 0
        self.complete = True

    def _keep_longest(self, context: TokenIndex, found: list[int], n: int, bound: int) -> None:
        """Keep the occurrences with the longest exact match (all match at least n)."""
        end = len(context)
        if bound <= n:
            self.positions, self.match = found, n
            return
        ctx = context.slice(end - bound, end)
        best: list[int] = []
        best_len = -1
        for pos in found:
            src = self.index.slice(pos - bound, pos)
            m = n
            limit = min(len(src), len(ctx))
            while m < limit and src[-1 - m] == ctx[-1 - m]:
                m += 1
            if m > best_len:
                best, best_len = [pos], m
            elif m == best_len:
                best.append(pos)
        self.positions, self.match = best, best_len
