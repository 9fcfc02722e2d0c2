"""An n-gram index over a token array, with incremental append, and an in-process cache.

For every indexed n-gram length (``hashing.LEVELS``) the index maps the hash of an
n-gram to the positions right after its occurrences (where a continuation starts). The
array given at build time is indexed with numpy (sorted unique hashes + searchsorted);
tokens appended later go to small dicts, so appending costs O(levels) per token.
``extended`` makes a new index over more tokens that shares the numpy segments already
built (a long prompt prefix is indexed once, each request adds only its own suffix).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from itertools import islice

import numpy as np

from lookup.hashing import LEVELS, MASK, RollingHash, level_hashes

_NO_TOKENS = np.zeros(0, np.int64)


class _Level:
    """One n-gram length over the static array.

    Each window is packed into one uint64: the high bits of its hash, then its index in
    the low ``bits`` bits; sorting the packed values groups equal hashes with their
    windows in position order (one ``np.sort``, no argsort). A byte filter indexed by the
    top bits of the hash (about 4 slots per window) answers most misses without numpy.
    """

    __slots__ = ("packed", "n", "mask", "seen", "shift", "offset")

    def __init__(self, hashes: np.ndarray, n: int, offset: int = 0) -> None:
        """``offset``: the position of window 0 in the whole array."""
        bits = max(len(hashes), 1).bit_length()
        self.n = n
        self.offset = offset
        self.mask = (1 << bits) - 1
        window = np.arange(len(hashes), dtype=np.uint64)
        self.packed: np.ndarray = np.sort((hashes & np.uint64(~self.mask & MASK)) | window)
        slot_bits = max(4 * len(hashes), 64).bit_length()
        self.shift = 64 - slot_bits
        seen = np.zeros(1 << slot_bits, dtype=np.uint8)
        seen[hashes >> np.uint64(self.shift)] = 1
        self.seen = seen.tobytes()

    def find(self, key: int) -> tuple[int, int]:
        """The [lo, hi) range of ``packed`` whose hash matches ``key`` (in the kept bits)."""
        if not self.seen[key >> self.shift]:
            return 0, 0
        high = key & ~self.mask
        packed = self.packed
        lo = int(packed.searchsorted(np.uint64(high)))
        if lo == len(packed) or (int(packed[lo]) & ~self.mask) != high:
            return 0, 0
        return lo, int(packed.searchsorted(np.uint64(high | self.mask), "right"))

    def positions(self, lo: int, hi: int) -> list[int]:
        """Continuation starts of the windows in ``packed[lo:hi]``, ascending."""
        starts: list[int] = (
            (self.packed[lo:hi] & np.uint64(self.mask)) + np.uint64(self.n + self.offset)
        ).tolist()
        return starts

    def nbytes(self) -> int:
        return int(self.packed.nbytes) + len(self.seen)


def _segment(tokens: np.ndarray, start: int) -> list[_Level]:
    """Levels of the windows of ``tokens`` that end at ``start`` or later (those ending
    earlier belong to the segments before)."""
    lo = max(start - LEVELS[-1] + 1, 0)
    levels = []
    for hashes, n in zip(level_hashes(tokens[lo:]), LEVELS, strict=True):
        skip = max(start - lo - n + 1, 0)
        levels.append(_Level(hashes[skip:], n, lo + skip))
    return levels


class TokenIndex:
    """Find where the n-gram ending the current context occurs in a token array."""

    def __init__(self, tokens: np.ndarray) -> None:
        static = np.ascontiguousarray(tokens, dtype=np.int64)
        self._setup(static, [_segment(static, 0)])

    def _setup(self, static: np.ndarray, segments: list[list[_Level]]) -> None:
        self._static = static.view()
        self._static.flags.writeable = False  # drafts hand out views of it
        self._n_static = len(static)
        self.size = len(static)  # tokens held (``len``, as an attribute: cheaper to read)
        self._segments = segments  # oldest first; shared with the indexes extended from
        self._tail: list[int] = []
        self._tail_buffer = _NO_TOKENS  # the tail again as int64, room to grow at its end
        self._addresses = (int(self._static.ctypes.data), 0)  # and of the tail buffer
        self._tail_view = _NO_TOKENS  # a read-only view of the buffer (drafts take slices)
        self._tail_maps: list[dict[int, list[int]]] = [{} for _ in LEVELS]
        self._rolling = RollingHash(self._static[-LEVELS[-1] :].tolist())

    def __len__(self) -> int:
        return self.size

    def extended(self, tokens: np.ndarray) -> TokenIndex:
        """A new index over these tokens followed by ``tokens``, sharing this one's numpy
        segments (indexes only ``tokens``); this index must not have been appended to."""
        if self._tail:
            raise ValueError("an index with appended tokens cannot be extended")
        more = np.asarray(tokens, dtype=np.int64)
        static = np.concatenate([self._static, more])
        segments = list(self._segments)
        if len(more):
            segments.append(_segment(static, self._n_static))
        out = TokenIndex.__new__(TokenIndex)
        out._setup(static, segments)
        return out

    @property
    def segments(self) -> int:
        """How many numpy-indexed pieces the static array is held in."""
        return len(self._segments)

    def append(self, tokens: list[int]) -> None:
        """Index more tokens at the end (O(levels) dict updates per token)."""
        rolling = self._rolling
        for token in tokens:
            n = len(self._tail)
            if n == len(self._tail_buffer):
                self._grow_tail()
            self._tail_buffer[n] = token
            self._tail.append(token)
            self.size += 1
            rolling.push(token)
            after = len(self)
            for level, n in enumerate(LEVELS):
                key = rolling.suffix(n)
                if key is not None:
                    self._tail_maps[level].setdefault(key, []).append(after)

    def _grow_tail(self) -> None:
        buffer = np.empty(max(64, 2 * len(self._tail_buffer)), np.int64)
        buffer[: len(self._tail)] = self._tail
        self._tail_buffer, self._tail_view = buffer, buffer.view()
        self._tail_view.flags.writeable = False
        self._addresses = (self._addresses[0], int(buffer.ctypes.data))

    def addresses(self) -> tuple[int, int, int, int]:
        """(address of the static int64 tokens, their count, address of the appended ones,
        their count): for compiled code reading the tokens in place until the next append."""
        static, tail = self._addresses
        return static, self._n_static, tail, self.size - self._n_static

    def suffix_hashes(self) -> list[int | None]:
        """Per level, the hash of the n-gram that ends the array (None if it is shorter)."""
        return self._rolling.suffixes()

    def may_contain(self, level: int, key: int | None) -> bool:
        """False when the n-gram ``key`` at ``LEVELS[level]`` certainly does not occur."""
        if key is None:
            return False
        for segment in self._segments:
            stat = segment[level]
            if stat.seen[key >> stat.shift]:
                return True
        return key in self._tail_maps[level]

    def find(self, level: int, key: int, cap: int) -> tuple[int, list[int]]:
        """Occurrences of the n-gram ``key`` at ``LEVELS[level]`` that have a continuation.

        Returns the number of occurrences and up to ``cap`` continuation starts, latest
        first.
        """
        size = len(self)
        tail = self._tail_maps[level].get(key, [])
        found = [p for p in islice(reversed(tail), cap + 1) if p < size][:cap]
        count = len(tail)
        for segment in reversed(self._segments):
            stat = segment[level]
            lo, hi = stat.find(key)
            count += hi - lo
            if hi > lo and len(found) < cap:
                picked = stat.positions(max(lo, hi - (cap - len(found))), hi)
                found.extend(p for p in reversed(picked) if p < size)
        return count, found

    def slice(self, start: int, stop: int) -> list[int]:
        """Tokens [start, stop) as a list (clipped to the array)."""
        n = self._n_static
        if stop <= n:
            tokens: list[int] = self._static[max(start, 0) : stop].tolist()
            return tokens
        head = self._static[max(start, 0) : n].tolist() if start < n else []
        return head + self._tail[max(start - n, 0) : stop - n]

    def array(self, start: int, stop: int) -> np.ndarray:
        """Tokens [start, stop) as int64 (clipped), a read-only view unless the range spans
        both the static array and the tail."""
        n = self._n_static
        if stop <= n:
            return self._static[max(start, 0) : stop]
        stop = min(stop, n + len(self._tail)) - n
        if start >= n:
            return self._tail_view[start - n : stop]
        return np.concatenate((self._static[max(start, 0) :], self._tail_view[:stop]))

    def token(self, pos: int) -> int:
        """The token at ``pos``."""
        n = self._n_static
        return int(self._static[pos]) if pos < n else self._tail[pos - n]

    def nbytes(self) -> int:
        """Approximate memory held by the index (the static part dominates)."""
        return int(self._static.nbytes) + sum(
            level.nbytes() for segment in self._segments for level in segment
        )


def build_index(tokens: np.ndarray) -> TokenIndex:
    """Index a token array (any integer dtype)."""
    return TokenIndex(np.asarray(tokens))


class IndexCache:
    """Process-wide LRU of built indexes, keyed by content, bounded by total bytes.

    Indexes handed out must not be appended to (they are shared between requests).
    """

    def __init__(self, max_bytes: int = 512 << 20) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[str, TokenIndex] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get_or_build(self, key: str, tokens: np.ndarray) -> TokenIndex:
        """The cached index for ``key`` (e.g. the content sha256), built on first use."""
        with self._lock:
            index = self._entries.get(key)
            if index is not None:
                self._entries.move_to_end(key)
                return index
        index = build_index(tokens)
        with self._lock:
            if key not in self._entries:
                self._entries[key] = index
                self._bytes += index.nbytes()
                while self._bytes > self.max_bytes and len(self._entries) > 1:
                    _, old = self._entries.popitem(last=False)
                    self._bytes -= old.nbytes()
            return self._entries[key]

    def nbytes(self) -> int:
        """Total bytes of the cached indexes."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)
