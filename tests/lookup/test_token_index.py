"""The n-gram index finds every occurrence, follows appends, and is cached by key."""

from __future__ import annotations

import numpy as np
import pytest

from lookup.hashing import LEVELS, RollingHash, level_hashes
from lookup.index import IndexCache, build_index


def _occurrences(tokens: list[int], gram: list[int]) -> set[int]:
    """Continuation starts of every occurrence of ``gram`` that has a next token (brute force)."""
    n = len(gram)
    return {i + n for i in range(len(tokens) - n) if tokens[i : i + n] == gram}


@pytest.mark.parametrize("seed", range(5))
def test_python_and_numpy_hashes_agree(seed: int) -> None:
    tokens = np.random.default_rng(seed).integers(0, 50_000, 200)
    levels = level_hashes(tokens)
    rolling = RollingHash([])
    for end, token in enumerate(tokens.tolist()):
        rolling.push(token)
        for level, n in enumerate(LEVELS):
            expected = int(levels[level][end - n + 1]) if end + 1 >= n else None
            assert rolling.suffix(n) == expected


@pytest.mark.parametrize("seed", range(5))
def test_find_returns_every_occurrence(seed: int) -> None:
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, 3, 400).tolist()  # tiny alphabet: many repeats
    index = build_index(np.array(tokens))
    for level, n in enumerate(LEVELS):
        for start in rng.integers(0, len(tokens) - n, 10).tolist():
            gram = tokens[start : start + n]
            key = RollingHash(gram).suffix(n)
            assert key is not None
            count, found = index.find(level, key, cap=10_000)
            expected = _occurrences(tokens, gram)
            assert set(found) == expected
            assert count >= len(expected)
            assert all(tokens[p - n : p] == gram for p in found)


@pytest.mark.parametrize("seed", range(5))
def test_appended_tokens_are_found(seed: int) -> None:
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, 4, 300).tolist()
    index = build_index(np.array(tokens[:120]))
    for token in tokens[120:]:
        index.append([token])
    assert len(index) == len(tokens)
    assert index.slice(100, 140) == tokens[100:140]
    assert index.token(250) == tokens[250]
    for start, stop in ((100, 140), (130, 180), (250, 400), (120, 120), (299, 300)):
        part = index.array(start, stop)  # static, spanning, tail (clipped), empty, last
        assert part.dtype == np.int64 and part.tolist() == tokens[start:stop]
    assert not index.array(200, 210).flags.writeable  # a view of the tail: read-only
    for level, n in enumerate(LEVELS):
        gram = tokens[-n:]
        key = index.suffix_hashes()[level]
        assert key == RollingHash(gram).suffix(n)
        _, found = index.find(level, key, cap=10_000)
        assert set(found) == _occurrences(tokens, gram)


def test_find_caps_and_prefers_latest_appended() -> None:
    index = build_index(np.array([7, 8] * 10))
    index.append([7, 8, 7, 8, 1])
    key = RollingHash([7, 8]).suffix(2)
    assert key is not None
    count, found = index.find(0, key, cap=3)
    assert count == 12
    assert found == [24, 22, 20]  # appended occurrences, latest first
    assert index.find(0, RollingHash([9, 9]).suffix(2) or 0, cap=3) == (0, [])


def test_short_arrays_have_no_long_grams() -> None:
    index = build_index(np.array([1, 2, 3]))
    assert index.suffix_hashes()[1:] == [None] * (len(LEVELS) - 1)
    key = RollingHash([1, 2]).suffix(2)
    assert key is not None
    assert index.find(0, key, cap=4) == (1, [2])


def test_cache_reuses_and_evicts_by_bytes() -> None:
    tokens = np.arange(1000)
    one = build_index(tokens).nbytes()
    cache = IndexCache(max_bytes=int(2.5 * one))
    first = cache.get_or_build("a", tokens)
    assert cache.get_or_build("a", tokens) is first
    cache.get_or_build("b", tokens + 1)
    cache.get_or_build("a", tokens)  # "a" is now the most recent
    cache.get_or_build("c", tokens + 2)  # evicts "b", the least recently used
    assert len(cache) == 2
    assert cache.nbytes() <= cache.max_bytes
    assert cache.get_or_build("a", tokens) is first
    assert cache.get_or_build("b", tokens + 1) is not first


@pytest.mark.parametrize("seed", range(3))
def test_filter_never_hides_an_occurrence(seed: int) -> None:
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, 50, 500).tolist()
    index = build_index(np.array(tokens[:300]))
    index.append(tokens[300:])
    for level, n in enumerate(LEVELS):
        for end in range(n, len(tokens) + 1):
            assert index.may_contain(level, RollingHash(tokens[end - n : end]).suffix(n))
    misses = sum(
        not index.may_contain(0, RollingHash([int(a), int(b)]).suffix(2))
        for a, b in rng.integers(1000, 2000, (200, 2))
    )
    assert misses > 150  # most absent bigrams are ruled out without a search


@pytest.mark.parametrize("seed", range(3))
def test_an_extended_index_finds_what_one_built_at_once_finds(seed: int) -> None:
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, 4, 600)  # tiny alphabet: n-grams straddle every cut
    cuts = sorted(rng.integers(1, 600, 3).tolist())
    whole = build_index(tokens)
    pieces = build_index(tokens[: cuts[0]])
    for start, stop in zip(cuts, [*cuts[1:], 600], strict=True):
        pieces = pieces.extended(tokens[start:stop])
    assert pieces.segments == 4 and len(pieces) == 600
    for more in ([1, 2, 3], [0] * 20):  # both keep indexing appended tokens the same way
        whole.append(more)
        pieces.append(more)
    for level, n in enumerate(LEVELS):
        for start in range(len(whole) - n + 1):
            key = RollingHash(whole.slice(start, start + n)).suffix(n)
            assert pieces.may_contain(level, key)
            assert pieces.find(level, key, 7) == whole.find(level, key, 7)
    with pytest.raises(ValueError):
        pieces.extended(tokens[:4])  # appended to: no longer a shared prefix
