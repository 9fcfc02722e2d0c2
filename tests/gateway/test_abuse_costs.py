"""An abusive request is refused before the work it would cost the event loop, over HTTP:
what the headers or the body's start show is answered without reading or parsing more,
and without spending the tenant's limits."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from gateway.app import create_app
from gateway.routes import completions, documents
from tests.gateway.conftest import ENVIRON, standin_settings
from tests.gateway.servers import serve
from tests.openai_standin import StandIn

AUTH = {"authorization": "Bearer alice-key", "content-type": "application/json"}
CHAT = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
def parsed(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The lengths of the bodies the completion and document routes parsed as JSON."""
    seen: list[int] = []
    for module in (completions, documents):
        real = module.parse_json_async

        async def spy(raw: bytes, real: Any = real) -> Any:
            seen.append(len(raw))
            return await real(raw)

        monkeypatch.setattr(module, "parse_json_async", spy)
    return seen


@pytest.fixture
def few_requests_url(standin_server: tuple[StandIn, str]) -> Iterator[str]:
    """A gateway on the stand-in where a tenant may start 3 requests a minute (counted
    in this process, afresh for each test)."""
    settings = standin_settings(standin_server[1], limits={"requests_per_minute": 3})
    with serve(create_app(settings, environ=ENVIRON)) as url:
        yield url


def _answer(url: str, head: bytes, body_start: bytes) -> tuple[int, dict[str, Any]]:
    """Send ``head`` and only ``body_start`` of the body it declares; the status and error
    the gateway answers with the rest still unsent."""
    parts = urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port), timeout=20) as sock:
        sock.sendall(head + body_start)
        answer = b""
        while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
            chunk = sock.recv(65536)
            assert chunk, "the gateway closed the connection without an answer"
            answer += chunk
    status_line, _, rest = answer.partition(b"\r\n")
    return int(status_line.split()[1]), json.loads(rest.partition(b"\r\n\r\n")[2])["error"]


def test_a_long_document_path_is_refused_from_the_body_s_start(gateway_url: str) -> None:
    body = json.dumps({"id": "p", "text": "", "path": "p/" * 500_000}).encode()
    head = (
        b"POST /v1/documents HTTP/1.1\r\nhost: 127.0.0.1\r\n"
        b"authorization: Bearer alice-key\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n" % len(body)
    )
    status, error = _answer(gateway_url, head, body[:100_000])  # 10% of it
    assert (status, error["param"], error["code"]) == (400, "path", "invalid_field")


def test_a_long_document_path_is_not_parsed(gateway_url: str, parsed: list[int]) -> None:
    body = {"id": "p", "text": "x" * 200_000, "path": "p/" * 50_000}  # path after the start
    r = httpx.post(f"{gateway_url}/v1/documents", json=body, headers=AUTH)
    assert (r.status_code, r.json()["error"]["param"]) == (400, "path")
    assert parsed == []
    ok = {"id": "p.py", "text": "x = 1\n", "path": "src/p.py"}
    assert httpx.post(f"{gateway_url}/v1/documents", json=ok, headers=AUTH).status_code == 201
    assert len(parsed) == 1


def test_100k_document_ids_are_refused_without_a_parse(
    gateway_url: str, standin: StandIn, parsed: list[int]
) -> None:
    many = {**CHAT, "draftgate": {"documents": [f"d{i}.py" for i in range(100_000)]}}
    r = httpx.post(f"{gateway_url}/v1/chat/completions", json=many, headers=AUTH, timeout=30)
    error = r.json()["error"]
    assert (r.status_code, error["code"]) == (400, "too_many_documents")
    assert error["message"].startswith("at least 100000 documents named")
    assert parsed == [] and standin.requests == []


def test_too_many_header_ids_spend_no_request_of_the_limit(few_requests_url: str) -> None:
    """Refused from the header alone: the requests a minute are not counted, and the
    body is not waited for."""
    ids = ",".join(f"d{i}.py" for i in range(65)).encode()
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\n"
        b"authorization: Bearer bob-key\r\ncontent-type: application/json\r\n"
        b"x-draftgate-documents: " + ids + b"\r\ncontent-length: 1000\r\n\r\n"
    )
    for _ in range(5):
        status, error = _answer(few_requests_url, head, b"")
        assert (status, error["code"]) == (400, "too_many_documents")
    bob = {**AUTH, "authorization": "Bearer bob-key"}
    for _ in range(3):
        r = httpx.post(f"{few_requests_url}/v1/chat/completions", json=CHAT, headers=bob)
        assert r.status_code == 200
