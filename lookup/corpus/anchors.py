"""Content anchors: the n-grams of a text that the retrieval index keys it by.

A text's UTF-8 bytes are split into words (runs of ASCII letters, digits, ``_`` and
non-ASCII bytes, or single ASCII symbols; whitespace separates); every ``SHINGLE``
consecutive words form an n-gram, hashed to 64 bits with numpy only (a polynomial hash
per word, then the n-gram hash of ``lookup.hashing``), then keyed with SipHash-2-4 under the
namespace's secret anchor key (kept by the store, so every replica agrees): without the key
nobody can tell which n-grams a text's anchors will be, nor aim texts at one anchor.
Winnowing keeps the smallest hash of every ``window`` consecutive n-grams; it is local, so
two texts sharing a span of ``window + SHINGLE - 1`` words or more select the same anchor
inside it (``window = 1`` keeps every n-gram). A document keeps at most ``max_anchors`` of
them (the smallest hashes, so the choice stays consistent between texts).

An anchor is the top 48 bits of the keyed hash, stored as 6 big-endian bytes. The Redis
index keeps one hash field per anchor holding at most ``MAX_POSTINGS`` document numbers, so
what one anchor costs to read or write never grows with the rest of the corpus.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lookup.hashing import level_hashes

SHINGLE = 8  # words per n-gram
ANCHOR_BYTES = 6  # packed size of one anchor (the keyed hash's top 48 bits)
KEY_BYTES = 16  # a namespace's SipHash key
MAX_POSTINGS = 32  # documents per anchor; an anchor this common is not indexed again
INDEX_DOC_BYTES = 48  # per indexed document: its number and anchor list entries
# What one kept anchor costs the namespace: a Redis hash field of its own (about 60 bytes
# measured with a one-document posting list) and its entry in the document's anchor list.
INDEX_ANCHOR_BYTES = 64 + ANCHOR_BYTES

_BASE = np.uint64(0x100000001B3)  # odd, so invertible modulo 2**64
_BASE_INV = np.uint64(pow(0x100000001B3, -1, 1 << 64))
_ONE = np.ones(1, np.uint64)
_CACHED_POWERS = 1 << 17  # power tables kept for texts of up to this many bytes
_power_tables: tuple[np.ndarray, np.ndarray] = (_ONE, _ONE)
_SPACE, _WORD_BYTE, _SYMBOL = 0, 1, 2
_CLASS = np.full(256, _SYMBOL, np.uint8)
_CLASS[128:] = _WORD_BYTE
for _c in b"0123456789_ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz":
    _CLASS[_c] = _WORD_BYTE
for _c in b" \t\n\r\x0b\x0c":
    _CLASS[_c] = _SPACE


@dataclass(frozen=True)
class AnchorConfig:
    """How texts are anchored: winnowing ``window``, anchors kept per document and per
    query, and how much of a query's prompt (its end) and prediction (its start) is read."""

    window: int = 8
    max_anchors: int = 1024
    max_query_anchors: int = 512
    max_query_chars: int = 16 * 1024

    def __post_init__(self) -> None:
        if min(self.window, self.max_anchors, self.max_query_anchors, self.max_query_chars) < 1:
            raise ValueError("anchor window and bounds must be positive")


def _powers(n: int) -> tuple[np.ndarray, np.ndarray]:
    """BASE**i and BASE**-i (mod 2**64) for i <= n; tables up to ``_CACHED_POWERS`` are kept."""
    global _power_tables
    tables = _power_tables
    if len(tables[0]) <= n:
        size = max(n + 1, 2 * len(tables[0]))
        with np.errstate(over="ignore"):
            up, down = (
                np.concatenate((_ONE, np.cumprod(np.full(size - 1, b, np.uint64))))
                for b in (_BASE, _BASE_INV)
            )
        tables = up, down
        if size <= _CACHED_POWERS:
            _power_tables = tables
    return tables


def word_hashes(text: str) -> np.ndarray:
    """uint64 hash of every word of ``text``, in order."""
    data = np.frombuffer(text.encode("utf-8", "surrogatepass"), np.uint8)
    cls = _CLASS[data]
    word = cls == _WORD_BYTE
    symbol = cls == _SYMBOL
    edge = np.empty(len(data) + 1, np.bool_)  # a word byte next to a non-word byte
    edge[0] = edge[-1] = True
    np.not_equal(word[1:], word[:-1], out=edge[1:-1])
    starts = np.flatnonzero((word & edge[:-1]) | symbol)
    ends = np.flatnonzero((word & edge[1:]) | symbol) + 1
    powers, inverse = _powers(len(data))
    with np.errstate(over="ignore"):
        prefix = np.zeros(len(data) + 1, np.uint64)
        np.cumsum((data + np.uint64(1)) * powers[: len(data)], out=prefix[1:])
        hashes: np.ndarray = (prefix[ends] - prefix[starts]) * inverse[starts]
    return hashes


def shingle_hashes(text: str) -> np.ndarray:
    """uint64 hash of every run of ``SHINGLE`` consecutive words of ``text``."""
    return level_hashes(word_hashes(text), SHINGLE)[-1]


_SIP_INIT = (0x736F6D6570736575, 0x646F72616E646F6D, 0x6C7967656E657261, 0x7465646279746573)


def _rotl(x: np.ndarray, b: int) -> np.ndarray:
    return (x << np.uint64(b)) | (x >> np.uint64(64 - b))


def _sip_rounds(v: list[np.ndarray], rounds: int) -> None:
    v0, v1, v2, v3 = v
    for _ in range(rounds):
        v0 = v0 + v1
        v1 = _rotl(v1, 13) ^ v0
        v0 = _rotl(v0, 32)
        v2 = v2 + v3
        v3 = _rotl(v3, 16) ^ v2
        v0 = v0 + v3
        v3 = _rotl(v3, 21) ^ v0
        v2 = v2 + v1
        v1 = _rotl(v1, 17) ^ v2
        v2 = _rotl(v2, 32)
    v[:] = v0, v1, v2, v3


def siphash(values: np.ndarray, key: bytes) -> np.ndarray:
    """SipHash-2-4 under the 16-byte ``key`` of each uint64 taken as an 8-byte
    little-endian message (vectorised)."""
    if len(key) != KEY_BYTES:
        raise ValueError(f"an anchor key is {KEY_BYTES} bytes")
    k0, k1 = (np.uint64(int.from_bytes(key[i : i + 8], "little")) for i in (0, 8))
    m = values.astype(np.uint64)
    last = np.uint64(8 << 56)  # the final block: the message length, no bytes left
    with np.errstate(over="ignore"):
        v = [
            np.full_like(m, np.uint64(init) ^ k)
            for init, k in zip(_SIP_INIT, (k0, k1, k0, k1), strict=True)
        ]
        v[3] ^= m
        _sip_rounds(v, 2)
        v[0] ^= m
        v[3] ^= last
        _sip_rounds(v, 2)
        v[0] ^= last
        v[2] ^= np.uint64(0xFF)
        _sip_rounds(v, 4)
        out: np.ndarray = v[0] ^ v[1] ^ v[2] ^ v[3]
    return out


def anchors(text: str, window: int, limit: int, key: bytes) -> np.ndarray:
    """Sorted distinct anchor hashes (uint64) of ``text`` under the namespace's anchor
    ``key``, at most ``limit``."""
    hashes = siphash(shingle_hashes(text), key) >> np.uint64(16)  # the 48 bits kept
    if window > 1 and len(hashes) > window:  # the minimum of every ``window`` in a row
        done = 1
        while done < window:
            step = min(done, window - done)
            hashes = np.minimum(hashes[:-step], hashes[step:])
            done += step
    return np.unique(hashes)[:limit]


def query_text(prompt: str, prediction: str, config: AnchorConfig) -> str:
    """The part of a request that is anchored: the prediction's start, the prompt's end."""
    half = config.max_query_chars // 2
    return (
        prediction[:half] + "\n" + prompt[-(config.max_query_chars - min(len(prediction), half)) :]
    )


def pack(hashes: np.ndarray) -> bytes:
    """Anchors as consecutive 6-byte big-endian values."""
    return hashes.astype(">u8").view(np.uint8).reshape(-1, 8)[:, 2:].tobytes()
