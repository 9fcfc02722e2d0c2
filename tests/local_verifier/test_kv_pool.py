"""The KV pool: blocks, reference counts, the prefix index and eviction by share."""

from __future__ import annotations

import pytest
import torch

from local_verifier.kv_pool import BlockTable, KVPool, PoolExhausted, block_keys
from local_verifier.kv_storage import KVStorage
from local_verifier.model import ModelConfig

CFG = ModelConfig(
    vocab_size=16, dim=16, n_layers=2, n_heads=2, n_kv_heads=1, head_dim=8, hidden_dim=32
)


def pool(n_blocks: int = 4, block_size: int = 4) -> KVPool:
    return KVPool(KVStorage(CFG, n_blocks * block_size), block_size)


def test_allocate_release_and_exhaustion() -> None:
    p = pool()
    blocks = p.allocate(3)
    assert len(set(blocks)) == 3 and p.used() == 3 and p.available() == 1
    with pytest.raises(PoolExhausted):
        p.allocate(2)
    p.release(blocks)
    assert p.used() == 0
    with pytest.raises(ValueError):
        p.release(blocks[:1])


def test_block_table_slots_follow_its_blocks() -> None:
    p = pool()
    table = BlockTable(p)
    table.reserve(6)
    assert len(table.blocks) == 2
    b0, b1 = table.blocks
    assert table.slots(2, 6).tolist() == [b0 * 4 + 2, b0 * 4 + 3, b1 * 4, b1 * 4 + 1]
    with pytest.raises(ValueError):
        table.slots(0, 9)
    table.release()
    assert p.used() == 0 and table.blocks == []


def test_block_table_slots_follow_every_change_of_its_blocks() -> None:
    p = pool(n_blocks=8)
    table = BlockTable(p)
    table.reserve(4)
    first = table.slots(0, 4)
    first[0] = -1  # a copy: the table's own slots are untouched
    assert table.slots(0, 4).tolist() == [table.blocks[0] * 4 + o for o in range(4)]
    table.reserve(8)  # a block more
    assert table.slots(4, 8).tolist() == [table.blocks[1] * 4 + o for o in range(4)]
    table.blocks = [7, 3]  # replaced (as a prefix hit does)
    assert table.slots(0, 8).tolist() == [28, 29, 30, 31, 12, 13, 14, 15]
    table.blocks = []
    with pytest.raises(ValueError):
        table.slots(0, 1)


def test_prefix_keys_chain_over_the_whole_prefix_and_the_tenant() -> None:
    a = block_keys("t1", [1, 2, 3, 4, 5, 6, 7, 8, 9], 4)
    assert len(a) == 2  # full blocks only
    assert block_keys("t1", [1, 2, 3, 4, 5, 6, 7, 8], 4) == a
    assert block_keys("t1", [0, 2, 3, 4, 5, 6, 7, 8], 4)[1] != a[1]  # chained
    assert block_keys("t2", [1, 2, 3, 4, 5, 6, 7, 8], 4)[0] != a[0]  # per tenant


def test_published_blocks_are_shared_then_evicted_lru() -> None:
    p = pool(n_blocks=4)
    keys = block_keys("t", list(range(8)), 4)
    first = p.allocate(2)
    for block, key in zip(first, keys, strict=True):
        p.publish(block, key)
    assert p.lookup(keys) == first  # a second reader shares them
    p.release(first)
    p.release(first)
    assert p.used() == 0 and p.cached() == 2  # unreferenced but still cached
    p.allocate(3)  # the two free blocks, then the least recently used cached one:
    assert p.cached() == 1  # the chain's tail, released first
    assert p.lookup(keys) == first[:1]  # its head stays cached


def test_storage_bytes_are_reported_per_block() -> None:
    p = pool()
    assert p.block_bytes() * p.n_blocks == p.storage.nbytes()
    assert p.storage.k.dtype == torch.float32


def _cache(p: KVPool, owner: str, n: int, first_token: int = 0) -> list[bytes]:
    """``n`` blocks of ``owner`` published and released (cached, unreferenced); their keys."""
    keys = block_keys(owner, list(range(first_token, first_token + 4 * n)), 4)
    blocks = p.allocate(n, owner)
    for block, key in zip(blocks, keys, strict=True):
        p.publish(block, key, owner)
    p.release(blocks, owner)
    return keys


def test_an_owner_over_its_share_cannot_evict_a_cache_within_anothers_share() -> None:
    p = pool(n_blocks=8)
    p.shares, p.active = {"a": 4.0, "b": 4.0}, {"a", "b"}
    b_keys = _cache(p, "b", 3)
    held = p.allocate(5, "a")  # the free blocks: a holds more than its share now
    assert p.available("a") == 0 and p.available() == 3
    with pytest.raises(PoolExhausted):
        p.allocate(1, "a")
    assert len(p.lookup(b_keys, "b")) == 3  # b's cache is whole
    p.release(held, "a")


def test_an_owner_below_its_share_evicts_the_cache_furthest_above_share_first() -> None:
    p = pool(n_blocks=8)
    p.shares, p.active = {"a": 4.0, "b": 4.0}, {"a", "b"}
    a_keys = _cache(p, "a", 5)  # a: 5 cached, 1 above its share
    b_keys = _cache(p, "b", 3, first_token=100)  # b: 3, within
    assert p.available("b") == 8
    p.allocate(2, "b")  # b holds nothing: it may evict, a's least recently used first
    assert len(p.lookup(a_keys, "a")) == 3  # a's chain lost its tail
    assert len(p.lookup(b_keys, "b")) == 3


def test_an_idle_owners_cache_is_evicted_first_and_least_recently_used_first() -> None:
    p = pool(n_blocks=4)
    p.shares, p.active = {"a": 4.0}, {"a"}  # b has long been idle: no share
    a_keys = _cache(p, "a", 2)
    b_keys = _cache(p, "b", 2, first_token=100)
    p.allocate(1, "a")
    assert len(p.lookup(a_keys, "a")) == 2  # a's cache kept ...
    assert len(p.lookup(b_keys, "b")) == 1  # ... b's least recently used block went


def test_release_counts_references_per_owner() -> None:
    p = pool()
    blocks = p.allocate(2, "a")
    with pytest.raises(ValueError):
        p.release(blocks, "b")
    p.release(blocks, "a")
    assert p.used() == 0


def test_a_briefly_idle_owners_cache_goes_after_the_caches_above_their_shares() -> None:
    p = pool(n_blocks=8)
    p.shares, p.active = {"a": 4.0, "b": 4.0}, {"a"}  # b between two requests
    b_keys = _cache(p, "b", 3)
    a_keys = _cache(p, "a", 5, first_token=100)  # a: 1 above its share
    p.allocate(5, "a")  # a's five cached first, b's kept
    assert p.lookup(a_keys, "a") == []
    found = p.lookup(b_keys, "b")
    assert len(found) == 3
    p.release(found, "b")
    p.allocate(1, "a")  # b is not active: its cache within its share may go too
    assert len(p.lookup(b_keys, "b")) == 2


def test_an_owner_below_its_share_keeps_its_cache_while_another_holds_more_than_its_share() -> None:
    p = pool(n_blocks=8)
    p.shares, p.active = {"a": 4.0, "b": 4.0}, {"a", "b"}
    b_keys = _cache(p, "b", 2)
    a_held = p.allocate(6, "a")  # a holds above its share
    assert p.available("b") == 0  # b's own cache is not taken: a's blocks are taken back
    with pytest.raises(PoolExhausted):
        p.allocate(1, "b")
    p.release(a_held[-3:], "a")  # a within its share again (unpublished: free)
    assert p.available("b") == 5
    p.allocate(4, "b")
    assert len(p.lookup(b_keys, "b")) == 1  # b's own cache, its tail first
