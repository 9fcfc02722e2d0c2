"""Health over HTTP against the OpenAI stand-in and a port nobody listens on: requests
fail over and eject the dead endpoint; active checks eject and re-admit."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from gateway.app import create_app
from gateway.config import build_settings
from tests.gateway.servers import serve
from tests.openai_standin import StandIn

DEAD = "http://127.0.0.1:9/v1"
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _settings(standin_url: str, **routing: Any) -> Any:
    return build_settings(
        {
            "endpoints": [
                {"name": "dead", "kind": "vllm", "base_url": DEAD, "models": ["m"]},
                {"name": "live", "kind": "vllm", "base_url": f"{standin_url}/v1", "models": ["m"]},
                {
                    "name": "hosted",
                    "kind": "openai",
                    "base_url": DEAD,
                    "models": ["other"],
                },
            ],
            "routing": {"failures": 2, "eject_s": 30, "health_check_interval_s": 0, **routing},
        }
    )


@pytest.fixture
def gateway(standin_server: tuple[StandIn, str]) -> Iterator[tuple[str, Any, Clock]]:
    """Endpoints tried in configuration order: the dead one first while it is admitted."""
    clock = Clock()
    app = create_app(_settings(standin_server[1], strategy="ordered"), environ={}, clock=clock)
    with serve(app) as url:
        yield url, app.state.runtime, clock


def test_requests_fail_over_and_eject_the_dead_endpoint(
    gateway: tuple[str, Any, Clock],
) -> None:
    url, runtime, clock = gateway
    served: Counter[str] = Counter()
    for _ in range(6):
        r = httpx.post(f"{url}/v1/chat/completions", json=CHAT)
        assert r.status_code == 200, r.text
        served[r.headers["x-draftgate-endpoint"]] += 1
    assert served == {"live": 6}
    dead = runtime.balancer.replicas["dead"]
    assert dead.health.state == "ejected" and dead.health.ejections == 1
    tried_while_healthy = dead.requests
    assert tried_while_healthy == 2  # the two failures that ejected it, none after
    clock.now += 30  # half-open: the next request tries it once, fails, moves on
    r = httpx.post(f"{url}/v1/chat/completions", json=CHAT)
    assert r.status_code == 200 and r.headers["x-draftgate-endpoint"] == "live"
    assert dead.requests == tried_while_healthy + 1
    assert dead.health.state == "ejected" and dead.health.ejected_for_s == 60


def test_active_checks_eject_and_readmit(standin_server: tuple[StandIn, str]) -> None:
    app = create_app(_settings(standin_server[1]), environ={}, clock=Clock())
    runtime = app.state.runtime
    checks = runtime.health_checks
    assert set(checks.upstreams) == {"dead", "live"}  # hosted providers are not checked

    async def scenario() -> None:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
            assert [await checks.run_once() for _ in range(2)] == [
                {"dead": False, "live": True}
            ] * 2
            listing = (await client.get("/v1/endpoints")).json()["data"]
            routing = {r["name"]: r["routing"] for r in listing}
            assert routing["dead"]["state"] == "ejected"
            assert routing["live"]["state"] == "healthy"
            # the endpoint comes back (the stand-in now answers there): one pass re-admits
            runtime.upstreams["dead"].adapter.base_url = f"{standin_server[1]}/v1"
            assert await checks.run_once() == {"dead": True, "live": True}
            assert runtime.balancer.replicas["dead"].health.state == "healthy"
        await runtime.aclose()

    asyncio.run(scenario())
