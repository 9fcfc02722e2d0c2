"""Two real ``draftgate verifier`` replicas (the tiny model) behind one gateway: requests are
spread over both; a replica killed under load costs no client an error, is ejected, and
is re-admitted once it is back (the back-off is driven by the gateway's injected clock)."""

from __future__ import annotations

import asyncio
import re
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from gateway.app import create_app
from gateway.config import build_settings
from tests.gateway.routing.conftest import MODEL
from tests.gateway.routing.processes import Process
from tests.gateway.servers import serve

EJECT_S = 30.0


class Clock:
    """The gateway's monotonic clock, moved by the test."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def gateway(replicas: dict[str, Process]) -> Iterator[tuple[str, Any, Clock]]:
    """A gateway in this process (real uvicorn) with both replicas as ``local`` endpoints."""
    settings = build_settings(
        {
            "endpoints": [
                {
                    "name": name,
                    "kind": "local",
                    "base_url": f"{p.url}/v1",
                    "models": [MODEL],
                    "retries": 0,
                }
                for name, p in replicas.items()
            ],
            "routing": {"failures": 2, "eject_s": EJECT_S, "health_check_interval_s": 0},
        }
    )
    clock = Clock()
    app = create_app(settings, environ={}, clock=clock)
    with serve(app) as url:
        yield url, app.state.runtime, clock


def _client(url: str) -> openai.AsyncOpenAI:
    # no client-side retries: an error the gateway let through must show
    return openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)


async def _chat(client: openai.AsyncOpenAI, i: int, max_tokens: int = 4) -> str:
    raw = await client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=[{"role": "user", "content": f"Count to {i}."}],
        max_tokens=max_tokens,
        temperature=0,
    )
    assert raw.parse().choices[0].message.content is not None
    return raw.headers["x-draftgate-endpoint"]


async def _spread(url: str, n: int, concurrency: int, max_tokens: int = 4) -> Counter[str]:
    client = _client(url)
    limit = asyncio.Semaphore(concurrency)

    async def one(i: int) -> str:
        async with limit:
            return await _chat(client, i, max_tokens)

    try:
        return Counter(await asyncio.gather(*(one(i) for i in range(n))))
    finally:
        await client.close()


def _metric(url: str, name: str, **labels: str) -> float:
    text = httpx.get(f"{url}/metrics").text
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    match = re.search(rf"^{name}{{{re.escape(want)}}} (\S+)$", text, re.M)
    assert match, f"{name}{{{want}}} not exported"
    return float(match.group(1))


def _routing(url: str, name: str) -> dict[str, Any]:
    records = httpx.get(f"{url}/v1/endpoints", timeout=30).json()["data"]
    return next(r["routing"] for r in records if r["name"] == name)  # type: ignore[no-any-return]


def test_forty_requests_spread_over_both_replicas(gateway: tuple[str, Any, Clock]) -> None:
    url, _, _ = gateway
    served = asyncio.run(_spread(url, 40, concurrency=8))
    assert sum(served.values()) == 40
    assert min(served["a"], served["b"]) >= 10, served
    for name in ("a", "b"):
        assert _metric(url, "draftgate_endpoint_routed_total", endpoint=name) == served[name]
        assert _routing(url, name)["state"] == "healthy"


@pytest.mark.slow
def test_a_replica_killed_under_load_is_ejected_then_readmitted(
    gateway: tuple[str, Any, Clock], replicas: dict[str, Process]
) -> None:
    url, runtime, clock = gateway
    b = runtime.balancer.replicas["b"]

    async def load_with_a_kill() -> Counter[str]:
        client = _client(url)
        limit = asyncio.Semaphore(6)
        done = 0
        killed: list[int] = []

        async def one(i: int) -> str:
            nonlocal done
            async with limit:
                served = await _chat(client, i, max_tokens=16)
            done += 1
            # Under load: the first completion from the sixth on that finds b serving.
            if done >= 6 and not killed and b.in_flight > 0:
                killed.append(b.in_flight)
                replicas["b"].kill()
            return served

        try:
            return Counter(await asyncio.gather(*(one(i) for i in range(24))))
        finally:
            await client.close()
            assert killed and killed[0] > 0, "b had nothing in flight when it was killed"

    served = asyncio.run(load_with_a_kill())  # raises if any client saw an error
    assert sum(served.values()) == 24
    routing = _routing(url, "b")
    assert routing["state"] == "ejected" and routing["ejections"] == 1
    assert _metric(url, "draftgate_endpoint_state", endpoint="b", state="ejected") == 1
    assert asyncio.run(_spread(url, 4, concurrency=2)) == {"a": 4}

    replicas["b"].start()  # back on the same port
    assert asyncio.run(_spread(url, 4, concurrency=2)) == {"a": 4}  # back-off not over
    clock.now += EJECT_S  # half-open: one trial request goes to b
    assert _routing(url, "b")["state"] == "half-open"
    served = asyncio.run(_spread(url, 8, concurrency=4))
    assert served["b"] >= 1
    assert _routing(url, "b")["state"] == "healthy"
    assert _metric(url, "draftgate_endpoint_state", endpoint="b", state="healthy") == 1
