"""Stored responses (``store`` not false): per tenant, in Redis or in process memory.

A stored response is its response object and the input items the model saw (the items of
every response it continues, then its own), one JSON value. Each tenant's responses live
under their own keys (a hash of the tenant names them): another tenant's id is simply not
found. A response is kept ``ttl_s`` seconds; past ``max_responses`` responses or
``max_bytes`` bytes a tenant's oldest ones are dropped to make room, and one larger than
``max_bytes`` on its own is not kept. Both stores apply the same rules.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from lookup.corpus.breaker import CircuitBreaker
from lookup.corpus.errors import StoreUnavailable
from lookup.corpus.keys import digest

MIN_TIMEOUT_S = 0.5  # a stored conversation may be megabytes: more than a document lookup


@dataclass(frozen=True)
class Limits:
    ttl_s: float
    max_responses: int
    max_bytes: int


@dataclass(frozen=True)
class Stored:
    """A stored response: the response object and the input items it answered."""

    response: dict[str, Any]
    input: list[dict[str, Any]]

    def encode(self) -> bytes:
        return json.dumps(
            {"response": self.response, "input": self.input}, ensure_ascii=False
        ).encode()

    @classmethod
    def decode(cls, blob: bytes) -> Stored:
        value = json.loads(blob)
        return cls(value["response"], value["input"])


class ResponseStore(Protocol):
    """Stored responses per tenant; ``StoreUnavailable`` when the backend fails."""

    async def put(self, tenant: str, response_id: str, stored: Stored) -> bool:
        """Keep ``stored``; False when it is larger than a tenant may hold."""
        ...

    async def get(self, tenant: str, response_id: str) -> Stored | None: ...

    async def delete(self, tenant: str, response_id: str) -> bool: ...

    async def aclose(self) -> None: ...


class MemoryResponseStore:
    """The embedded store: one process, nothing shared."""

    def __init__(self, limits: Limits, clock: Callable[[], float] = time.monotonic) -> None:
        self.limits = limits
        self._clock = clock
        # tenant -> id -> (stored at, blob), oldest first
        self._tenants: dict[str, OrderedDict[str, tuple[float, bytes]]] = {}
        self._bytes: dict[str, int] = {}

    def _live(self, tenant: str) -> OrderedDict[str, tuple[float, bytes]]:
        entries = self._tenants.setdefault(tenant, OrderedDict())
        oldest = self._clock() - self.limits.ttl_s
        while entries:
            first = next(iter(entries))
            if entries[first][0] > oldest:
                break
            self._drop(tenant, first)
        return entries

    def _drop(self, tenant: str, response_id: str) -> None:
        _, blob = self._tenants[tenant].pop(response_id)
        self._bytes[tenant] -= len(blob)

    async def put(self, tenant: str, response_id: str, stored: Stored) -> bool:
        blob = stored.encode()
        if len(blob) > self.limits.max_bytes:
            return False
        entries = self._live(tenant)
        if response_id in entries:
            self._drop(tenant, response_id)
        total = self._bytes.get(tenant, 0)
        while entries and (
            len(entries) >= self.limits.max_responses or total + len(blob) > self.limits.max_bytes
        ):
            self._drop(tenant, next(iter(entries)))
            total = self._bytes[tenant]
        entries[response_id] = (self._clock(), blob)
        self._bytes[tenant] = total + len(blob)
        return True

    async def get(self, tenant: str, response_id: str) -> Stored | None:
        entry = self._live(tenant).get(response_id)
        return None if entry is None else Stored.decode(entry[1])

    async def delete(self, tenant: str, response_id: str) -> bool:
        if response_id not in self._live(tenant):
            return False
        self._drop(tenant, response_id)
        return True

    async def aclose(self) -> None:
        return None


# KEYS: the tenant's index (ZSET id-hash -> stored at). ARGV: key base, now, ttl_s, then
# per script as noted. Sizes live in the HASH base.."size" (id-hash -> bytes, "" -> total).
_PURGE = """
local base, now, ttl = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local idx, sizes = KEYS[1], ARGV[1] .. 'size'
local function drop(h)
  local size = tonumber(redis.call('HGET', sizes, h) or '0')
  redis.call('DEL', base .. 'b:' .. h)
  redis.call('ZREM', idx, h)
  redis.call('HDEL', sizes, h)
  redis.call('HINCRBY', sizes, '', -size)
end
for _, h in ipairs(redis.call('ZRANGEBYSCORE', idx, '-inf', now - ttl)) do drop(h) end
"""
# ARGV[4..]: id-hash, blob, max_responses, max_bytes -> 1 stored, 0 too large
_PUT = (
    _PURGE
    + """
local h, blob = ARGV[4], ARGV[5]
local max_n, max_bytes = tonumber(ARGV[6]), tonumber(ARGV[7])
if #blob > max_bytes then return 0 end
if redis.call('ZSCORE', idx, h) then drop(h) end
local total = tonumber(redis.call('HGET', sizes, '') or '0')
while redis.call('ZCARD', idx) > 0
    and (redis.call('ZCARD', idx) >= max_n or total + #blob > max_bytes) do
  drop(redis.call('ZRANGE', idx, 0, 0)[1])
  total = tonumber(redis.call('HGET', sizes, '') or '0')
end
local ms = math.floor(ttl * 1000)
redis.call('SET', base .. 'b:' .. h, blob, 'PX', ms)
redis.call('ZADD', idx, now, h)
redis.call('HSET', sizes, h, #blob)
redis.call('HINCRBY', sizes, '', #blob)
redis.call('PEXPIRE', idx, ms)
redis.call('PEXPIRE', sizes, ms)
return 1
"""
)
# ARGV[4]: id-hash -> the blob or nil
_GET = _PURGE + "return redis.call('GET', base .. 'b:' .. ARGV[4])\n"
# ARGV[4]: id-hash -> 1 deleted, 0 not there
_DELETE = (
    _PURGE
    + """
if not redis.call('ZSCORE', idx, ARGV[4]) then return 0 end
drop(ARGV[4])
return 1
"""
)


class RedisResponseStore:
    """Stored responses in Redis (one server or a cluster: a tenant's keys share one
    hash slot); every call is one script, bounded by ``timeout_s`` and a circuit breaker."""

    def __init__(
        self, client: Redis | RedisCluster, limits: Limits, *, prefix: str, timeout_s: float
    ) -> None:
        self.client = client
        self.limits = limits
        self.prefix = prefix
        self.timeout_s = max(timeout_s, MIN_TIMEOUT_S)
        self.breaker = CircuitBreaker()
        self._put = client.register_script(_PUT)
        self._get = client.register_script(_GET)
        self._delete = client.register_script(_DELETE)

    def _args(self, tenant: str, response_id: str) -> tuple[list[str], list[Any]]:
        base = f"{self.prefix}resp:{{{digest(tenant)}}}:"
        return [base + "idx"], [base, repr(time.time()), self.limits.ttl_s, digest(response_id)]

    async def _call(self, script: Any, keys: list[str], args: list[Any]) -> Any:
        if not self.breaker.allow():
            raise StoreUnavailable("response store circuit is open after repeated failures")
        try:
            async with asyncio.timeout(self.timeout_s):
                result = await script(keys, args)
        except (RedisError, OSError, TimeoutError) as exc:
            self.breaker.failure()
            raise StoreUnavailable(f"response store unavailable ({type(exc).__name__})") from exc
        self.breaker.success()
        return result

    async def put(self, tenant: str, response_id: str, stored: Stored) -> bool:
        keys, args = self._args(tenant, response_id)
        limits = self.limits
        args += [stored.encode(), limits.max_responses, limits.max_bytes]
        return bool(await self._call(self._put, keys, args))

    async def get(self, tenant: str, response_id: str) -> Stored | None:
        keys, args = self._args(tenant, response_id)
        blob = await self._call(self._get, keys, args)
        return None if blob is None else Stored.decode(blob)

    async def delete(self, tenant: str, response_id: str) -> bool:
        keys, args = self._args(tenant, response_id)
        return bool(await self._call(self._delete, keys, args))

    async def aclose(self) -> None:
        await self.client.aclose()


def open_response_store(
    url: str | None, limits: Limits, *, prefix: str = "dg:", timeout_s: float = 0.05
) -> ResponseStore:
    """The store a URL names (as the document store reads it): ``None``, ``""`` or
    ``memory://`` -> in memory; ``redis://``, ``rediss://``, ``unix://`` -> one Redis
    server; ``redis+cluster://``, ``rediss+cluster://`` -> Redis Cluster."""
    if not url or url == "memory://":
        return MemoryResponseStore(limits)
    options: dict[str, Any] = {
        "socket_connect_timeout": max(timeout_s, MIN_TIMEOUT_S),
        "retry": Retry(NoBackoff(), 0),
    }
    scheme, _, rest = url.partition("://")
    client: Redis | RedisCluster
    if scheme.endswith("+cluster"):
        client = RedisCluster.from_url(f"{scheme.removesuffix('+cluster')}://{rest}", **options)
    else:
        client = Redis.from_url(url, **options)
    return RedisResponseStore(client, limits, prefix=prefix, timeout_s=timeout_s)
