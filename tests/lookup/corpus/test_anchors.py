"""Anchors equal their definition, computed the slow way in plain Python."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lookup.corpus.anchors import SHINGLE, anchors, word_hashes
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


def _reference(text: str, window: int, limit: int) -> list[int]:
    words = [
        sum((b + 1) * pow(BASE, i, 1 << 64) for i, b in enumerate(w)) & MASK for w in _words(text)
    ]
    grams = [
        sum(mixed(words[s + SHINGLE - 1 - k]) * pow(BASE, k, 1 << 64) for k in range(SHINGLE))
        & MASK
        for s in range(len(words) - SHINGLE + 1)
    ]
    kept = [g >> 16 for g in grams]
    if window > 1 and len(kept) > window:
        kept = [min(kept[s : s + window]) for s in range(len(kept) - window + 1)]
    return sorted(set(kept))[:limit]


_TEXT = st.text(alphabet="ab_9 \t\n.,(){}=+-'\"é中🙂\x00\ud800", max_size=300)


@settings(max_examples=300, deadline=None)
@given(text=_TEXT, window=st.integers(1, 11), limit=st.integers(1, 40))
def test_anchors_follow_their_definition(text: str, window: int, limit: int) -> None:
    assert anchors(text, window, limit).tolist() == _reference(text, window, limit)
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
    assert anchors(tail, 8, 10_000).tolist() == _reference(tail, 8, 10_000)
    got = word_hashes(text)
    assert got.dtype == np.uint64 and len(got) == len(_words(text))
    if size:
        assert word_hashes(text)[-50:].tolist() == word_hashes(text[-1000:])[-50:].tolist()
