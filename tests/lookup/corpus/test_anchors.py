"""Anchors equal their definition, computed the slow way in plain Python (SipHash-2-4
included, checked against its published test vector)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lookup.corpus.anchors import SHINGLE, anchors, siphash, word_hashes
from lookup.hashing import BASE, MASK, mixed

_WORD = set(b"0123456789_ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz") | set(
    range(128, 256)
)
_SPACE = set(b" \t\n\r\x0b\x0c")


def _words(text: str) -> list[bytes]:
    """Runs of word bytes, and every other non-space byte on its own."""
    data = text.encode("utf-8", "surrogatepass")
    out: list[bytes] = []
    i = 0
    while i < len(data):
        j = i + 1
        if data[i] in _WORD:
            while j < len(data) and data[j] in _WORD:
                j += 1
        if data[i] not in _SPACE:
            out.append(data[i:j])
        i = j
    return out


KEY = bytes(range(16))


def _rotl(x: int, b: int) -> int:
    return ((x << b) | (x >> (64 - b))) & MASK


def _siphash(key: bytes, message: bytes) -> int:
    """SipHash-2-4 as its paper defines it, for any message length."""
    k0, k1 = int.from_bytes(key[:8], "little"), int.from_bytes(key[8:], "little")
    v = [k0 ^ 0x736F6D6570736575, k1 ^ 0x646F72616E646F6D]
    v += [k0 ^ 0x6C7967656E657261, k1 ^ 0x7465646279746573]

    def rounds(n: int) -> None:
        for _ in range(n):
            v[0] = (v[0] + v[1]) & MASK
            v[1] = _rotl(v[1], 13) ^ v[0]
            v[0] = _rotl(v[0], 32)
            v[2] = (v[2] + v[3]) & MASK
            v[3] = _rotl(v[3], 16) ^ v[2]
            v[0] = (v[0] + v[3]) & MASK
            v[3] = _rotl(v[3], 21) ^ v[0]
            v[2] = (v[2] + v[1]) & MASK
            v[1] = _rotl(v[1], 17) ^ v[2]
            v[2] = _rotl(v[2], 32)

    full = len(message) // 8 * 8
    tail = message[full:] + bytes(7 - len(message) % 8) + bytes([len(message) & 0xFF])
    for i in range(0, full + 8, 8):
        m = int.from_bytes((message[:full] + tail)[i : i + 8], "little")
        v[3] ^= m
        rounds(2)
        v[0] ^= m
    v[2] ^= 0xFF
    rounds(4)
    return v[0] ^ v[1] ^ v[2] ^ v[3]


def test_siphash_matches_the_published_vector_and_the_reference() -> None:
    # the reference implementation's vector for key 00..0f, message 00..07
    assert _siphash(KEY, bytes(range(8))) == 0x93F5F5799A932462
    values = np.random.default_rng(0).integers(0, 1 << 64, 500, dtype=np.uint64)
    other = bytes(range(16, 32))
    for key in (KEY, other):
        assert siphash(values, key).tolist() == [
            _siphash(key, int(x).to_bytes(8, "little")) for x in values.tolist()
        ]
    assert siphash(values, KEY).tolist() != siphash(values, other).tolist()
    with pytest.raises(ValueError):
        siphash(values, b"short")


def _reference(text: str, window: int, limit: int) -> list[int]:
    words = [
        sum((b + 1) * pow(BASE, i, 1 << 64) for i, b in enumerate(w)) & MASK for w in _words(text)
    ]
    grams = [
        sum(mixed(words[s + SHINGLE - 1 - k]) * pow(BASE, k, 1 << 64) for k in range(SHINGLE))
        & MASK
        for s in range(len(words) - SHINGLE + 1)
    ]
    kept = [_siphash(KEY, g.to_bytes(8, "little")) >> 16 for g in grams]
    if window > 1 and len(kept) > window:
        kept = [min(kept[s : s + window]) for s in range(len(kept) - window + 1)]
    return sorted(set(kept))[:limit]


_TEXT = st.text(alphabet="ab_9 \t\n.,(){}=+-'\"é中🙂\x00\ud800", max_size=300)


@settings(max_examples=300, deadline=None)
@given(text=_TEXT, window=st.integers(1, 11), limit=st.integers(1, 40))
def test_anchors_follow_their_definition(text: str, window: int, limit: int) -> None:
    assert anchors(text, window, limit, KEY).tolist() == _reference(text, window, limit)
    assert word_hashes(text).tolist() == [
        sum((b + 1) * pow(BASE, i, 1 << 64) for i, b in enumerate(w)) & MASK for w in _words(text)
    ]


@pytest.mark.parametrize("size", [0, 1, 5000, 200_000])
def test_long_and_empty_texts(size: int) -> None:
    """Texts longer than the cached power tables hash like short ones."""
    rng = np.random.default_rng(size)
    words = ["def", "x", "=", "(", ")", "return", "self", "é", ":", "\n"]
    text = " ".join(rng.choice(words, size // 3 + 1).tolist())[:size]
    tail = text[-2000:]
    assert anchors(tail, 8, 10_000, KEY).tolist() == _reference(tail, 8, 10_000)
    got = word_hashes(text)
    assert got.dtype == np.uint64 and len(got) == len(_words(text))
    if size:
        assert word_hashes(text)[-50:].tolist() == word_hashes(text[-1000:])[-50:].tolist()
