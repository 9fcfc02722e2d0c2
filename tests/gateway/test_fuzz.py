"""Every route of the OpenAPI description, fuzzed over HTTP with schemathesis: no 500, every
error in its API's shape (Anthropic's on the Messages routes, else OpenAI's), no stack
trace, no key (upstream or gateway) in any response."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from starlette.routing import Route

from gateway.app import create_app
from gateway.routes.openapi import openapi_document
from tests.gateway.conftest import ENVIRON, KEYS, UPSTREAM_KEY, standin_settings
from tests.gateway.servers import serve
from tests.openai_standin import StandIn

SECRETS = (UPSTREAM_KEY, *KEYS.values())
AUTH = {"authorization": "Bearer alice-key"}
schema = schemathesis.openapi.from_dict(openapi_document())


@pytest.fixture(scope="module")
def fuzz_app(standin_server: tuple[StandIn, str]) -> Any:
    limits = {"requests_per_minute": 100_000, "uploads_per_minute": 100_000}
    return create_app(standin_settings(standin_server[1], limits=limits), environ=ENVIRON)


@pytest.fixture(scope="module")
def fuzz_url(fuzz_app: Any) -> Iterator[str]:
    with serve(fuzz_app) as url:
        yield url


def check(response: Any, anthropic: bool = False) -> None:
    text = response.text
    headers = str(dict(response.headers))
    assert response.status_code != 500 and response.status_code < 600, text[:500]
    assert "Traceback" not in text and 'File "' not in text
    for secret in SECRETS:
        assert secret not in text and secret not in headers
    if response.status_code >= 400:
        assert response.headers.get("content-type") == ["application/json"], text[:500]
        body = response.json()
        error = body["error"]
        if anthropic:
            assert body.get("type") == "error" and set(error) == {"type", "message"}, text[:500]
        else:
            assert {"message", "type", "code"} <= set(error)
        assert isinstance(error["message"], str) and isinstance(error["type"], str)
        if response.status_code >= 500:
            assert response.status_code in (502, 503, 504)


@schema.parametrize()
@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_fuzz_every_route(case: Any, fuzz_url: str) -> None:
    headers = dict(AUTH) if case.operation.path not in ("/healthz", "/metrics") else {}
    response = case.call(base_url=fuzz_url, headers=headers, timeout=30)
    check(response, anthropic=case.operation.path.startswith("/v1/messages"))


def test_openapi_is_served_and_lists_every_route(fuzz_url: str, fuzz_app: Any) -> None:
    served = httpx.get(f"{fuzz_url}/openapi.json").json()
    assert served == openapi_document()
    described = {(path, method.upper()) for path, ops in served["paths"].items() for method in ops}
    routed = {
        (route.path.replace("{doc_id:path}", "{doc_id}"), method)
        for route in fuzz_app.routes
        if isinstance(route, Route)
        for method in (route.methods or ()) - {"HEAD"}
    }
    assert routed == described
