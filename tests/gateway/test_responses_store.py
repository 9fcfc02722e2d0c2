"""Stored responses: the memory store and a real Redis keep the same rules (per tenant,
a TTL, a count cap and a byte cap, the oldest dropped first)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from gateway.apis.responses.store import (
    Limits,
    MemoryResponseStore,
    ResponseStore,
    Stored,
    open_response_store,
)

LIMITS = Limits(ttl_s=3600, max_responses=3, max_bytes=4000)


def stored(n: int, text: str = "x") -> Stored:
    return Stored({"id": f"resp_{n}", "output": [{"text": text}]}, [{"id": f"msg_{n}"}])


@pytest.fixture(params=["memory", "redis"])
async def store(
    request: pytest.FixtureRequest, redis_prefix: str, redis_client: Any
) -> AsyncIterator[ResponseStore]:
    if request.param == "memory":
        backend: ResponseStore = MemoryResponseStore(LIMITS)
    else:
        url = redis_client.connection_pool.connection_kwargs
        backend = open_response_store(
            f"redis://{url['host']}:{url['port']}/{url.get('db', 0)}", LIMITS, prefix=redis_prefix
        )
    yield backend
    await backend.aclose()


async def test_a_response_is_found_by_its_tenant_only(store: ResponseStore) -> None:
    assert await store.put("alice", "resp_1", stored(1))
    assert await store.get("alice", "resp_1") == stored(1)
    assert await store.get("bob", "resp_1") is None
    assert not await store.delete("bob", "resp_1")
    assert await store.get("alice", "resp_1") == stored(1)
    assert await store.delete("alice", "resp_1")
    assert await store.get("alice", "resp_1") is None


async def test_past_the_count_cap_the_oldest_goes(store: ResponseStore) -> None:
    for n in range(4):
        assert await store.put("alice", f"resp_{n}", stored(n))
    assert await store.get("alice", "resp_0") is None
    assert [await store.get("alice", f"resp_{n}") for n in (1, 2, 3)] == [
        stored(1),
        stored(2),
        stored(3),
    ]
    assert await store.put("bob", "resp_0", stored(0))  # another tenant's cap is its own
    assert await store.get("alice", "resp_1") == stored(1)


async def test_past_the_byte_cap_the_oldest_go_and_a_too_large_one_is_not_kept(
    store: ResponseStore,
) -> None:
    assert await store.put("alice", "resp_1", stored(1, "a" * 1500))
    assert await store.put("alice", "resp_2", stored(2, "b" * 1500))
    assert await store.put("alice", "resp_3", stored(3, "c" * 1500))
    assert await store.get("alice", "resp_1") is None
    assert await store.get("alice", "resp_2") is not None
    assert not await store.put("alice", "resp_4", stored(4, "d" * 5000))
    assert await store.get("alice", "resp_4") is None
    assert await store.get("alice", "resp_3") is not None


async def test_the_memory_store_forgets_a_response_after_its_ttl() -> None:
    now = [100.0]
    memory = MemoryResponseStore(Limits(ttl_s=60, max_responses=3, max_bytes=4000), lambda: now[0])
    await memory.put("alice", "resp_1", stored(1))
    now[0] += 59
    assert await memory.get("alice", "resp_1") == stored(1)
    now[0] += 2
    assert await memory.get("alice", "resp_1") is None


async def test_redis_keys_expire_with_the_ttl_and_name_no_tenant_or_id(
    redis_client: Any, redis_prefix: str
) -> None:
    url = redis_client.connection_pool.connection_kwargs
    redis = open_response_store(
        f"redis://{url['host']}:{url['port']}/{url.get('db', 0)}",
        Limits(ttl_s=60, max_responses=3, max_bytes=4000),
        prefix=redis_prefix,
    )
    try:
        await redis.put("alice:tenant", "resp_secret", stored(1))
    finally:
        await redis.aclose()
    keys = [k.decode() for k in redis_client.scan_iter(match=f"{redis_prefix}*")]
    assert len(keys) == 3
    assert not any("alice" in k or "resp_secret" in k for k in keys)
    assert all(0 < redis_client.pttl(k) <= 60_000 for k in keys)
