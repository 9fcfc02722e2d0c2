"""Selecting a request's documents, isolation between namespaces, token caching, capture."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from redis.asyncio.connection import AbstractConnection

from lookup.corpus import (
    CaptureLimits,
    Corpus,
    DocumentStore,
    InvalidDocument,
    RedisDocumentStore,
)
from lookup.corpus.mentions import MAX_SCAN_CHARS


async def _ids(corpus: Corpus, ns: str, **kwargs) -> list[str]:
    return [d.id for d in await corpus.select(ns, **kwargs)]


async def test_select_explicit_ids_in_order_skipping_missing(corpus: Corpus) -> None:
    for name in ("a", "b", "c"):
        await corpus.put("t", name, f"text {name}")
    assert await _ids(corpus, "t", ids=["c", "missing", "a", "c"]) == ["c", "a"]


async def test_select_documents_mentioned_in_the_prompt(corpus: Corpus) -> None:
    await corpus.put("t", "src/pkg/utils.py", "def helper(): ...")
    await corpus.put("t", "spec", "the spec", path="docs/design/spec.md")
    await corpus.put("t", "unrelated.py", "x = 1")
    prompt = "Refactor `utils.py` as described in docs/design/spec.md."
    assert await _ids(corpus, "t", prompt_text=prompt) == ["src/pkg/utils.py", "spec"]
    assert await _ids(corpus, "t", prompt_text="open src/pkg/utils.py, please") == [
        "src/pkg/utils.py"
    ]
    assert await _ids(corpus, "t", prompt_text="utils.pyc and myutils.py") == []


async def test_select_recent_answers_newest_first(corpus: Corpus, clock) -> None:
    await corpus.put("t", "upload", "an uploaded file, not an answer")
    for i in range(3):
        await corpus.capture("t", [f"answer number {i} with enough text"])
        await corpus.drain()
        clock.advance(1)
    texts = [d.text for d in await corpus.select("t", recent=2)]
    assert texts == ["answer number 2 with enough text", "answer number 1 with enough text"]


async def test_select_combines_sources_without_duplicates(corpus: Corpus) -> None:
    await corpus.put("t", "a.py", "a")
    await corpus.put("t", "b.py", "b")
    await corpus.capture("t", ["a captured answer, long enough"])
    await corpus.drain()
    docs = await corpus.select("t", ids=["b.py"], prompt_text="see a.py and b.py", recent=5)
    assert [d.id for d in docs][:2] == ["b.py", "a.py"]
    assert len(docs) == 3 and docs[2].text == "a captured answer, long enough"


async def test_select_is_bounded_by_count_and_bytes(store: DocumentStore, clock) -> None:
    corpus = Corpus(store, clock=clock, select_max_docs=2, select_max_bytes=150)
    await corpus.put("t", "big", "x" * 120)
    for name in ("s1", "s2", "s3"):
        await corpus.put("t", name, name * 10)  # 20 bytes each
    assert await _ids(corpus, "t", ids=["big", "s1", "s2"]) == ["big", "s1"]
    corpus = Corpus(store, clock=clock, select_max_docs=3, select_max_bytes=150)
    # a document that would pass the byte bound is skipped; smaller ones after it still fit
    assert await _ids(corpus, "t", ids=["s1", "s2", "big", "s3"]) == ["s1", "s2", "s3"]
    assert await _ids(corpus, "t", ids=["big", "s1", "s2", "s3"]) == ["big", "s1"]


async def test_selected_documents_are_marked_used(store: DocumentStore, clock) -> None:
    corpus = Corpus(store, clock=clock, max_ns_docs=2)
    await corpus.put("t", "a.py", "a")
    clock.advance(1)
    await corpus.put("t", "b.py", "b")
    clock.advance(1)
    await corpus.select("t", prompt_text="look at a.py")
    await corpus.put("t", "c.py", "c")
    assert sorted(m.id for m in await corpus.list("t")) == ["a.py", "c.py"]


async def test_namespaces_never_see_each_other(corpus: Corpus) -> None:
    await corpus.put("alice", "secret.py", "ALICE ONLY")
    await corpus.capture("alice", ["alice's answer text, long enough"])
    await corpus.drain()
    assert await corpus.get("bob", "secret.py") is None
    assert await corpus.list("bob") == []
    assert await corpus.select("bob", ids=["secret.py"], prompt_text="secret.py", recent=9) == []
    assert await corpus.delete("bob", "secret.py") is False
    await corpus.put("bob", "secret.py", "BOB")
    alice = await corpus.get("alice", "secret.py")
    assert alice is not None and alice.text == "ALICE ONLY"
    assert [d.text for d in await corpus.select("bob", recent=9, ids=["secret.py"])] == ["BOB"]


class CountingEncoder:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def __call__(self, text: str) -> list[int]:
        self.calls.append(text)
        return [ord(c) for c in text]


async def test_tokens_are_cached_per_fingerprint(corpus: Corpus) -> None:
    await corpus.put("t", "a", "héllo")
    await corpus.put("t", "b", "world!")
    docs = await corpus.select("t", ids=["a", "b"])
    encode = CountingEncoder()
    first = await corpus.tokens("t", docs, "tok-v1", encode)
    again = await corpus.tokens("t", docs, "tok-v1", encode)
    assert encode.calls == ["héllo", "world!"]
    for (sha, arr), (sha2, arr2), doc in zip(first, again, docs, strict=True):
        assert sha == sha2 == doc.sha256
        assert arr2.dtype == np.uint32
        np.testing.assert_array_equal(arr2, [ord(c) for c in doc.text])
        np.testing.assert_array_equal(arr, arr2)
    await corpus.tokens("t", docs, "tok-v2", encode)
    assert len(encode.calls) == 4
    # tokens follow the content: another namespace or a re-put after delete tokenizes again
    await corpus.put("u", "a", "héllo")
    await corpus.tokens("u", await corpus.select("u", ids=["a"]), "tok-v1", encode)
    await corpus.delete("t", "a")
    await corpus.put("t", "a", "héllo")
    await corpus.tokens("t", await corpus.select("t", ids=["a"]), "tok-v1", encode)
    assert encode.calls[4:] == ["héllo", "héllo"]


async def test_corrupt_cached_tokens_are_computed_again(
    corpus: Corpus, store: DocumentStore
) -> None:
    await corpus.put("t", "a", "héllo")
    docs = await corpus.select("t", ids=["a"])
    await store.put_tokens("t", "fp", {docs[0].sha256: b"\x01\x02\x03"}, limits=corpus.limits)
    encode = CountingEncoder()
    [(_, tokens)] = await corpus.tokens("t", docs, "fp", encode)
    assert encode.calls == ["héllo"]
    np.testing.assert_array_equal(tokens, [ord(c) for c in "héllo"])
    [cached] = await store.get_tokens("t", "fp", [docs[0].sha256])
    assert cached == np.asarray([ord(c) for c in "héllo"], "<u4").tobytes()  # repaired


async def test_capture_stores_answers_and_request_code_blocks(corpus: Corpus) -> None:
    request = "Fix this:\n```python\ndef broken():\n    return 1 +\n```\nthanks"
    await corpus.capture("t", ["Here is the fix: return 1 + 2"], request_texts=[request])
    await corpus.drain()
    stored = {m.id.split(":")[0]: m for m in await corpus.list("t")}
    assert set(stored) == {"answer", "code"}
    assert stored["code"].language == "python"
    code = await corpus.get("t", stored["code"].id)
    assert code is not None and code.text == "def broken():\n    return 1 +\n"
    assert corpus.capture_stats.stored == 2
    # capturing the same answer again refreshes it instead of adding a copy
    await corpus.capture("t", ["Here is the fix: return 1 + 2"])
    await corpus.drain()
    assert len(await corpus.list("t")) == 2


async def test_capture_respects_its_size_bounds(store: DocumentStore, clock) -> None:
    limits = CaptureLimits(max_items=2, min_bytes=5, max_bytes=50)
    corpus = Corpus(store, clock=clock, capture_limits=limits)
    await corpus.capture("t", ["tiny", "z" * 51, "first answer", "second one", "third one"])
    await corpus.drain()
    docs = await corpus.select("t", recent=10)
    assert sorted(d.text for d in docs) == ["first answer", "second one"]


class BlockedStore:
    """Wraps a store; ``put`` waits until the test opens the gate."""

    def __init__(self, inner: DocumentStore) -> None:
        self.inner = inner
        self.gate = asyncio.Event()
        self.round_trips = 0

    async def put(self, *args, **kwargs):
        await self.gate.wait()
        return await self.inner.put(*args, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


async def test_capture_returns_before_the_store_answers(store: DocumentStore, clock) -> None:
    blocked = BlockedStore(store)
    corpus = Corpus(blocked, clock=clock)  # type: ignore[arg-type]
    await corpus.capture("t", ["an answer worth keeping"])
    assert corpus.capture_stats.stored == 0  # capture returned; the write is still waiting
    blocked.gate.set()
    await corpus.drain()
    assert corpus.capture_stats.stored == 1
    assert len(await corpus.list("t")) == 1


async def test_capture_gives_up_after_its_time_bound(store: DocumentStore, clock) -> None:
    corpus = Corpus(
        BlockedStore(store),  # type: ignore[arg-type]
        clock=clock,
        capture_limits=CaptureLimits(timeout_s=0.01, max_pending=1),
    )
    await corpus.capture("t", ["an answer worth keeping"])
    await corpus.capture("t", ["another answer, dropped: too many pending"])
    await corpus.drain()
    assert (corpus.capture_stats.stored, corpus.capture_stats.failed) == (0, 1)
    assert corpus.capture_stats.dropped == 1


async def test_capture_never_raises(corpus: Corpus) -> None:
    await corpus.capture("", ["bad namespace, but long enough text"])
    await corpus.capture("t", ["lone \ud800 surrogate answer text"])
    await corpus.capture("t", [None])  # type: ignore[list-item]
    await corpus.drain()
    assert corpus.capture_stats.failed == 3
    assert corpus.capture_stats.stored == 0


@pytest.fixture
def socket_writes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts commands (or pipelines) written to any Redis connection: one per round trip."""
    writes: list[int] = []
    original = AbstractConnection.send_packed_command

    async def counting(self, command, check_health=True):
        writes.append(1)
        return await original(self, command, check_health)

    monkeypatch.setattr(AbstractConnection, "send_packed_command", counting)
    return writes


async def test_select_is_one_round_trip(corpus: Corpus, socket_writes: list[int]) -> None:
    for i in range(20):
        await corpus.put("t", f"src/mod{i}.py", f"print({i})\n" * 50)
    await corpus.capture("t", [f"answer {i}, long enough to keep" for i in range(5)])
    await corpus.drain()
    prompt = " ".join(f"src/mod{i}.py" for i in range(10, 20))
    await corpus.select("t", ids=["src/mod0.py"], prompt_text=prompt, recent=5)  # warm up
    before_writes, before_trips = len(socket_writes), corpus.store.round_trips
    docs = await corpus.select(
        "t", ids=[f"src/mod{i}.py" for i in range(5)], prompt_text=prompt, recent=1
    )
    assert len(docs) == 16
    assert corpus.store.round_trips - before_trips == 1
    if isinstance(corpus.store, RedisDocumentStore):
        assert len(socket_writes) - before_writes == 1
    before_writes = len(socket_writes)
    await corpus.tokens("t", docs, "fp", lambda s: [1, 2, 3])  # cache fill: read + write
    await corpus.tokens("t", docs, "fp", lambda s: [1, 2, 3])  # cached: one MGET
    if isinstance(corpus.store, RedisDocumentStore):
        assert len(socket_writes) - before_writes == 3


async def test_too_many_ids_are_refused_before_the_store(store: DocumentStore, clock) -> None:
    """An oversized request costs the store nothing (and cannot open its circuit)."""
    corpus = Corpus(store, clock=clock, select_max_ids=64)
    await corpus.put("t", "a.py", "x = 1\n")
    trips = store.round_trips
    with pytest.raises(InvalidDocument, match="at most 64"):
        await corpus.select("t", ids=[f"d{i}.py" for i in range(100_000)])
    assert store.round_trips == trips
    breaker = getattr(store, "breaker", None)
    assert breaker is None or breaker.state == "closed"
    assert [d.id for d in await corpus.select("t", ids=["a.py"])] == ["a.py"]


async def test_mentions_are_looked_for_in_the_prompt_tail(corpus: Corpus) -> None:
    await corpus.put("t", "early.py", "e = 1\n")
    await corpus.put("t", "late.py", "l = 2\n")
    prompt = "see early.py\n" + "filler " * (MAX_SCAN_CHARS // 7 + 1) + "and late.py"
    assert [d.id for d in await corpus.select("t", prompt_text=prompt)] == ["late.py"]
