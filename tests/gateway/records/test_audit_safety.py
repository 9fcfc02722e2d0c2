"""Audits and probes are safe to expose: no outgoing call a request header names (SSRF),
admin keys only, every field bounded, one audit at a time, cancelled on disconnect.
All against real servers over HTTP."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from gateway.app import create_app
from gateway.config import build_settings
from tests.gateway.servers import serve
from tests.openai_standin import StandIn

ALICE = {"authorization": "Bearer alice-key"}
OPS = {"authorization": "Bearer ops-key"}
CHAT_ITEM = {
    "id": "c",
    "category": "chat",
    "messages": [{"role": "user", "content": "hi"}],
    "max_tokens": 8,
}


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    """A listening socket on a free loopback port that nothing should connect to."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    sock.setblocking(False)
    yield sock
    sock.close()


def _connections(sock: socket.socket) -> int:
    """How many connections wait in the listener's backlog."""
    n = 0
    while True:
        try:
            conn, _ = sock.accept()
        except BlockingIOError:
            return n
        conn.close()
        n += 1


def test_an_audit_never_calls_the_host_header(gateway_url: str, listener: socket.socket) -> None:
    port = listener.getsockname()[1]
    resp = httpx.post(
        f"{gateway_url}/v1/audits",
        json={"endpoint": "openai", "workload": [CHAT_ITEM], "include_records": True},
        headers={**OPS, "host": f"127.0.0.1:{port}"},
        timeout=120,
    )
    assert resp.status_code == 200, resp.text
    records = resp.json()["records"]
    assert records and all(r["error"] is None for r in records)  # it reached the gateway
    assert _connections(listener) == 0


def test_a_probe_never_calls_the_host_header(gateway_url: str, listener: socket.socket) -> None:
    port = listener.getsockname()[1]
    resp = httpx.post(
        f"{gateway_url}/v1/endpoints/probe",
        json={},
        headers={**OPS, "host": f"127.0.0.1:{port}"},
        timeout=120,
    )
    assert resp.status_code == 200, resp.text
    openai = next(r for r in resp.json()["data"] if r["name"] == "openai")
    assert any(e["source"] == "usage fields" for e in openai["evidence"])
    assert _connections(listener) == 0


@pytest.mark.parametrize(
    ("method", "path"), [("POST", "/v1/audits"), ("POST", "/v1/endpoints/probe")]
)
def test_audits_and_probes_need_an_admin_key(gateway_url: str, method: str, path: str) -> None:
    body = {"endpoint": "openai", "workload": [CHAT_ITEM]}
    denied = httpx.request(method, f"{gateway_url}{path}", json=body, headers=ALICE)
    assert denied.status_code == 403
    assert denied.json()["error"]["type"] == "permission_error"
    anonymous = httpx.request(method, f"{gateway_url}{path}", json=body)
    assert anonymous.status_code == 401


def test_probe_is_no_longer_a_get(gateway_url: str) -> None:
    resp = httpx.get(f"{gateway_url}/v1/endpoints", params={"probe": "1"}, headers=OPS)
    assert resp.status_code == 400
    assert resp.json()["error"]["param"] == "probe"


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"requests": 10**9}, "requests"),
        ({"concurrency": [10**7]}, "concurrency.0"),
        ({"concurrency": list(range(1, 20))}, "concurrency"),
        ({"max_tokens": 10**6}, "max_tokens"),
        ({"sweep": {"temperature": [0.1] * 100}}, "sweep.temperature"),
        ({"poisson_rate": 1e-9}, "poisson_rate"),
        ({"poisson_rate": 1e9}, "poisson_rate"),
        ({"poisson_rate": 0.01, "requests": 1000}, "poisson_rate"),
        ({"workload": [CHAT_ITEM] * 1000}, "workload"),
        ({"workload": [{**CHAT_ITEM, "max_tokens": 10**6}]}, "workload.0.max_tokens"),
        ({"requests": 1000, "concurrency": [1, 2, 4, 8, 16, 32, 64]}, "requests"),
        (
            {"workload": [{**CHAT_ITEM, "messages": [{"content": "no role"}]}]},
            "workload.0.messages.0.role",
        ),
        ({"workload": [{**CHAT_ITEM, "stop": ["a", "b", "c", "d", "e"]}]}, "workload.0.stop"),
    ],
)
def test_every_audit_field_is_bounded(gateway_url: str, fields: dict[str, Any], param: str) -> None:
    body = {"endpoint": "openai", "workload": [CHAT_ITEM], **fields}
    resp = httpx.post(f"{gateway_url}/v1/audits", json=body, headers=OPS)
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["param"] == param
    assert error["type"] == "invalid_request_error"


def _slow_gateway_settings(url: str) -> Any:
    endpoint = {"kind": "openai", "base_url": f"{url}/v1", "api_key_env": "STANDIN_KEY"}
    return build_settings(
        {
            "endpoints": [
                {**endpoint, "name": "slowpoke", "retries": 0, "models": ["slow-stream"]},
                {**endpoint, "name": "fast", "models": ["gpt-4o-mini"]},
            ],
            "keys": [{"key_env": "OPS_KEY", "tenant": "ops", "admin": True}],
        },
        "test",
    )


def _raw_post(port: int, path: str, body: bytes) -> socket.socket:
    """Send a POST over a plain socket (to close the connection at will)."""
    sock = socket.create_connection(("127.0.0.1", port))
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer ops-key\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    sock.sendall(head.encode() + body)
    return sock


def test_one_audit_at_a_time_and_a_client_that_leaves_cancels_it(
    standin_server: tuple[StandIn, str],
) -> None:
    standin, upstream = standin_server
    standin.reset()
    environ = {"STANDIN_KEY": "sk-standin", "OPS_KEY": "ops-key"}
    app = create_app(_slow_gateway_settings(upstream), environ=environ)
    with serve(app) as url:
        port = int(url.rsplit(":", 1)[1])
        slow = b'{"endpoint": "slowpoke", "workload": [{"id": "s", "messages": [{"role": "user", "content": "x"}]}]}'
        sock = _raw_post(port, "/v1/audits", slow)
        assert standin.slow_started.wait(timeout=30)  # the audit's first request streams

        fast = {"endpoint": "fast", "workload": [CHAT_ITEM]}
        busy = httpx.post(f"{url}/v1/audits", json=fast, headers=OPS, timeout=30)
        assert busy.status_code == 409
        assert busy.json()["error"]["type"] == "invalid_request_error"

        sock.close()  # the client goes away: the audit and its request upstream stop
        assert standin.cancelled.wait(timeout=10)
        deadline = time.monotonic() + 30
        while (
            resp := httpx.post(f"{url}/v1/audits", json=fast, headers=OPS, timeout=30)
        ).status_code == 409 and time.monotonic() < deadline:
            pass
        assert resp.status_code == 200, resp.text
        slow_calls = [r for r in standin.requests if r.body.get("model") == "slow-stream"]
        assert len(slow_calls) == 1  # the audit went no further than its first request


def test_without_keys_audits_stay_open_on_loopback(standin_server: tuple[StandIn, str]) -> None:
    settings = build_settings(
        {
            "endpoints": [
                {
                    "name": "fast",
                    "kind": "openai",
                    "base_url": f"{standin_server[1]}/v1",
                    "api_key_env": "STANDIN_KEY",
                    "models": ["gpt-4o-mini"],
                }
            ]
        },
        "test",
    )
    with serve(create_app(settings, environ={"STANDIN_KEY": "sk-standin"})) as url:
        body = {"endpoint": "fast", "workload": [CHAT_ITEM]}
        resp = httpx.post(f"{url}/v1/audits", json=body, timeout=60)
    assert resp.status_code == 200, resp.text
    assert resp.json()["summary"]["requests"] == 2


def test_one_probe_run_per_endpoint_at_a_time(standin_server: tuple[StandIn, str]) -> None:
    standin, upstream = standin_server
    standin.reset()
    settings = build_settings(
        {
            "endpoints": [
                {
                    "name": "sleepy",
                    "kind": "openai",
                    "base_url": f"{upstream}/v1",
                    "api_key_env": "STANDIN_KEY",
                    "models": ["slow-headers"],  # answers after 2 s
                }
            ],
            "keys": [{"key_env": "OPS_KEY", "tenant": "ops", "admin": True}],
        },
        "test",
    )
    environ = {"STANDIN_KEY": "sk-standin", "OPS_KEY": "ops-key"}
    with serve(create_app(settings, environ=environ)) as url:
        first: list[httpx.Response] = []
        probe = f"{url}/v1/endpoints/probe"
        thread = threading.Thread(
            target=lambda: first.append(httpx.post(probe, headers=OPS, json={}, timeout=60))
        )
        thread.start()
        deadline = time.monotonic() + 30
        while not standin.requests and time.monotonic() < deadline:
            time.sleep(0.005)  # until the first probe's request reached the upstream
        second = httpx.post(probe, headers=OPS, json={}, timeout=60)
        thread.join(timeout=60)
        third = httpx.post(probe, headers=OPS, json={}, timeout=60)
    assert second.status_code == 409, second.text
    assert "sleepy" in second.json()["error"]["message"]
    assert first[0].status_code == 200 and third.status_code == 200
    assert len(standin.requests) == 2  # the refused probe sent nothing upstream
