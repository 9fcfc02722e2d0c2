"""Per-tenant limits over HTTP: 429 with Retry-After and OpenAI's x-ratelimit-* headers,
in this process (embedded default) and in Redis, shared by gateway replicas."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import httpx
import pytest

from gateway import limits
from gateway.app import create_app
from tests.gateway.conftest import ENVIRON, standin_settings
from tests.gateway.servers import serve
from tests.openai_standin import StandIn

CHAT = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}
ALICE = {"authorization": "Bearer alice-key"}
BOB = {"authorization": "Bearer bob-key"}


def chat(url: str, headers: dict[str, str], **extra: Any) -> httpx.Response:
    return httpx.post(
        f"{url}/v1/chat/completions", json={**CHAT, **extra}, headers=headers, timeout=60
    )


def assert_limited(r: httpx.Response) -> dict[str, Any]:
    assert r.status_code == 429, r.text
    assert int(r.headers["retry-after"]) >= 1
    for kind in ("requests", "tokens"):
        for what in ("limit", "remaining", "reset"):
            assert f"x-ratelimit-{what}-{kind}" in r.headers
    error = r.json()["error"]
    assert (error["type"], error["code"]) == ("rate_limit_error", "rate_limit_exceeded")
    return error  # type: ignore[no-any-return]


@pytest.fixture
def gateways(standin_server: tuple[StandIn, str]) -> Iterator[Any]:
    """``start(n, limits, redis=None)`` -> n gateway URLs with those limits."""
    with ExitStack() as stack:

        def start(n: int, limits: dict[str, int], redis: dict[str, str] | None = None) -> list[str]:
            extra: dict[str, Any] = {"limits": limits}
            if redis is not None:
                extra["redis"] = redis
            settings = standin_settings(standin_server[1], **extra)
            return [
                stack.enter_context(serve(create_app(settings, environ=ENVIRON))) for _ in range(n)
            ]

        yield start


def test_requests_per_minute_per_tenant(gateways: Any, standin: StandIn) -> None:
    (url,) = gateways(1, {"requests_per_minute": 3})
    for _ in range(3):
        assert chat(url, ALICE).status_code == 200
    r = chat(url, ALICE)
    assert_limited(r)
    assert r.headers["x-ratelimit-limit-requests"] == "3"
    assert r.headers["x-ratelimit-remaining-requests"] == "0"
    assert 50 <= int(r.headers["retry-after"]) <= 60
    assert len(standin.requests) == 3
    assert chat(url, BOB).status_code == 200  # another tenant is not affected


def test_tokens_per_minute(gateways: Any) -> None:
    (url,) = gateways(1, {"tokens_per_minute": 1000})
    assert chat(url, ALICE, max_tokens=900).status_code == 200
    r = chat(url, ALICE, max_tokens=900)
    assert "tokens a minute" in assert_limited(r)["message"]
    assert int(r.headers["x-ratelimit-remaining-tokens"]) < 900
    assert chat(url, BOB, max_tokens=900).status_code == 200


def test_requests_in_flight(gateways: Any, standin: StandIn) -> None:
    (url,) = gateways(1, {"concurrent": 1})
    for _ in range(3):  # one at a time is always fine: each request gives its slot back
        assert chat(url, ALICE).status_code == 200
    with httpx.stream(
        "POST",
        f"{url}/v1/chat/completions",
        json={**CHAT, "model": "slow-stream", "stream": True},
        headers=ALICE,
    ) as slow:
        assert slow.status_code == 200
        assert standin.slow_started.wait(10)
        assert "in flight" in assert_limited(chat(url, ALICE))["message"]
        assert chat(url, BOB).status_code == 200


def test_uploads_per_minute(gateways: Any) -> None:
    (url,) = gateways(1, {"uploads_per_minute": 2})
    for i in range(2):
        doc = {"id": f"d{i}.py", "text": "x = 1\n"}
        assert httpx.post(f"{url}/v1/documents", json=doc, headers=ALICE).status_code == 201
    r = httpx.post(f"{url}/v1/documents", json={"id": "d3.py", "text": "y"}, headers=ALICE)
    assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1
    assert r.headers["x-ratelimit-limit-requests"] == "2"
    assert httpx.post(f"{url}/v1/documents", json={"id": "b", "text": "y"}, headers=BOB).is_success


@pytest.mark.redis
def test_limits_hold_across_replicas_in_redis(
    gateways: Any, standin: StandIn, redis_url: str, redis_prefix: str, redis_client: Any
) -> None:
    a, b = gateways(
        2, {"requests_per_minute": 4}, {"url": redis_url, "prefix": redis_prefix, "timeout_s": 1.0}
    )
    for url in (a, b, a, b):
        assert chat(url, ALICE).status_code == 200
    assert_limited(chat(a, ALICE))
    assert_limited(chat(b, ALICE))
    assert len(standin.requests) == 4
    # one hash tag per tenant: the script's keys share a Redis Cluster slot
    keys = [k.decode() for k in redis_client.scan_iter(match=f"{redis_prefix}{{rl:*")]
    assert len(keys) == 3
    counts = {k.rsplit(":", 1)[1]: int(redis_client.get(k)) for k in keys}
    assert counts["requests"] == 4 and counts["inflight"] == 0
    assert 0 < redis_client.pttl(next(k for k in keys if k.endswith("requests"))) <= 60_000


def test_every_route_counts_toward_requests_per_minute(gateways: Any) -> None:
    (url,) = gateways(1, {"requests_per_minute": 2})
    assert httpx.get(f"{url}/v1/models", headers=ALICE).status_code == 200
    assert httpx.get(f"{url}/v1/documents", headers=ALICE).status_code == 200
    for path in ("/v1/models", "/v1/endpoints"):
        assert_limited(httpx.get(f"{url}{path}", headers=ALICE))
    assert_limited(chat(url, ALICE))
    assert httpx.get(f"{url}/healthz").status_code == 200  # not a tenant's request
    assert httpx.get(f"{url}/v1/models", headers=BOB).status_code == 200


def test_upload_bytes_count_as_tokens(gateways: Any) -> None:
    (url,) = gateways(1, {"tokens_per_minute": 1000})
    small = {"id": "a.py", "text": "x" * 1000}
    assert httpx.post(f"{url}/v1/documents", json=small, headers=ALICE).status_code == 201
    big = {"id": "b.py", "text": "x" * 5000}
    r = httpx.post(f"{url}/v1/documents", json=big, headers=ALICE)
    assert "tokens a minute" in assert_limited(r)["message"]
    assert httpx.get(f"{url}/v1/documents/b.py", headers=ALICE).status_code == 404


def _headers_only(url: str, path: str, declared: int) -> bytes:
    """Send a POST's headers declaring ``declared`` body bytes, none of the body, and
    return the response's head (the server waits for the body unless it answers first)."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(
            f"POST {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer alice-key\r\n"
            f"Content-Type: application/json\r\nContent-Length: {declared}\r\n\r\n".encode()
        )
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = sock.recv(4096)  # a socket.timeout here: the gateway waited for the body
            if not chunk:
                break
            head += chunk
    return head


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/documents"])
def test_a_declared_body_over_the_token_budget_is_refused_unread(
    gateways: Any, standin: StandIn, path: str
) -> None:
    (url,) = gateways(1, {"tokens_per_minute": 1000})
    head = _headers_only(url, path, 1_000_000)  # 250k tokens
    assert head.startswith(b"HTTP/1.1 429 "), head
    assert b"\r\nretry-after: " in head.lower() and b"x-ratelimit-remaining-tokens" in head
    assert standin.requests == []
    assert chat(url, ALICE, max_tokens=10).status_code == 200  # the budget was not spent


@pytest.fixture
def redis_app(standin_server: tuple[StandIn, str], redis_url: str, redis_prefix: str) -> Any:
    """A gateway counting in Redis, 3 requests a minute; its app (``.url`` set)."""
    redis = {"url": redis_url, "prefix": redis_prefix, "timeout_s": 1.0}
    settings = standin_settings(standin_server[1], limits={"requests_per_minute": 3}, redis=redis)
    app = create_app(settings, environ=ENVIRON)
    with serve(app) as url:
        app.state.url = url
        yield app


def _redis_calls(app: Any, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The limiter's admission calls to Redis from now on (one per script run). Releases of
    earlier requests' slots are left out: they may land after their response was read."""
    limiter = app.state.runtime.limiter
    calls: list[str] = []
    real = limiter._attempt

    async def spy(script: Any, keys: list[str], args: list[Any]) -> Any:
        if script is not limiter._release:
            calls.append(keys[0].rsplit(":", 1)[1])
        return await real(script, keys, args)

    monkeypatch.setattr(limiter, "_attempt", spy)
    return calls


@pytest.mark.redis
def test_a_full_window_refuses_without_asking_redis(
    redis_app: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = redis_app.state.url
    calls = _redis_calls(redis_app, monkeypatch)
    for _ in range(3):
        assert chat(url, ALICE).status_code == 200
    asked = len(calls)  # the third admission's answer shows the window full...
    assert asked > 0
    for _ in range(5):  # ...so it is not asked again before the window ends
        r = chat(url, ALICE)
        assert assert_limited(r) and r.headers["x-ratelimit-remaining-requests"] == "0"
        assert_limited(httpx.get(f"{url}/v1/models", headers=ALICE))
    assert len(calls) == asked
    assert chat(url, BOB).status_code == 200  # another tenant asks Redis
    assert len(calls) > asked


@pytest.mark.redis
def test_audits_without_an_admin_key_are_counted_in_one_call(
    redis_app: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Refused at once: counted toward the requests a minute, never in flight."""
    url = redis_app.state.url
    calls = _redis_calls(redis_app, monkeypatch)
    audit = {"endpoint": "openai", "requests": 10**9, "concurrency": [10**7]}
    for n in range(1, 4):
        r = httpx.post(f"{url}/v1/audits", json=audit, headers=ALICE)
        assert (r.status_code, r.json()["error"]["type"]) == (403, "permission_error")
        assert calls == ["requests"] * n  # counted, never in flight
    assert_limited(httpx.post(f"{url}/v1/audits", json=audit, headers=ALICE))
    assert_limited(chat(url, ALICE))  # the audits spent the window
    assert calls == ["requests"] * 3


@pytest.mark.redis
@pytest.mark.parametrize("lost_answer", ["release", "admission"])
def test_a_slot_whose_redis_answer_came_too_late_is_released(
    standin_server: tuple[StandIn, str],
    redis_url: str,
    redis_prefix: str,
    redis_client: Any,
    monkeypatch: pytest.MonkeyPatch,
    lost_answer: str,
) -> None:
    """A slow Redis (under load) answering a release, or an admission it counted, too
    late must not leave the slot counted: with one request in flight allowed, that would
    refuse every later request of the tenant until the count expired."""
    monkeypatch.setattr(limits, "RELEASE_RETRY_S", (0.01, 0.05))
    redis = {"url": redis_url, "prefix": redis_prefix, "timeout_s": 1.0}
    settings = standin_settings(standin_server[1], limits={"concurrent": 1}, redis=redis)
    app = create_app(settings, environ=ENVIRON)
    limiter = app.state.runtime.limiter
    real = limiter._attempt
    lost: list[str] = []  # the in-flight key of the call whose answer was lost

    async def late(script: Any, keys: list[str], args: list[Any]) -> tuple[Any, bool]:
        if lost:
            return await real(script, keys, args)
        if lost_answer == "release" and script is limiter._release:
            lost.append(keys[0])
            return None, True  # not taken (or taken: the count errs low, never high)
        if lost_answer == "admission" and script is limiter._admit:
            await real(script, keys, args)  # counted in Redis...
            lost.append(keys[0])
            return None, True  # ...but the answer came too late
        return await real(script, keys, args)

    monkeypatch.setattr(limiter, "_attempt", late)
    with serve(app) as url:
        assert chat(url, ALICE).status_code == 200
        deadline = time.monotonic() + 20
        while not lost or int(redis_client.get(lost[0]) or 0):  # released again later
            assert time.monotonic() < deadline, "the slot stayed counted"
            time.sleep(0.01)
        for _ in range(3):
            assert chat(url, ALICE).status_code == 200
