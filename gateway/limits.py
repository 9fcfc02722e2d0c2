"""Per-tenant limits: requests in flight, requests, tokens and uploads per minute.

A refused request is a 429 with ``Retry-After`` and OpenAI's ``x-ratelimit-*`` headers.
Minute windows are fixed and start at a tenant's first request (``INCR`` + ``PEXPIRE``),
so replicas need no shared clock. With Redis configured the counters live there, one Lua
script per admission (every key of a tenant shares one Redis Cluster hash tag), so the
limits hold across gateway replicas; without Redis (the embedded default) they live in
this process. When Redis does not answer, this process's counters stand in: a limiter
must not turn a Redis outage into an outage of the gateway. After a call Redis did not
answer (an error, or no answer within ``timeout_s``: a Redis that silently drops packets)
the limiter stops asking it for ``BREAKER_COOL_DOWN_S`` and counts here; then one call
tries it again while the others still count here, and its answer closes the breaker
or opens it for another cool-down. So while Redis is gone a request waits out at most
one timeout (the trial's), not one per call. A release whose answer does
not come in time (or an admission answered too late, which Redis may have counted) is
owed and retried in the background until Redis takes it: a slot left counted would
refuse the tenant's requests until the count expired, so the count errs low (never below
zero), never high. A request the counts Redis
last answered already refuse (a full window) is refused without asking again
(:class:`~gateway.limit_windows.Seen`), and so is one of a tenant Redis found with all its
requests in flight a moment ago: a client that keeps sending once refused costs no round
trip, or one per moment.

Tokens are counted at admission as OpenAI does: the prompt estimated from the body's
bytes (4 per token), then the most the answers may use once they are known: ``n`` times
``max_tokens`` (a local endpoint's default when absent, within its cap).
The bytes are those the body's ``Content-Length`` declares, counted before the body is
read, so that big bodies spend their sender's budget and one it cannot pay for is refused
without being read or parsed (a body sent without a length is counted once read).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisError
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.auth import Authenticator
from gateway.config import LimitsConfig
from gateway.errors import GatewayError, PermissionDenied, RateLimited
from gateway.http.asgi import send_error
from gateway.limit_windows import WINDOW_S, Seen, Verdict, Windows
from lookup.corpus.keys import digest

log = logging.getLogger(__name__)

IN_FLIGHT_TTL_S = 900.0  # a crashed replica's in-flight count fades after this
RELEASE_RETRY_S = (0.5, 8.0)  # a release Redis did not take is retried after this, doubling
BREAKER_COOL_DOWN_S = 5.0  # after a call Redis did not answer, count here this long
BYTES_PER_TOKEN = 4

# KEYS: in-flight, requests, tokens. ARGV: in-flight limit, request limit, token limit,
# tokens, window ms, in-flight ttl ms. Returns {refused kind (0 = admitted), requests,
# tokens, requests window ms left, tokens window ms left}.
_ADMIT = """
local inflight = tonumber(redis.call('GET', KEYS[1]) or '0')
local requests = tonumber(redis.call('GET', KEYS[2]) or '0')
local tokens = tonumber(redis.call('GET', KEYS[3]) or '0')
local want = tonumber(ARGV[4])
local ttl_r, ttl_t = redis.call('PTTL', KEYS[2]), redis.call('PTTL', KEYS[3])
local refused = 0
if inflight >= tonumber(ARGV[1]) then refused = 1
elseif requests + 1 > tonumber(ARGV[2]) then refused = 2
elseif tokens + want > tonumber(ARGV[3]) then refused = 3 end
if refused == 0 then
  redis.call('INCR', KEYS[1])
  redis.call('PEXPIRE', KEYS[1], ARGV[6])
  requests = redis.call('INCR', KEYS[2])
  if requests == 1 then redis.call('PEXPIRE', KEYS[2], ARGV[5]); ttl_r = tonumber(ARGV[5]) end
  tokens = redis.call('INCRBY', KEYS[3], want)
  if tokens == want then redis.call('PEXPIRE', KEYS[3], ARGV[5]); ttl_t = tonumber(ARGV[5]) end
end
return {refused, requests, tokens, ttl_r, ttl_t}
"""
# KEYS: tokens. ARGV: token limit, tokens, window ms. Returns {refused (0/1), tokens, ms left}.
_CHARGE = """
local tokens = tonumber(redis.call('GET', KEYS[1]) or '0')
local ttl = redis.call('PTTL', KEYS[1])
if tokens + tonumber(ARGV[2]) > tonumber(ARGV[1]) then return {1, tokens, ttl} end
tokens = redis.call('INCRBY', KEYS[1], ARGV[2])
if ttl < 0 then redis.call('PEXPIRE', KEYS[1], ARGV[3]); ttl = tonumber(ARGV[3]) end
return {0, tokens, ttl}
"""
# KEYS: a window's counter. ARGV: window ms. Returns {count, ms left}.
_COUNT = """
local count = redis.call('INCR', KEYS[1])
local ttl = redis.call('PTTL', KEYS[1])
if ttl < 0 then redis.call('PEXPIRE', KEYS[1], ARGV[1]); ttl = tonumber(ARGV[1]) end
return {count, ttl}
"""
# KEYS: in-flight. ARGV: releases (never below zero). Returns the count released.
_RELEASE = """
local released = math.min(tonumber(redis.call('GET', KEYS[1]) or '0'), tonumber(ARGV[1]))
if released > 0 then redis.call('DECRBY', KEYS[1], released) end
return released
"""


def _duration(seconds: float) -> str:
    """OpenAI's reset format: ``1s``, ``6m0s``, ``20ms``."""
    if seconds < 1:
        return f"{max(0, round(seconds * 1000))}ms"
    whole = math.ceil(seconds)
    minutes, rest = divmod(whole, 60)
    return f"{minutes}m{rest}s" if minutes else f"{rest}s"


class RateLimiter:
    """The gateway's per-tenant limits (one per app); ``redis``: a client, or None."""

    def __init__(
        self,
        limits: LimitsConfig,
        redis: Redis | RedisCluster | None = None,
        *,
        prefix: str = "dg:",
        timeout_s: float = 0.05,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limits = limits
        self._redis = redis
        self._prefix = prefix
        self._timeout_s = timeout_s
        self._clock = clock
        self._local = Windows(clock)
        self._seen = Seen(clock)
        self._warned_at = -WINDOW_S
        self._owed: dict[str, int] = {}  # tenant -> in-flight releases Redis has not taken
        self._open_until: float | None = None  # the breaker: None closed, else cool-down end
        self._trying = False  # a call tries Redis after the cool-down; the rest count here
        self._paying: asyncio.Task[None] | None = None
        self._admit: Any = redis.register_script(_ADMIT) if redis is not None else None
        self._release: Any = redis.register_script(_RELEASE) if redis is not None else None
        self._charge: Any = redis.register_script(_CHARGE) if redis is not None else None
        self._count_one: Any = redis.register_script(_COUNT) if redis is not None else None

    def _keys(self, tenant: str, *kinds: str) -> list[str]:
        base = f"{self._prefix}{{rl:{digest(tenant)}}}:"
        return [base + kind for kind in kinds]

    async def _call(self, script: Any, keys: list[str], args: list[Any]) -> Any:
        """The script's answer, or None when Redis did not give one."""
        return (await self._attempt(script, keys, args))[0]

    async def _attempt(self, script: Any, keys: list[str], args: list[Any]) -> tuple[Any, bool]:
        """The script's answer, or None and whether it may have run all the same (the
        call was sent, its answer came too late). None at once while the breaker is open,
        or while another call tries Redis after the cool-down."""
        if self._open_until is not None:
            if self._trying or self._clock() < self._open_until:
                return None, False
            self._trying = True
        try:  # a timeout scope, not ``wait_for``: no task created per call
            async with asyncio.timeout(self._timeout_s):
                result = await script(keys=keys, args=args)
        except (RedisError, OSError, TimeoutError) as exc:
            self._open_until = self._clock() + BREAKER_COOL_DOWN_S
            self._unavailable(exc)
            return None, isinstance(exc, TimeoutError)
        finally:
            self._trying = False
        self._open_until = None
        return result, False

    def _unavailable(self, exc: Exception) -> None:
        """Log that Redis did not answer, at most once a minute."""
        now = time.monotonic()
        if now - self._warned_at >= WINDOW_S:
            self._warned_at = now
            log.warning("rate limits: Redis unavailable (%r), counting in this process", exc)

    def known_refusal(self, tenant: str) -> RateLimited | None:
        """The 429 this process already knows a request of ``tenant`` gets, or None: its
        requests a minute spent (or its requests in flight all taken, a moment ago) as
        Redis last answered, or (counting here) its requests in flight or a minute all
        used. No Redis call."""
        if self._admit is not None and self._open_until is None:
            verdict = self._seen.refusal(tenant, self.limits, 0)
        else:
            verdict = self._local.refusal(tenant, self.limits)
        return None if verdict is None else self._refusal(verdict)

    async def admit(self, tenant: str, tokens: int) -> Lease:
        """Count one request of ``tokens``; :class:`RateLimited` when over a limit."""
        limits = self.limits
        verdict: Verdict | None = None
        if self._admit is not None:
            verdict = self._seen.refusal(tenant, limits, tokens)
            if verdict is not None:
                raise self._refusal(verdict)
            args = [
                limits.concurrent,
                limits.requests_per_minute,
                limits.tokens_per_minute,
                tokens,
                int(WINDOW_S * 1000),
                int(IN_FLIGHT_TTL_S * 1000),
            ]
            keys = self._keys(tenant, "inflight", "requests", "tokens")
            asked_at = self._clock()
            result, maybe_counted = await self._attempt(self._admit, keys, args)
            if maybe_counted:  # in Redis's count perhaps: released there once it can be
                self._owe(tenant)
            if result is not None:
                kind, requests, used, ttl_r, ttl_t = (int(v) for v in result)
                refused = (None, "concurrent", "requests", "tokens")[kind]
                verdict = Verdict(
                    refused, requests, used, max(ttl_r, 0) / 1000, max(ttl_t, 0) / 1000
                )
                self._seen.note(tenant, "requests", requests, verdict.requests_reset_s, asked_at)
                self._seen.note(tenant, "tokens", used, verdict.tokens_reset_s, asked_at)
                if refused is None:
                    return Lease(tenant, in_redis=True)
                if refused == "concurrent":
                    self._seen.note_full(tenant, asked_at)
        if verdict is None:
            verdict = self._local.admit(tenant, limits, tokens)
            if verdict.refused is None:
                return Lease(tenant, in_redis=False)
        raise self._refusal(verdict)

    async def charge(self, tenant: str, tokens: int) -> None:
        """Count ``tokens`` more for a request already admitted (its ``max_tokens`` once
        known, an upload's body); :class:`RateLimited` when they would pass the limit."""
        if tokens <= 0:
            return
        limit = self.limits.tokens_per_minute
        result = None
        if self._charge is not None:
            seen = self._seen.refusal(tenant, self.limits, tokens, requests=0, in_flight=False)
            if seen is not None:
                raise self._refusal(seen)
            (key,) = self._keys(tenant, "tokens")
            asked_at = self._clock()
            result = await self._call(self._charge, [key], [limit, tokens, int(WINDOW_S * 1000)])
        if result is not None:
            refused, used, ttl = (int(v) for v in result)
            verdict = Verdict("tokens" if refused else None, 0, used, 0.0, max(ttl, 0) / 1000)
            self._seen.note(tenant, "tokens", used, verdict.tokens_reset_s, asked_at)
        else:
            verdict = self._local.charge(tenant, limit, tokens)
        if verdict.refused is not None:
            raise self._refusal(verdict)

    def _refusal(self, verdict: Verdict) -> RateLimited:
        limits = self.limits
        headers = {
            "x-ratelimit-limit-requests": str(limits.requests_per_minute),
            "x-ratelimit-remaining-requests": str(
                max(0, limits.requests_per_minute - verdict.requests)
            ),
            "x-ratelimit-reset-requests": _duration(verdict.requests_reset_s),
            "x-ratelimit-limit-tokens": str(limits.tokens_per_minute),
            "x-ratelimit-remaining-tokens": str(max(0, limits.tokens_per_minute - verdict.tokens)),
            "x-ratelimit-reset-tokens": _duration(verdict.tokens_reset_s),
        }
        if verdict.refused == "concurrent":
            wait, what = 1.0, f"{limits.concurrent} requests in flight"
        elif verdict.refused == "requests":
            wait, what = verdict.requests_reset_s, f"{limits.requests_per_minute} requests a minute"
        else:
            wait, what = verdict.tokens_reset_s, f"{limits.tokens_per_minute} tokens a minute"
        headers["retry-after"] = str(max(1, math.ceil(wait)))
        return RateLimited(
            f"rate limit reached for this key: {what}; retry after {headers['retry-after']} s",
            headers=headers,
        )

    async def release(self, lease: Lease) -> None:
        """The request is over: it no longer counts as in flight. A release Redis does not
        take is owed and retried in the background: a slot left counted would refuse the
        tenant's requests until the count expires."""
        if not lease.in_redis:
            self._local.release(lease.tenant)
        elif await self._call(self._release, self._keys(lease.tenant, "inflight"), [1]) is None:
            self._owe(lease.tenant)

    def _owe(self, tenant: str) -> None:
        self._owed[tenant] = self._owed.get(tenant, 0) + 1
        if self._paying is None or self._paying.done():
            self._paying = asyncio.get_running_loop().create_task(self._pay())

    async def _pay(self) -> None:
        """Retry the owed releases until Redis took them all (backing off while it does
        not)."""
        wait, longest = RELEASE_RETRY_S
        while self._owed:
            await asyncio.sleep(wait)
            for tenant in list(self._owed):
                owed = self._owed.pop(tenant)
                keys = self._keys(tenant, "inflight")
                if await self._call(self._release, keys, [owed]) is None:
                    self._owed[tenant] = self._owed.get(tenant, 0) + owed
            wait = min(2 * wait, longest)

    async def _count(self, tenant: str, kind: str, limit: int) -> tuple[bool, int, float]:
        """One more in a tenant's ``kind`` window unless it passes ``limit`` (Redis,
        else this process): whether it fitted, the count, the seconds left."""
        if self._redis is None:
            return self._local.count(tenant, kind, limit)
        result = await self._call(self._count_one, self._keys(tenant, kind), [int(WINDOW_S * 1000)])
        if result is None:
            return self._local.count(tenant, kind, limit)
        count, ttl_ms = (int(v) for v in result)
        return count <= limit, count, max(ttl_ms, 0) / 1000

    async def count(self, tenant: str) -> None:
        """Count one request answered at once, never in flight (a refusal): one Redis
        call, none once the requests seen fill the window; :class:`RateLimited` past
        ``requests_per_minute``."""
        limit = self.limits.requests_per_minute
        if self._redis is not None:
            seen = self._seen.refusal(tenant, self.limits, 0, in_flight=False)
            if seen is not None:
                raise self._refusal(seen)
        asked_at = self._clock()
        ok, count, reset_s = await self._count(tenant, "requests", limit)
        if self._redis is not None:
            self._seen.note(tenant, "requests", count, reset_s, asked_at)
        if not ok:
            raise self._refusal(Verdict("requests", count, 0, reset_s, 0.0))

    async def admit_upload(self, tenant: str) -> None:
        """Count one document upload; :class:`RateLimited` past ``uploads_per_minute``."""
        limit = self.limits.uploads_per_minute
        ok, count, reset_s = await self._count(tenant, "uploads", limit)
        if not ok:
            retry = str(max(1, math.ceil(reset_s)))
            raise RateLimited(
                f"rate limit reached for this key: {limit} uploads a minute; retry after {retry} s",
                headers={
                    "retry-after": retry,
                    "x-ratelimit-limit-requests": str(limit),
                    "x-ratelimit-remaining-requests": "0",
                    "x-ratelimit-reset-requests": _duration(reset_s),
                },
            )

    async def aclose(self) -> None:
        if self._paying is not None:
            self._paying.cancel()
        if self._redis is not None:
            await self._redis.aclose()


@dataclass(frozen=True)
class Lease:
    """One admitted request, to hand back to :meth:`RateLimiter.release` when it is over."""

    tenant: str
    in_redis: bool


def tenant_limits(
    app: ASGIApp,
    *,
    auth: Authenticator,
    limiter: RateLimiter,
    exempt: frozenset[str],
    admin_only: frozenset[tuple[str, str]] = frozenset(),
) -> ASGIApp:
    """ASGI middleware: every request to a path not in ``exempt`` counts toward its
    tenant's requests in flight and per minute (the completion routes count their own,
    with tokens). A request without a valid key goes on to its route, which answers 401
    (behind :class:`gateway.http.guard.Door`, none comes here).
    One to an ``admin_only`` (method, path) without an admin key is refused here (403,
    or 429 past the requests a minute): counted, but never in flight, so one Redis call
    (none once the window is full) instead of an admission and a release."""

    async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in exempt:
            await app(scope, receive, send)
            return
        try:
            tenant = auth.tenant(scope)
        except GatewayError:
            await app(scope, receive, send)
            return
        if (scope["method"], scope["path"]) in admin_only:
            try:
                auth.admin(scope)
            except PermissionDenied as denied:
                error: GatewayError = denied
                try:
                    await limiter.count(tenant)
                except RateLimited as limited:
                    error = limited
                await send_error(send, error)
                return
        try:
            lease = await limiter.admit(tenant, 0)
        except RateLimited as error:
            await send_error(send, error)
            return
        try:
            await app(scope, receive, send)
        finally:
            await limiter.release(lease)

    return middleware


def prompt_tokens(body_bytes: int) -> int:
    """Tokens a request body of ``body_bytes`` is counted for (no tokenizer: bytes / 4)."""
    return body_bytes // BYTES_PER_TOKEN


def open_limiter(
    limits: LimitsConfig, url: str | None, *, prefix: str, timeout_s: float
) -> RateLimiter:
    """The limiter for a Redis URL (``None``: this process's counters only)."""
    if not url or url == "memory://":
        return RateLimiter(limits)
    options: dict[str, Any] = {"socket_timeout": timeout_s, "socket_connect_timeout": timeout_s}
    scheme, _, rest = url.partition("://")
    client: Redis | RedisCluster
    if scheme.endswith("+cluster"):
        client = RedisCluster.from_url(f"{scheme.removesuffix('+cluster')}://{rest}", **options)
    else:
        client = Redis.from_url(url, **options)
    return RateLimiter(limits, client, prefix=prefix, timeout_s=timeout_s)
