"""Refusals the headers decide are answered at the door, before any route runs: no body
read, no JSON parsed, no limiter admission; requests without a valid key are limited per
client address (429 with Retry-After) without touching keyed clients at that address."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from gateway.app import create_app
from gateway.http.guard import client_address
from gateway.limit_windows import WINDOW_S, ClientWindows
from tests.gateway.conftest import ENVIRON, standin_settings
from tests.gateway.servers import serve
from tests.openai_standin import StandIn

CHAT = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}
ALICE = {"authorization": "Bearer alice-key"}
WRONG = {"authorization": "Bearer not-a-key"}


@pytest.fixture
def door_app(standin_server: tuple[StandIn, str]) -> Iterator[Any]:
    """A gateway (``.url`` set) allowing 3 keyless requests a minute per client address
    and 2 requests a minute per tenant; the limiter's admissions are listed in
    ``.admitted`` (the real limiter runs)."""
    limits = {"unauthenticated_per_minute": 3, "requests_per_minute": 2}
    app = create_app(standin_settings(standin_server[1], limits=limits), environ=ENVIRON)
    limiter = app.state.runtime.limiter
    real = limiter.admit
    app.state.admitted = []

    async def admit(tenant: str, tokens: int) -> Any:
        app.state.admitted.append(tenant)
        return await real(tenant, tokens)

    limiter.admit = admit
    with serve(app) as url:
        app.state.url = url
        yield app


def _head(url: str, request: bytes) -> bytes:
    """Send ``request`` (headers declaring a body that never comes) and return the
    answer's head: a socket timeout here means the gateway waited for the body."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(request)
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = sock.recv(4096)
            if not chunk:
                break
            head += chunk
    return head


def _post_head(path: str, auth: bytes) -> bytes:
    return (
        b"POST " + path.encode() + b" HTTP/1.1\r\nhost: 127.0.0.1\r\n" + auth
        + b"content-type: application/json\r\ncontent-length: 1000000\r\n\r\n"
    )  # fmt: skip


def test_keyless_requests_are_limited_per_address(door_app: Any, standin: StandIn) -> None:
    url = door_app.state.url
    for headers in (WRONG, {}, WRONG):
        r = httpx.post(f"{url}/v1/chat/completions", json=CHAT, headers=headers)
        assert r.status_code == 401
        assert r.json()["error"]["type"] == "authentication_error"
    for path in ("/v1/chat/completions", "/v1/documents"):
        r = httpx.post(f"{url}{path}", json=CHAT, headers=WRONG)
        assert r.status_code == 429, r.text
        assert 1 <= int(r.headers["retry-after"]) <= WINDOW_S
        assert r.json()["error"]["type"] == "rate_limit_error"
    assert httpx.get(f"{url}/v1/models", headers=WRONG).status_code == 429
    # a client with a key at the same address is served: the address's window is keyless
    assert httpx.post(f"{url}/v1/chat/completions", json=CHAT, headers=ALICE).status_code == 200
    assert httpx.get(f"{url}/healthz").status_code == 200  # probes are never counted
    assert door_app.state.admitted == ["alice"] and len(standin.requests) == 1
    metrics = httpx.get(f"{url}/metrics", headers={"authorization": "Bearer ops-key"}).text
    assert 'draftgate_refused_total{status="401"} 3.0' in metrics
    assert 'draftgate_refused_total{status="429"} 3.0' in metrics


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/documents", "/v1/no-such-route"])
def test_a_keyless_request_is_refused_before_its_body(door_app: Any, path: str) -> None:
    head = _head(door_app.state.url, _post_head(path, b"authorization: Bearer not-a-key\r\n"))
    assert head.startswith(b"HTTP/1.1 401 "), head
    assert door_app.state.admitted == []


def test_a_spent_tenant_is_refused_at_the_door(door_app: Any, standin: StandIn) -> None:
    url = door_app.state.url
    for _ in range(2):
        assert httpx.post(f"{url}/v1/chat/completions", json=CHAT, headers=ALICE).is_success
    assert door_app.state.admitted == ["alice", "alice"]
    head = _head(url, _post_head("/v1/chat/completions", b"authorization: Bearer alice-key\r\n"))
    assert head.startswith(b"HTTP/1.1 429 ") and b"\r\nretry-after: " in head.lower(), head
    r = httpx.post(f"{url}/v1/chat/completions", content=b"{not json", headers=ALICE)
    assert r.status_code == 429 and "requests a minute" in r.json()["error"]["message"]
    assert door_app.state.admitted == ["alice", "alice"]  # no route ran for either
    assert len(standin.requests) == 2
    bob = {"authorization": "Bearer bob-key"}
    assert httpx.post(f"{url}/v1/chat/completions", json=CHAT, headers=bob).is_success


def test_a_keyless_messages_request_is_answered_in_anthropic_s_shape(door_app: Any) -> None:
    url = door_app.state.url
    body = {
        "model": "gpt-4o-mini",
        "max_tokens": 8,
        "messages": [{"role": "user", "content": "hi"}],
    }
    r = httpx.post(f"{url}/v1/messages", json=body, headers={"x-api-key": "not-a-key"})
    assert r.status_code == 401
    data = r.json()
    assert data["type"] == "error" and data["error"]["type"] == "authentication_error"


@pytest.mark.parametrize(
    ("host", "key"),
    [
        ("203.0.113.7", "203.0.113.7"),
        ("2001:db8:1:2::1", "2001:db8:1:2::"),
        ("2001:db8:1:2:ffff:ffff:ffff:ffff", "2001:db8:1:2::"),
        ("2001:db8:1:3::1", "2001:db8:1:3::"),
        ("::ffff:198.51.100.4", "198.51.100.4"),
    ],
)
def test_client_address_counts_an_ipv6_64_as_one_client(host: str, key: str) -> None:
    assert client_address({"client": (host, 5000)}) == key


def test_client_windows_fail_closed_when_full_and_sweep_ended_ones() -> None:
    now = [0.0]
    windows = ClientWindows(lambda: now[0], capacity=2)
    assert windows.count("a", 2) is None and windows.count("b", 2) is None
    assert windows.count("a", 2) is None
    assert windows.count("a", 2) == WINDOW_S  # its third in the minute
    assert windows.count("b", 2) is None  # another client's window is its own
    assert windows.count("c", 2) == WINDOW_S  # no room: counted as over
    now[0] = WINDOW_S  # a's and b's windows ended: swept, room again
    assert windows.count("c", 2) is None
    assert windows.count("a", 2) is None  # a new window for a
