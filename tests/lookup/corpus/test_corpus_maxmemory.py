"""The Redis store under memory pressure, against real Redis servers of the tests' own:
a small ``maxmemory`` with ``noeviction`` (a clear refusal, nothing half-written) and with
an eviction policy (no endless eviction loop, stats rebuilt), and captured documents'
caps apart from uploaded ones (on every backend)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
import redis

from gateway.config import build_settings
from lookup.corpus import Corpus, DocumentStore, StoreFull, open_store
from lookup.corpus.keys import digest, index_key, namespace_base
from tests.lookup.corpus.conftest import FakeClock, RedisServer, free_port

pytestmark = pytest.mark.redis

PREFIX = "mm:"
NS = "t"
BASE = namespace_base(PREFIX, NS)


def _server(tmp_path: Path, *extra: str) -> Iterator[RedisServer]:
    server = RedisServer(free_port(), tmp_path / "redis", *extra)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def plain_server(tmp_path: Path) -> Iterator[RedisServer]:
    yield from _server(tmp_path)


def _limit(server: RedisServer, policy: str, headroom: int) -> None:
    """Set ``maxmemory`` to what the server uses now plus ``headroom`` bytes."""
    client = redis.Redis(port=server.port)
    used = int(client.info("memory")["used_memory"])
    client.config_set("maxmemory-policy", policy)
    client.config_set("maxmemory", used + headroom)
    client.close()


class Ticking(FakeClock):
    """A second later at every reading: documents are used in the order they are put."""

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


async def _corpus(server: RedisServer, **caps: int) -> tuple[Corpus, DocumentStore]:
    store = open_store(server.url, prefix=PREFIX, timeout_s=5.0)
    return Corpus(store, clock=Ticking(), ttl_s=1e9, **caps), store


def _snapshot(client: redis.Redis) -> dict[bytes, object]:
    """Every key's value (content, not encoding: a hash's DUMP may change on a read)."""
    read = {
        b"string": client.get,
        b"hash": client.hgetall,
        b"set": client.smembers,
        b"zset": lambda k: client.zrange(k, 0, -1, withscores=True),
    }
    return {k: read[client.type(k)](k) for k in client.scan_iter(match=f"{PREFIX}*")}


@pytest.fixture
async def sync_client(plain_server: RedisServer) -> AsyncIterator[redis.Redis]:
    client = redis.Redis(port=plain_server.port)
    yield client
    client.close()


async def test_noeviction_refuses_cleanly_and_writes_nothing(plain_server: RedisServer) -> None:
    corpus, store = await _corpus(plain_server)
    await corpus.put(NS, "first", "print('hello')\n" * 10)
    _limit(plain_server, "noeviction", 256 << 10)
    client = redis.Redis(port=plain_server.port)
    with pytest.raises(StoreFull):
        for i in range(400):
            await corpus.put(NS, f"doc{i}", f"document {i}\n" + "x = 1\n" * 1000)
    before = _snapshot(client)
    with pytest.raises(StoreFull):
        await corpus.put(NS, "one-more", "y = 2\n" * 1000)
    assert _snapshot(client) == before  # the refused put changed nothing
    listed = {d.id for d in await corpus.list(NS)}
    assert "one-more" not in listed and "first" in listed
    stat = client.hgetall(index_key(BASE, "stat"))
    metas = client.hvals(index_key(BASE, "docs"))
    assert len(metas) == len(listed) == client.zcard(index_key(BASE, "lru"))
    assert int(stat[b"bytes"]) > 0
    client.close()
    await store.aclose()


async def test_eviction_policy_never_loops_on_vanished_documents(
    plain_server: RedisServer, sync_client: redis.Redis
) -> None:
    corpus, store = await _corpus(plain_server, max_ns_docs=5)
    for i in range(5):
        await corpus.put(NS, f"doc{i}", f"text {i}\n" * 20)
    # Redis evicted the oldest documents' metadata: their ids are still listed
    for i in range(3):
        sync_client.hdel(index_key(BASE, "docs"), digest(f"doc{i}"))
    await asyncio.wait_for(corpus.put(NS, "new", "fresh text\n" * 20), 10)
    lru = {m.decode() for m in sync_client.zrange(index_key(BASE, "lru"), 0, -1)}
    assert digest("doc0") not in lru  # the vanished victim was taken off the list
    assert [d.id for d in await corpus.list(NS)][0] == "new"
    # and under a real policy with a small maxmemory: every call answers, none is BUSY
    _limit(plain_server, "allkeys-lru", 256 << 10)
    for i in range(300):
        await asyncio.wait_for(corpus.put(NS, f"more{i}", f"more {i}\n" + "z\n" * 2000), 10)
    assert sync_client.ping()
    await store.aclose()


async def test_evicted_stats_are_rebuilt(
    sync_client: redis.Redis, plain_server: RedisServer
) -> None:
    corpus, store = await _corpus(plain_server)
    for i in range(4):
        await corpus.put(NS, f"doc{i}", f"def f{i}():\n    return {i}\n" * 30)
    stat_key = index_key(BASE, "stat")
    before = sync_client.hgetall(stat_key)
    sync_client.delete(stat_key)  # as an eviction policy may
    assert await corpus.delete(NS, "doc3")
    await corpus.put(NS, "doc3", "def f3():\n    return 3\n" * 30)
    after = sync_client.hgetall(stat_key)
    assert after[b"bytes"] == before[b"bytes"] and after[b"axbytes"] == before[b"axbytes"]
    assert int(after[b"seq"]) == int(before[b"seq"]) + 1  # document numbers never repeat
    await store.aclose()


async def test_captured_documents_never_evict_uploaded_ones(store: DocumentStore) -> None:
    corpus = Corpus(store, clock=FakeClock(), max_ns_docs=3, max_captured_docs=2)
    for i in range(3):
        await corpus.put("t", f"upload{i}", f"uploaded text number {i}\n" * 4)
    answers = [f"captured answer number {i}: " + "words " * 10 for i in range(5)]
    for answer in answers:
        await corpus.capture("t", [answer])
        await corpus.drain()
    assert corpus.capture_stats.stored == 5
    ids = [d.id for d in await corpus.list("t")]
    assert {f"upload{i}" for i in range(3)} <= set(ids)
    assert len(ids) == 3 + 2  # the two newest captures are kept, apart
    await corpus.put("t", "upload3", "one more upload\n" * 4)
    ids = [d.id for d in await corpus.list("t")]
    assert "upload0" not in ids and len(ids) == 3 + 2  # an upload evicts an upload


def test_full_redis_is_a_507_upload(plain_server: RedisServer) -> None:
    from gateway.app import create_app
    from gateway.audit.serve import serve_in_thread

    never_called = {
        "name": "up",
        "kind": "openai_compatible",
        "base_url": "http://127.0.0.1:9/v1",
        "models": ["m"],
        "health_check": False,
    }
    redis_config = {"url": plain_server.url, "timeout_s": 5.0}
    settings = build_settings({"endpoints": [never_called], "auth": False, "redis": redis_config})
    with serve_in_thread(create_app(settings)) as url, httpx.Client(base_url=url) as client:
        first = client.post("/v1/documents", json={"id": "first", "text": "y = 2\n"})
        statuses = {first.status_code}
        _limit(plain_server, "noeviction", 256 << 10)
        for i in range(200):
            text = f"x = {i}\n" * 2000
            r = client.post("/v1/documents", json={"id": f"d{i}", "text": text})
            statuses.add(r.status_code)
            if r.status_code != 201:
                break
    assert statuses == {201, 507}
    assert r.json()["error"]["code"] == "insufficient_storage"
    assert "nothing was stored" in r.json()["error"]["message"]
