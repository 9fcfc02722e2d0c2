"""The record store: the same behaviour in memory and in a real Redis."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import pytest

from gateway.records.evidence import MAX_EVIDENCE, make
from gateway.records.store import MemoryRecordStore, RecordStore, RedisRecordStore
from lookup.corpus.errors import StoreUnavailable


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis)])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[RecordStore]:
    if request.param == "memory":
        yield MemoryRecordStore()
        return
    url = request.getfixturevalue("redis_url")
    prefix = request.getfixturevalue("redis_prefix")
    request.getfixturevalue("redis_client")  # deletes the test's keys afterwards
    s = RedisRecordStore(url, prefix=prefix)
    yield s
    await s.aclose()


async def test_evidence_is_kept_newest_first_and_capped(store: RecordStore) -> None:
    for n in range(MAX_EVIDENCE + 3):
        await store.add_evidence("e", make("probe", "p", "unknown", f"#{n}", observed_at=n))
    kept = await store.evidence("e")
    assert len(kept) == MAX_EVIDENCE
    assert kept[0].detail == f"#{MAX_EVIDENCE + 2}"
    assert await store.evidence("other") == []


async def test_samples_and_counts(store: RecordStore) -> None:
    now = float(int(time.time()))  # stored with microsecond precision
    await store.add_samples("e", [(now - 10, 0.1, 0.01), (now - 5, None, 0.02), (now, 0.3, None)])
    assert await store.samples("e", now - 6) == [(now - 5, None, 0.02), (now, 0.3, None)]
    await store.add_counts("e", {"requests": 2, "accepted_prediction_tokens": 5})
    await store.add_counts("e", {"requests": 1})
    assert await store.counts("e") == {"requests": 3, "accepted_prediction_tokens": 5}


async def test_an_unreachable_redis_fails_fast_and_opens_the_breaker() -> None:
    store = RedisRecordStore("redis://127.0.0.1:1/0", timeout_s=0.2)
    for _ in range(3):
        with pytest.raises(StoreUnavailable):
            await store.evidence("e")
    with pytest.raises(StoreUnavailable, match="circuit open"):
        await store.counts("e")
    await store.aclose()
