"""Hostile input over HTTP: each case is a 4xx or a bounded path, never a 500 or a
request forwarded with a meaning other than the one validated."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from gateway.app import create_app
from tests.gateway.conftest import ENVIRON, standin_settings
from tests.gateway.servers import serve
from tests.openai_standin import StandIn

JSON = {"content-type": "application/json"}
AUTH = {"authorization": "Bearer alice-key", **JSON}
CHAT = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}


def post(url: str, body: bytes, headers: dict[str, str] | None = None) -> httpx.Response:
    return httpx.post(
        f"{url}/v1/chat/completions", content=body, headers=headers or AUTH, timeout=30
    )


def error_of(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    error = response.json()["error"]
    assert set(error) >= {"message", "type", "code", "param"}
    return error  # type: ignore[no-any-return]


def test_deeply_nested_json_is_a_400(gateway_url: str, standin: StandIn) -> None:
    deep = b'{"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "x"}], "x": '
    for depth in (100, 100_000):
        r = post(gateway_url, deep + b"[" * depth + b"]" * depth + b"}")
        assert error_of(r, 400)["code"] == "invalid_json"
    assert standin.requests == []


def test_lone_surrogate_is_a_400_not_a_500(gateway_url: str, standin: StandIn) -> None:
    # "mini" is renamed upstream, so the body would be rewritten (and fail to encode)
    body = b'{"model": "mini", "messages": [{"role": "user", "content": "a\\ud800b"}]}'
    assert error_of(post(gateway_url, body), 400)["code"] == "invalid_json"
    paired = b'{"model": "mini", "messages": [{"role": "user", "content": "\\ud83d\\ude00"}]}'
    assert post(gateway_url, paired).status_code == 200
    assert standin.requests[-1].body["messages"][0]["content"] == "\U0001f600"


def test_duplicate_keys_are_refused(gateway_url: str, standin: StandIn) -> None:
    body = (
        b'{"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "x"}],'
        b' "model": "always-500"}'
    )
    error = error_of(post(gateway_url, body), 400)
    assert error["param"] == "model" and error["code"] == "invalid_json"
    nested = b'{"model": "gpt-4o-mini", "messages": [{"role": "user", "role": "system"}]}'
    assert error_of(post(gateway_url, nested), 400)["param"] == "role"
    assert standin.requests == []


def test_too_many_document_ids_are_a_400(gateway_url: str, standin: StandIn) -> None:
    many = {**CHAT, "draftgate": {"documents": [f"d{i}.py" for i in range(100_000)]}}
    error = error_of(post(gateway_url, json.dumps(many).encode()), 400)
    assert (error["code"], error["param"]) == ("too_many_documents", "draftgate.documents")
    header = {**AUTH, "x-draftgate-documents": ",".join(f"d{i}.py" for i in range(65))}
    assert error_of(post(gateway_url, json.dumps(CHAT).encode(), header), 400)["param"] == (
        "draftgate.documents"
    )
    assert standin.requests == []
    ok = {**AUTH, "x-draftgate-documents": ",".join(f"d{i}.py" for i in range(64))}
    assert post(gateway_url, json.dumps(CHAT).encode(), ok).status_code == 200


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded"])
def test_posts_must_be_json(gateway_url: str, standin: StandIn, content_type: str | None) -> None:
    headers = {"authorization": "Bearer alice-key"}
    if content_type is not None:
        headers["content-type"] = content_type
    for path in ("/v1/chat/completions", "/v1/documents"):
        r = httpx.post(f"{gateway_url}{path}", content=json.dumps(CHAT), headers=headers)
        assert error_of(r, 415)["code"] == "unsupported_media_type"
    assert standin.requests == []
    charset = {**AUTH, "content-type": "Application/JSON; charset=utf-8"}
    assert post(gateway_url, json.dumps(CHAT).encode(), charset).status_code == 200


@pytest.fixture(scope="module")
def keyless_url(standin_server: tuple[StandIn, str]) -> Iterator[str]:
    """A gateway with no keys (single-tenant loopback mode) in front of the stand-in."""
    settings = standin_settings(standin_server[1]).model_copy(update={"keys": ()})
    with serve(create_app(settings, environ=ENVIRON)) as url:
        yield url


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost:8000", "[::1]:9", "127.0.0.2:1"])
def test_keyless_gateway_serves_loopback_hosts(keyless_url: str, host: str) -> None:
    r = post(keyless_url, json.dumps(CHAT).encode(), {**JSON, "host": host})
    assert r.status_code == 200


@pytest.mark.parametrize(
    "host", ["evil.example", "evil.example:8000", "localhost.evil.example", "[::2]:1", "10.0.0.1"]
)
def test_keyless_gateway_refuses_other_hosts(keyless_url: str, standin: StandIn, host: str) -> None:
    """DNS rebinding: the page's own name arrives as Host and is refused."""
    r = post(keyless_url, json.dumps(CHAT).encode(), {**JSON, "host": host})
    assert error_of(r, 403)["code"] == "host_not_allowed"
    r = httpx.get(f"{keyless_url}/v1/documents", headers={"host": host})
    assert error_of(r, 403)["code"] == "host_not_allowed"
    assert standin.requests == []


def test_keyed_gateway_serves_any_host(gateway_url: str) -> None:
    r = post(gateway_url, json.dumps(CHAT).encode(), {**AUTH, "host": "gateway.internal"})
    assert r.status_code == 200


@pytest.fixture(scope="module")
def small_answers_url(standin_server: tuple[StandIn, str]) -> Iterator[str]:
    """The stand-in gateway holding at most 4 KiB of a non-streamed upstream answer."""
    settings = standin_settings(standin_server[1], max_response_bytes=4096)
    with serve(create_app(settings, environ=ENVIRON)) as url:
        yield url


def test_upstream_answer_is_bounded(small_answers_url: str, standin: StandIn) -> None:
    """The stand-in answers with the prompt's fenced block."""

    def fenced(size: int) -> bytes:
        block = "```\n" + "x" * size + "\n```"
        return json.dumps({**CHAT, "messages": [{"role": "user", "content": block}]}).encode()

    error = error_of(post(small_answers_url, fenced(8000)), 502)
    assert error["code"] == "response_too_large"
    assert post(small_answers_url, fenced(100)).status_code == 200


def test_document_path_and_language_are_bounded(gateway_url: str) -> None:
    for field, value in (("path", "p" * 1025), ("language", "l" * 65)):
        body = {"id": "a.py", "text": "x", field: value}
        r = httpx.post(f"{gateway_url}/v1/documents", json=body, headers=AUTH)
        assert error_of(r, 400)["param"] == field
