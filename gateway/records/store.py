"""Where records live: Redis (shared by every gateway replica) or process memory.

Three things per endpoint: recent evidence (newest first, capped), latency samples of the
last hour (unix time, TTFT, TPOT), and passive counters (requests, prediction tokens).
"""

from __future__ import annotations

import time
import uuid
from collections import defaultdict, deque
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

from redis.exceptions import RedisError

from gateway.records.evidence import MAX_EVIDENCE
from lookup.corpus.breaker import CircuitBreaker
from lookup.corpus.errors import StoreUnavailable
from sdk.wire.evidence import Evidence

Sample = tuple[float, float | None, float | None]
"""(unix time, TTFT seconds, TPOT seconds) of one request."""

T = TypeVar("T")
WINDOW_S = 3600.0
MAX_SAMPLES = 20_000


class RecordStore(Protocol):
    """Async storage for speculation records and passive roll-ups."""

    async def add_evidence(self, endpoint: str, evidence: Evidence) -> None: ...
    async def evidence(self, endpoint: str) -> list[Evidence]: ...
    async def add_samples(self, endpoint: str, samples: list[Sample]) -> None: ...
    async def samples(self, endpoint: str, since: float) -> list[Sample]: ...
    async def add_counts(self, endpoint: str, counts: dict[str, int]) -> None: ...
    async def counts(self, endpoint: str) -> dict[str, int]: ...
    async def aclose(self) -> None: ...


class MemoryRecordStore:
    """The embedded store: one process, nothing shared."""

    def __init__(self) -> None:
        self._evidence: dict[str, deque[Evidence]] = defaultdict(lambda: deque(maxlen=MAX_EVIDENCE))
        self._samples: dict[str, deque[Sample]] = defaultdict(lambda: deque(maxlen=MAX_SAMPLES))
        self._counts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))

    async def add_evidence(self, endpoint: str, evidence: Evidence) -> None:
        self._evidence[endpoint].appendleft(evidence)

    async def evidence(self, endpoint: str) -> list[Evidence]:
        return list(self._evidence.get(endpoint, ()))

    async def add_samples(self, endpoint: str, samples: list[Sample]) -> None:
        self._samples[endpoint].extend(samples)

    async def samples(self, endpoint: str, since: float) -> list[Sample]:
        return [s for s in self._samples.get(endpoint, ()) if s[0] >= since]

    async def add_counts(self, endpoint: str, counts: dict[str, int]) -> None:
        for name, n in counts.items():
            self._counts[endpoint][name] += n

    async def counts(self, endpoint: str) -> dict[str, int]:
        return dict(self._counts.get(endpoint, {}))

    async def aclose(self) -> None:
        return None


def _num(text: str) -> float | None:
    return None if text == "-" else float(text)


class RedisRecordStore:
    """Records in Redis, with short socket timeouts and the corpus's circuit breaker, so a
    dead Redis never blocks a request. Failures raise ``StoreUnavailable``."""

    def __init__(self, url: str, *, prefix: str = "dg:", timeout_s: float = 0.25) -> None:
        import redis.asyncio as aioredis

        self._redis = aioredis.Redis.from_url(
            url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s, decode_responses=True
        )
        self._prefix = f"{prefix}rec:"
        self._breaker = CircuitBreaker()

    async def _guarded(self, op: Callable[[], Awaitable[T]]) -> T:
        if not self._breaker.allow():
            raise StoreUnavailable("record store unavailable (circuit open)")
        try:
            result = await op()
        except (RedisError, OSError) as exc:
            self._breaker.failure()
            raise StoreUnavailable(f"record store unavailable: {type(exc).__name__}") from exc
        self._breaker.success()
        return result

    def _key(self, what: str, endpoint: str) -> str:
        return f"{self._prefix}{what}:{endpoint}"

    async def _pipeline(self, fill: Callable[[Any], None]) -> None:
        async def run() -> None:
            async with self._redis.pipeline(transaction=False) as pipe:
                fill(pipe)
                await pipe.execute()

        await self._guarded(run)

    async def add_evidence(self, endpoint: str, evidence: Evidence) -> None:
        key = self._key("ev", endpoint)

        def fill(pipe: Any) -> None:
            pipe.lpush(key, evidence.model_dump_json())
            pipe.ltrim(key, 0, MAX_EVIDENCE - 1)

        await self._pipeline(fill)

    async def evidence(self, endpoint: str) -> list[Evidence]:
        key = self._key("ev", endpoint)
        raw = await self._guarded(lambda: self._redis.lrange(key, 0, MAX_EVIDENCE - 1))
        return [Evidence.model_validate_json(item) for item in raw]

    async def add_samples(self, endpoint: str, samples: list[Sample]) -> None:
        if not samples:
            return
        key = self._key("lat", endpoint)
        members = {
            f"{t:.6f}:{'-' if a is None else a}:{'-' if b is None else b}:{uuid.uuid4().hex[:8]}": t
            for t, a, b in samples
        }

        def fill(pipe: Any) -> None:
            pipe.zadd(key, members)
            pipe.zremrangebyscore(key, "-inf", time.time() - WINDOW_S)
            pipe.zremrangebyrank(key, 0, -MAX_SAMPLES - 1)
            pipe.expire(key, int(WINDOW_S * 2))

        await self._pipeline(fill)

    async def samples(self, endpoint: str, since: float) -> list[Sample]:
        key = self._key("lat", endpoint)
        raw = await self._guarded(lambda: self._redis.zrangebyscore(key, since, "+inf"))
        out: list[Sample] = []
        for member in raw:
            t, ttft, tpot, _ = str(member).split(":")
            out.append((float(t), _num(ttft), _num(tpot)))
        return out

    async def add_counts(self, endpoint: str, counts: dict[str, int]) -> None:
        key = self._key("cnt", endpoint)

        def fill(pipe: Any) -> None:
            for name, n in counts.items():
                pipe.hincrby(key, name, n)

        await self._pipeline(fill)

    async def counts(self, endpoint: str) -> dict[str, int]:
        key = self._key("cnt", endpoint)
        raw = await self._guarded(lambda: self._redis.hgetall(key))
        return {str(k): int(v) for k, v in raw.items()}

    async def aclose(self) -> None:
        await self._redis.aclose()


def open_record_store(url: str | None, *, prefix: str = "dg:") -> RecordStore:
    """``None`` -> in memory; a ``redis://`` URL -> Redis."""
    if url is None:
        return MemoryRecordStore()
    return RedisRecordStore(url, prefix=prefix)
