"""The drafter keeps up: a long shared prompt prefix is indexed once, drafts unchanged."""

from __future__ import annotations

import numpy as np
import pytest

from lookup.drafter import Drafter
from lookup.prompt_index import PromptIndexCache

RNG = np.random.default_rng(7)
PREFIX = np.tile(RNG.integers(0, 500, 300), 10).tolist()  # 3000 tokens that repeat


def _drafts(drafter: Drafter, output: list[int]) -> list[tuple[list[int], list[int]]]:
    """Proposals (chains and trees) after each committed output token."""
    seen = []
    for token in output:
        for width in (1, 3):
            draft = drafter.propose(16, width)
            seen.append((draft.tokens.tolist(), draft.parents.tolist()))
        drafter.extend([token])
    return seen


def test_a_second_request_indexes_only_its_own_suffix_and_drafts_identically() -> None:
    cache = PromptIndexCache()
    first = PREFIX + [1, 2, 3, 4, 5]
    cache.index(first)
    assert cache.indexed_tokens == len(first)
    second = PREFIX + RNG.integers(0, 500, 40).tolist()
    before = cache.indexed_tokens
    index = cache.index(second)
    # the prefix's full blocks come from the cache: at most the 40 new tokens plus the
    # partial block of the prefix are indexed
    assert cache.indexed_tokens - before <= 40 + cache.block_size
    output = PREFIX[100:160] + [9, 8, 7] + PREFIX[2000:2040]
    assert _drafts(Drafter(second, prompt_index=index), output) == _drafts(Drafter(second), output)


def test_multi_turn_prompts_extend_the_previous_turn() -> None:
    cache = PromptIndexCache(max_segments=3)
    prompt = list(PREFIX)
    total = 0
    for turn in range(6):  # each turn carries the last: only the new tokens are indexed
        prompt += RNG.integers(0, 500, 100).tolist()
        before = cache.indexed_tokens
        index = cache.index(prompt)
        total += cache.indexed_tokens - before
        assert len(index) == len(prompt)
        if turn == 1:  # no re-indexing of earlier turns yet
            assert cache.indexed_tokens <= len(prompt) + 2 * cache.block_size
    assert total < 3 * len(prompt)  # a chain past max_segments is re-indexed once, not per turn


def test_prefixes_are_reused_only_within_a_tenant() -> None:
    cache = PromptIndexCache()
    cache.index(PREFIX, "alice")
    before = cache.indexed_tokens
    cache.index(PREFIX, "bob")
    assert cache.indexed_tokens - before == len(PREFIX)
    before = cache.indexed_tokens
    cache.index(PREFIX, "alice")
    assert cache.indexed_tokens - before < cache.block_size  # only the partial last block


def test_the_cache_is_bounded_lru() -> None:
    cache = PromptIndexCache()
    one = cache.index(PREFIX).nbytes()
    cache = PromptIndexCache(max_bytes=int(2.5 * one))
    prompts = [[i, *PREFIX] for i in range(4)]
    for prompt in prompts:
        cache.index(prompt)
    assert len(cache) == 2 and cache.nbytes() <= cache.max_bytes
    before = cache.indexed_tokens
    cache.index(prompts[3])  # recent: kept
    assert cache.indexed_tokens - before < cache.block_size
    before = cache.indexed_tokens
    cache.index(prompts[0])  # evicted: indexed again
    assert cache.indexed_tokens - before >= len(PREFIX)


@pytest.mark.parametrize("bad", [PREFIX[:-1], [*PREFIX, 1]])
def test_a_prompt_index_must_cover_the_prompt(bad: list[int]) -> None:
    with pytest.raises(ValueError):
        Drafter(PREFIX, prompt_index=PromptIndexCache().index(bad))


def test_a_cache_bounded_at_zero_keeps_nothing() -> None:
    cache = PromptIndexCache(max_bytes=0)
    cache.index(PREFIX)
    cache.index(PREFIX)
    assert len(cache) == 0 and cache.indexed_tokens == 2 * len(PREFIX)
