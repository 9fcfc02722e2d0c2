"""The limiter's circuit breaker: a Redis that accepts connections and never answers (as
one whose packets are dropped) costs one timeout, then the limits are counted in this
process for the cool-down, then one call tries Redis again."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from redis.asyncio import Redis

from gateway.config import LimitsConfig
from gateway.errors import RateLimited
from gateway.limits import BREAKER_COOL_DOWN_S, RateLimiter

TIMEOUT_S = 0.05
SCRIPTS = ("_admit", "_release", "_charge", "_count_one")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port whose listener completes TCP handshakes and never reads or answers."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        yield listener.getsockname()[1]


def _limiter(url: str, clock: Clock, prefix: str, **limits: int) -> tuple[RateLimiter, list[str]]:
    """A limiter on ``url``, and the list its calls that reach Redis are noted in."""
    client = Redis.from_url(url, socket_timeout=TIMEOUT_S, socket_connect_timeout=TIMEOUT_S)
    limiter = RateLimiter(
        LimitsConfig(**limits), client, prefix=prefix, timeout_s=TIMEOUT_S, clock=clock
    )
    sent: list[str] = []
    for name in SCRIPTS:
        script = getattr(limiter, name)

        async def call(
            *, keys: list[str], args: list[Any], name: str = name, script: Any = script
        ) -> Any:
            sent.append(name.strip("_"))
            return await script(keys=keys, args=args)

        setattr(limiter, name, call)
    return limiter, sent


async def test_a_silent_redis_costs_one_timeout_per_cool_down(
    silent_port: int, redis_prefix: str
) -> None:
    clock = Clock()
    limiter, sent = _limiter(
        f"redis://127.0.0.1:{silent_port}/0", clock, redis_prefix, concurrent=2
    )
    lease = await limiter.admit("t", 10)  # waits out one timeout, then counts here
    assert sent == ["admit"] and not lease.in_redis
    await limiter.charge("t", 10)
    await limiter.release(lease)
    for _ in range(5):  # a whole completion each: nothing waits on Redis while open
        lease = await limiter.admit("t", 10)
        await limiter.charge("t", 10)
        await limiter.release(lease)
    await limiter.count("t")
    await limiter.admit_upload("t")
    assert sent == ["admit"]
    held = [await limiter.admit("t", 0), await limiter.admit("t", 0)]
    with pytest.raises(RateLimited):  # counted here meanwhile: the limits still hold
        await limiter.admit("t", 0)
    assert limiter.known_refusal("t") is not None
    for lease in held:
        await limiter.release(lease)
    clock.now += BREAKER_COOL_DOWN_S
    assert not (await limiter.admit("t", 0)).in_redis  # the one trial, timed out
    assert sent == ["admit", "admit"]
    await limiter.admit("t", 0)
    assert sent == ["admit", "admit"]  # open again
    await limiter.aclose()


async def test_one_call_tries_redis_while_the_others_count_here(
    silent_port: int, redis_prefix: str
) -> None:
    clock = Clock()
    limiter, sent = _limiter(f"redis://127.0.0.1:{silent_port}/0", clock, redis_prefix)
    await limiter.admit("t", 0)
    clock.now += BREAKER_COOL_DOWN_S
    leases = await asyncio.gather(*(limiter.admit("t", 0) for _ in range(8)))
    assert sent == ["admit", "admit"] and not any(lease.in_redis for lease in leases)
    await limiter.aclose()


@contextlib.asynccontextmanager
async def _switch(target: tuple[str, int]) -> AsyncIterator[tuple[int, list[bool]]]:
    """A TCP relay to ``target`` that, while ``dropping[0]``, takes new connections and
    drops what they send; its port and the switch."""
    dropping = [True]

    async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter | None) -> None:
            while data := await source.read(65536):
                if sink is not None:
                    sink.write(data)
                    await sink.drain()

        try:
            if dropping[0]:
                await pipe(reader, None)
                return
            up_reader, up_writer = await asyncio.open_connection(*target)
            await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(relay, "127.0.0.1", 0)
    async with server:
        yield server.sockets[0].getsockname()[1], dropping


@pytest.mark.redis
async def test_the_breaker_closes_once_redis_answers_a_trial(
    redis_url: str, redis_prefix: str, redis_client: Any
) -> None:
    real = redis_client.connection_pool.connection_kwargs
    async with _switch((real.get("host", "127.0.0.1"), real.get("port", 6379))) as (port, drop):
        clock = Clock()
        db = real.get("db", 0)
        limiter, sent = _limiter(f"redis://127.0.0.1:{port}/{db}", clock, redis_prefix)
        assert not (await limiter.admit("t", 0)).in_redis
        assert sent == ["admit"]
        drop[0] = False  # packets flow again; the breaker waits out its cool-down
        assert not (await limiter.admit("t", 0)).in_redis
        clock.now += BREAKER_COOL_DOWN_S
        lease = await limiter.admit("t", 0)  # the trial: answered
        assert lease.in_redis and sent == ["admit", "admit"]
        await limiter.release(lease)
        assert (await limiter.admit("t", 0)).in_redis  # closed: every call asks Redis
        assert sent == ["admit", "admit", "release", "admit"]
        (key,) = redis_client.keys(f"{redis_prefix}*requests")
        assert int(redis_client.get(key)) == 2  # the two admissions Redis answered
        await limiter.aclose()
