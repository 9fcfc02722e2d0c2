"""Redis down or stalled: fast `StoreUnavailable`, an open circuit, recovery when it is back."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Awaitable

import pytest

from lookup.corpus import CircuitBreaker, Corpus, RedisDocumentStore, StoreUnavailable, open_store

pytestmark = pytest.mark.redis

# A generous guard so a missing time budget fails the test instead of hanging it; the
# budget itself (50 ms) is what the store enforces.
GUARD_S = 5.0


class Ticks:
    """A monotonic clock the test advances by hand."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def _fails_unavailable(call: Awaitable[object], match: str) -> None:
    with pytest.raises(StoreUnavailable, match=match):
        await asyncio.wait_for(call, GUARD_S)


def test_breaker_opens_after_threshold_and_half_opens_after_cool_down() -> None:
    ticks = Ticks()
    breaker = CircuitBreaker(failure_threshold=2, reset_after_s=5.0, clock=ticks)
    assert breaker.allow() and breaker.state == "closed"
    breaker.failure()
    assert breaker.allow() and breaker.state == "closed"
    breaker.failure()
    assert breaker.state == "open" and not breaker.allow()
    ticks.now = 4.9
    assert not breaker.allow()
    ticks.now = 5.0
    assert breaker.allow() and breaker.state == "half_open"
    assert not breaker.allow()  # one trial at a time
    breaker.failure()  # the trial failed: open for another cool-down
    assert breaker.state == "open" and not breaker.allow()
    ticks.now = 10.0
    assert breaker.allow()
    breaker.success()
    assert breaker.state == "closed" and breaker.allow()


def test_success_resets_the_failure_count() -> None:
    breaker = CircuitBreaker(failure_threshold=2, clock=Ticks())
    breaker.failure()
    breaker.success()
    breaker.failure()
    assert breaker.state == "closed"


async def test_redis_stopped_then_restarted(redis_server, redis_prefix: str) -> None:
    ticks = Ticks()
    breaker = CircuitBreaker(failure_threshold=3, reset_after_s=5.0, clock=ticks)
    # a roomy budget: this test is about the circuit, not speed (the CI machine is shared)
    store = open_store(redis_server.url, prefix=redis_prefix, breaker=breaker, timeout_s=1.0)
    corpus = Corpus(store)
    await corpus.put("t", "a.py", "print(1)")
    assert (await corpus.get("t", "a.py")) is not None

    redis_server.stop()
    for _ in range(3):
        await _fails_unavailable(corpus.get("t", "a.py"), "unavailable")
    assert breaker.state == "open"
    trips = store.round_trips
    await _fails_unavailable(corpus.select("t", ids=["a.py"]), "circuit is open")
    await _fails_unavailable(corpus.put("t", "b.py", "x"), "circuit is open")
    assert store.round_trips == trips  # nothing was sent while the circuit is open

    # drafting goes on without stored token arrays
    doc_tokens = await corpus.tokens("t", [], "fp", list)
    assert doc_tokens == []

    redis_server.start()  # same port, empty (no persistence)
    await _fails_unavailable(corpus.list("t"), "circuit is open")  # still cooling down
    ticks.now += 5.0
    assert await corpus.list("t") == []  # the half-open trial succeeds and closes it
    assert breaker.state == "closed"
    await corpus.put("t", "a.py", "print(2)")
    doc = await corpus.get("t", "a.py")
    assert doc is not None and doc.text == "print(2)"
    await store.aclose()


async def test_stalled_redis_times_out_within_budget(redis_server, redis_prefix: str) -> None:
    store = open_store(redis_server.url, prefix=redis_prefix)  # default 50 ms budget
    assert isinstance(store, RedisDocumentStore) and store.timeout_s == 0.05
    corpus = Corpus(store)
    store.timeout_s = 1.0  # roomy for set-up and recovery: the CI machine is shared
    await corpus.put("t", "a.py", "print(1)")
    store.timeout_s = 0.05
    assert redis_server.proc is not None
    os.kill(redis_server.proc.pid, signal.SIGSTOP)  # accepts connections, never answers
    try:
        await _fails_unavailable(corpus.get("t", "a.py"), "timed out")
    finally:
        os.kill(redis_server.proc.pid, signal.SIGCONT)
    store.timeout_s = 1.0
    doc = await corpus.get("t", "a.py")  # a fresh connection works again
    assert doc is not None and doc.text == "print(1)"
    await store.aclose()


async def test_unreachable_server_fails_fast() -> None:
    store = open_store("redis://127.0.0.1:1/0", breaker=CircuitBreaker(clock=Ticks()))
    await _fails_unavailable(Corpus(store).list("t"), "unavailable")
    await store.aclose()


async def test_tokens_are_encoded_even_when_redis_is_down(redis_server, redis_prefix) -> None:
    store = open_store(redis_server.url, prefix=redis_prefix, timeout_s=1.0)
    corpus = Corpus(store)
    await corpus.put("t", "a", "abc")
    docs = await corpus.select("t", ids=["a"])
    redis_server.stop()
    [(sha, tokens)] = await corpus.tokens("t", docs, "fp", lambda s: [ord(c) for c in s])
    assert sha == docs[0].sha256 and tokens.tolist() == [97, 98, 99]
    await store.aclose()
