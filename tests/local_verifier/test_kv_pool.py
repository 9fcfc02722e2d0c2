"""The KV pool: blocks, reference counts, the prefix index and LRU eviction."""

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
    p.allocate(3)  # the two free blocks, then the least recently used cached one
    assert p.cached() == 1
    assert p.lookup(keys) == []  # the chain's first block is gone


def test_storage_bytes_are_reported_per_block() -> None:
    p = pool()
    assert p.block_bytes() * p.n_blocks == p.storage.nbytes()
    assert p.storage.k.dtype == torch.float32
