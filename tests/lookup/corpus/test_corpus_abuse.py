"""No tenant can make the retrieval index's Redis work grow with what was stored.

An adversarial corpus is written straight through the store, with anchors of the
attacker's choosing (stronger than any text: the anchors of texts are keyed): documents
whose 1,024 anchors all share their top 16 bits, and documents that all hold the same
anchors (every posting list at its cap). The Redis commands an upload and a lookup run,
counted by a private Redis's ``INFO commandstats``, and the bytes each reads, are bounded by
the request's own anchors, the same before and after. (The time of both, before and after,
is in ``benchmarks.bench_corpus_abuse``.) Documents that expire together are purged a
batch per call.
"""

from __future__ import annotations

import numpy as np
import pytest
import redis

from lookup.corpus import Corpus, MemoryDocumentStore, RedisDocumentStore, open_store
from lookup.corpus.anchors import MAX_POSTINGS, anchors
from lookup.corpus.keys import index_key, namespace_base
from lookup.corpus.store import PURGE_BATCH, DocumentStore, Limits, NewDocument

PREFIX = "dg-abuse:"
NS = "tenant"
LIMITS = Limits(ttl_s=86_400.0, max_ns_bytes=1 << 40, max_ns_docs=1_000_000)
NOW = 1_800_000_000.0
SCRIPT_COMMANDS = {"evalsha", "eval", "script", "info", "config", "client", "hello", "ping"}


def _doc(doc_id: str, found: np.ndarray) -> NewDocument:
    text = f"text of {doc_id}"
    return NewDocument(doc_id, text, doc_id.ljust(64, "0"), len(text), None, None, (), found)


async def _put(store: DocumentStore, doc: NewDocument) -> None:
    await store.put(NS, doc, answer=False, limits=LIMITS, now=NOW)


def _random_anchors(rng: np.random.Generator, n: int) -> np.ndarray:
    return np.unique(rng.integers(0, 1 << 48, n, dtype=np.uint64))


def _commands(client: redis.Redis) -> int:
    """Commands Redis ran since the last reset, those of scripts included."""
    stats = client.info("commandstats")
    return sum(
        int(v["calls"])
        for k, v in stats.items()
        if k.removeprefix("cmdstat_").split("|")[0] not in SCRIPT_COMMANDS
    )


async def _work(
    client: redis.Redis, store: DocumentStore, doc: NewDocument, query: np.ndarray
) -> tuple[int, int, list[str]]:
    """(commands of one upload, commands of one lookup, what the lookup found)."""
    client.config_resetstat()
    await _put(store, doc)
    put = _commands(client)
    client.config_resetstat()
    found = await store.select(
        NS,
        ids=[],
        names=[],
        recent=0,
        query=query,
        retrieve=8,
        max_docs=8,
        max_bytes=1 << 30,
        limits=LIMITS,
        now=NOW,
    )
    return put, _commands(client), sorted(d.id for d in found)


_LONGEST = """
local longest = 0
for _, v in ipairs(redis.call('HVALS', KEYS[1])) do longest = math.max(longest, #v) end
return longest
"""


def _longest_posting_list(client: redis.Redis) -> int:
    """Bytes of the longest value in the namespace's index (measured inside Redis)."""
    return int(client.eval(_LONGEST, 1, index_key(namespace_base(PREFIX, NS), "ax")))


@pytest.mark.redis
async def test_an_adversarial_corpus_leaves_uploads_and_lookups_bounded(redis_server) -> None:
    client = redis.Redis.from_url(redis_server.url)
    store = open_store(redis_server.url, prefix=PREFIX, timeout_s=30.0)
    rng = np.random.default_rng(7)
    honest = _random_anchors(rng, 4096)
    for i in range(8):  # eight honest documents sharing 256 anchors with the query
        await _put(store, _doc(f"h{i}", honest[i * 512 : (i + 1) * 512]))
    shared = _random_anchors(rng, 1024)  # the anchors every "fill" document holds
    query = np.union1d(honest[::16], shared[:256])  # 32 anchors of each honest document
    before = await _work(client, store, _doc("probe", _random_anchors(rng, 1024)), query)

    bucket = np.uint64(0xABCD << 32)  # one bucket of 65,536 under 2-byte buckets
    for i in range(100):
        low = np.unique(rng.integers(0, 1 << 32, 1024, dtype=np.uint64))
        await _put(store, _doc(f"bucket{i}", bucket | low))
    for i in range(3 * MAX_POSTINGS):
        await _put(store, _doc(f"fill{i}", shared))
    after = await _work(client, store, _doc("probe2", _random_anchors(rng, 1024)), query)

    assert after[0] <= before[0]  # the upload ran no more commands
    assert after[1] == before[1]  # nor did the lookup
    assert after[2] == before[2] == [f"h{i}" for i in range(8)]
    # every command read or wrote one anchor's postings: at most MAX_POSTINGS numbers
    assert _longest_posting_list(client) == 4 * MAX_POSTINGS
    client.close()
    await store.aclose()


@pytest.mark.redis
async def test_gateways_sharing_a_redis_share_each_namespace_anchor_key(redis_server) -> None:
    """Two stores on one Redis (two gateways) agree on a namespace's key, so one finds by
    content what the other stored; namespaces' keys differ, so their anchors do."""
    first = open_store(redis_server.url, prefix=PREFIX, timeout_s=5.0)
    second = open_store(redis_server.url, prefix=PREFIX, timeout_s=5.0)
    text = "the quick brown fox jumps over the lazy dog " * 40
    await Corpus(first).put("alice", "fox.txt", text)
    found = await Corpus(second).select("alice", prompt_text=text[:600])
    assert [d.id for d in found] == ["fox.txt"]
    keys = [await s.anchor_key(ns, limits=LIMITS, create=False) for s in (first, second)
            for ns in ("alice", "bob")]  # fmt: skip
    assert keys[0] == keys[2] and len(keys[0] or b"") == 16
    assert keys[1] is None and keys[3] is None  # bob stored nothing: no key was made
    bob = await second.anchor_key("bob", limits=LIMITS, create=True)
    assert bob is not None and bob != keys[0]
    assert set(anchors(text, 8, 64, bob).tolist()).isdisjoint(anchors(text, 8, 64, keys[0] or b""))
    await first.aclose()
    await second.aclose()


async def test_memory_namespaces_have_keys_of_their_own() -> None:
    store = open_store(None)
    alice = await store.anchor_key("alice", limits=LIMITS, create=True)
    assert alice == await store.anchor_key("alice", limits=LIMITS, create=False)
    assert alice != await store.anchor_key("bob", limits=LIMITS, create=True)


async def _stored(store: DocumentStore, ns: str) -> int:
    """Documents the store still holds, expired or not."""
    if isinstance(store, MemoryDocumentStore):
        return len(store._spaces[ns].entries)
    assert isinstance(store, RedisDocumentStore)
    return int(await store.client.zcard(index_key(namespace_base(store.prefix, ns), "lru")))


async def test_documents_expiring_together_are_purged_a_batch_per_call(
    store: DocumentStore, clock
) -> None:
    """However many documents expire at once, a call removes at most ``PURGE_BATCH`` of
    them; the others are gone to every call until then."""
    corpus = Corpus(store, clock=clock, ttl_s=100)
    text = " ".join(f"word{i}" for i in range(300))
    for i in range(3 * PURGE_BATCH + 1):
        await corpus.put("t", f"d{i}", f"{i} {text}")
    clock.advance(101)
    held = [await _stored(store, "t")]
    assert await corpus.list("t") == []
    held.append(await _stored(store, "t"))
    assert await corpus.select("t", ids=["d20"], prompt_text=text) == []
    held.append(await _stored(store, "t"))
    assert not await corpus.delete("t", "d24")
    held.append(await _stored(store, "t"))
    await corpus.put("t", "d23", "new content")
    held.append(await _stored(store, "t"))
    n = 3 * PURGE_BATCH + 1
    assert held == [n, n - PURGE_BATCH, n - 2 * PURGE_BATCH, n - 3 * PURGE_BATCH, 1]
    (meta,) = await corpus.list("t")
    assert meta.id == "d23" and meta.created == clock.now  # a new document, not the expired one


@pytest.mark.redis
async def test_an_evicted_anchor_key_is_put_back_by_the_next_upload(redis_server) -> None:
    """Under an eviction policy Redis may drop a namespace's key: the next upload from a
    gateway that knows it stores it again, so earlier documents stay findable by content."""
    client = redis.Redis.from_url(redis_server.url)
    writer = open_store(redis_server.url, prefix=PREFIX, timeout_s=5.0)
    text = "the quick brown fox jumps over the lazy dog " * 40
    await Corpus(writer).put("alice", "fox.txt", text)
    akey = index_key(namespace_base(PREFIX, "alice"), "akey")
    key = client.get(akey)
    client.delete(akey)  # as allkeys-lru may
    await Corpus(writer).put("alice", "other.txt", "something else entirely, at length")
    assert client.get(akey) == key
    reader = open_store(redis_server.url, prefix=PREFIX, timeout_s=5.0)  # another gateway
    found = await Corpus(reader).select("alice", prompt_text=text[:600])
    assert [d.id for d in found] == ["fox.txt"]
    client.close()
    await writer.aclose()
    await reader.aclose()
