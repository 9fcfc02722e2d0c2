"""Error mapping, retries and timeouts, with behaviour injected through httpx transports."""

from __future__ import annotations

import asyncio
import email.utils
import json
import math
import socket
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest
import tenacity

from sdk import AsyncClient, Client
from sdk._core import MAX_RETRY_AFTER_S, retry_wait
from sdk.errors import (
    APIConnectionError,
    APIResponseValidationError,
    APIStatusError,
    APITimeoutError,
    AuthenticationError,
    BadRequestError,
    DraftgateError,
    InternalServerError,
    NotFoundError,
    PayloadTooLargeError,
    PermissionDeniedError,
    RateLimitError,
    UnprocessableEntityError,
)
from sdk.retry_after import retry_after_s
from sdk.wire import ErrorResponse

BASE = "http://gateway.test/v1"
MESSAGES = [{"role": "user", "content": "hi"}]
COMPLETION = {
    "id": "c1",
    "object": "chat.completion",
    "created": 1,
    "model": "m",
    "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "hello"}, "finish_reason": "stop"}
    ],
}


def openai_error(
    status: int, message: str, type_: str, headers: dict[str, str] | None = None
) -> httpx.Response:
    body = {"error": {"message": message, "type": type_, "code": f"c{status}", "param": None}}
    return httpx.Response(status, json=body, headers=headers)


class Script:
    """A transport handler that answers each call with the next scripted outcome."""

    def __init__(self, *outcomes: httpx.Response | Exception) -> None:
        self.outcomes = list(outcomes)
        self.calls: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.calls.append(request)
        outcome = self.outcomes.pop(0) if len(self.outcomes) > 1 else self.outcomes[0]
        if isinstance(outcome, Exception):
            raise outcome
        return outcome


def sync_chat(handler: Script, **kwargs: Any) -> Any:
    with Client(BASE, "sk-test", transport=httpx.MockTransport(handler), **kwargs) as client:
        return client.chat(model="m", messages=MESSAGES)


async def async_chat(handler: Script, **kwargs: Any) -> Any:
    async with AsyncClient(
        BASE, "sk-test", transport=httpx.MockTransport(handler), **kwargs
    ) as client:
        return await client.chat(model="m", messages=MESSAGES)


@pytest.fixture(params=["sync", "async"])
def chat(request: pytest.FixtureRequest) -> Callable[..., Any]:
    """Run one chat call through Client or AsyncClient (same behaviour expected)."""
    if request.param == "sync":
        return sync_chat

    def run(handler: Script, **kwargs: Any) -> Any:
        return asyncio.run(async_chat(handler, **kwargs))

    return run


@pytest.mark.parametrize(
    ("status", "cls"),
    [
        (400, BadRequestError),
        (401, AuthenticationError),
        (403, PermissionDeniedError),
        (404, NotFoundError),
        (413, PayloadTooLargeError),
        (422, UnprocessableEntityError),
        (418, APIStatusError),
    ],
)
def test_4xx_raises_its_class_with_body_status_and_headers_without_retry(
    chat: Callable[..., Any], status: int, cls: type[APIStatusError]
) -> None:
    handler = Script(
        openai_error(status, "bad thing", "invalid_request_error", {"x-request-id": "r1"})
    )
    with pytest.raises(cls) as caught:
        chat(handler, max_retries=3)
    err = caught.value
    assert type(err) is cls
    assert isinstance(err, DraftgateError)
    assert err.status_code == status
    assert err.error.message == "bad thing"
    assert err.error.code == f"c{status}"
    assert err.headers["x-request-id"] == "r1"
    assert len(handler.calls) == 1


@pytest.mark.parametrize("status", [500, 502, 503, 504])
def test_5xx_is_retried_then_raised(chat: Callable[..., Any], status: int) -> None:
    handler = Script(openai_error(status, "upstream down", "server_error", {"retry-after": "0"}))
    with pytest.raises(InternalServerError) as caught:
        chat(handler, max_retries=2)
    assert caught.value.status_code == status
    assert len(handler.calls) == 3


def test_429_honours_retry_after_then_succeeds(chat: Callable[..., Any]) -> None:
    handler = Script(
        openai_error(429, "slow down", "rate_limit_error", {"retry-after": "0"}),
        httpx.Response(200, json=COMPLETION),
    )
    result = chat(handler, max_retries=2)
    assert result.choices[0].message.content == "hello"
    assert len(handler.calls) == 2


def test_429_exhausted_raises_rate_limit_error(chat: Callable[..., Any]) -> None:
    handler = Script(openai_error(429, "slow down", "rate_limit_error", {"retry-after": "0"}))
    with pytest.raises(RateLimitError) as caught:
        chat(handler, max_retries=1)
    assert caught.value.headers["retry-after"] == "0"
    assert len(handler.calls) == 2


def test_connect_error_is_retried_then_succeeds(chat: Callable[..., Any]) -> None:
    handler = Script(httpx.ConnectError("refused"), httpx.Response(200, json=COMPLETION))
    assert chat(handler, max_retries=1).choices[0].message.content == "hello"
    assert len(handler.calls) == 2


def test_connect_error_exhausted_raises_connection_error(chat: Callable[..., Any]) -> None:
    handler = Script(httpx.ConnectError("refused"))
    with pytest.raises(APIConnectionError) as caught:
        chat(handler, max_retries=0)
    assert not isinstance(caught.value, APITimeoutError)
    assert len(handler.calls) == 1


def test_read_timeout_is_not_retried(chat: Callable[..., Any]) -> None:
    handler = Script(httpx.ReadTimeout("slow"))
    with pytest.raises(APITimeoutError):
        chat(handler, max_retries=3)
    assert len(handler.calls) == 1


def test_connect_timeout_is_retried(chat: Callable[..., Any]) -> None:
    handler = Script(httpx.ConnectTimeout("slow"), httpx.Response(200, json=COMPLETION))
    assert chat(handler, max_retries=1).choices[0].message.content == "hello"
    assert len(handler.calls) == 2


def test_stream_open_is_retried_before_any_body_was_read() -> None:
    chunk = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
             "choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": "stop"}]}  # fmt: skip
    sse = f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n"
    handler = Script(
        openai_error(503, "warming up", "server_error", {"retry-after": "0"}),
        httpx.Response(200, text=sse, headers={"content-type": "text/event-stream"}),
    )
    with (
        Client(BASE, transport=httpx.MockTransport(handler)) as client,
        client.chat(model="m", messages=MESSAGES, stream=True) as stream,
    ):
        chunks = list(stream)
    assert [c.choices[0].delta.content for c in chunks] == ["hi"]
    assert len(handler.calls) == 2


def test_non_json_error_body_still_gives_a_typed_error(chat: Callable[..., Any]) -> None:
    handler = Script(httpx.Response(502, text="<html>Bad Gateway</html>"))
    with pytest.raises(InternalServerError) as caught:
        chat(handler, max_retries=0)
    assert caught.value.error.message == "<html>Bad Gateway</html>"
    assert caught.value.error.type == "http_error"


def test_malformed_success_body_raises_validation_error(chat: Callable[..., Any]) -> None:
    handler = Script(httpx.Response(200, json={"id": "x"}))
    with pytest.raises(APIResponseValidationError, match="ChatCompletion"):
        chat(handler)


def test_requests_carry_the_key_and_join_the_base_path() -> None:
    handler = Script(httpx.Response(200, json=COMPLETION))
    sync_chat(handler, headers={"X-Trace": "t1"})
    request = handler.calls[0]
    assert request.url == "http://gateway.test/v1/chat/completions"
    assert request.headers["authorization"] == "Bearer sk-test"
    assert request.headers["x-trace"] == "t1"


def test_timeout_reaches_a_real_slow_server() -> None:
    """A real socket that accepts but never answers: the read timeout fires."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port = listener.getsockname()[1]
        client = Client(f"http://127.0.0.1:{port}/v1", timeout=0.2, max_retries=0)
        with pytest.raises(APITimeoutError):
            client.chat(model="m", messages=MESSAGES)
        client.close()


def test_refused_port_raises_connection_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: connections are refused
        client = Client(f"http://127.0.0.1:{port}/v1", max_retries=0)
        with pytest.raises(APIConnectionError):
            client.models()
        client.close()


# ---------------------------------------------------------------- Retry-After


def _headers(**values: str) -> httpx.Headers:
    return httpx.Headers({k.replace("_", "-"): v for k, v in values.items()})


def test_retry_after_seconds_date_ms_and_cap() -> None:
    cap = MAX_RETRY_AFTER_S
    assert retry_after_s(_headers(retry_after="7"), cap) == 7.0
    assert retry_after_s(_headers(retry_after="1.5"), cap) == 1.5
    assert retry_after_s(_headers(retry_after_ms="250"), cap) == 0.25
    assert retry_after_s(_headers(retry_after="100000"), cap) == cap
    assert retry_after_s(_headers(retry_after="-3"), cap) == 0.0
    assert retry_after_s(_headers(retry_after="soon"), cap) is None
    assert retry_after_s(_headers(), cap) is None
    in_ten = email.utils.formatdate(time.time() + 10, usegmt=True)
    waited = retry_after_s(_headers(retry_after=in_ten), cap)
    assert waited is not None and 8.0 <= waited <= 10.0


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"retry_after": "inf"}, 30.0),
        ({"retry_after": "Infinity"}, 30.0),
        ({"retry_after": "-inf"}, 0.0),
        ({"retry_after": "1e308"}, 30.0),
        ({"retry_after": "1" + "0" * 400}, 30.0),  # float() gives inf
        ({"retry_after": "nan"}, None),
        ({"retry_after_ms": "nan", "retry_after": "2"}, 2.0),  # a bad ms falls back
        ({"retry_after_ms": "inf"}, 30.0),
        ({"retry_after_ms": "-5"}, 0.0),
        ({"retry_after": "Fri, 31 Dec 9999 23:59:59 GMT"}, 30.0),
        ({"retry_after": "Mon, 01 Jan 1990 00:00:00 GMT"}, 0.0),
        ({"retry_after": "Mon, 99 Foo 0 99:99:99 GMT"}, None),
    ],
)
def test_retry_after_is_always_finite_and_capped(
    headers: dict[str, str], expected: float | None
) -> None:
    got = retry_after_s(_headers(**headers), 30.0)
    assert got == expected
    assert got is None or math.isfinite(got)


def _state_after(exc: BaseException, attempt: int = 1) -> tenacity.RetryCallState:
    state = tenacity.RetryCallState(tenacity.Retrying(), fn=None, args=(), kwargs={})
    state.attempt_number = attempt
    state.set_exception((type(exc), exc, None))
    return state


def test_retry_wait_uses_retry_after_else_backoff() -> None:
    limited = RateLimitError(429, _body(), _headers(retry_after="4"))
    assert retry_wait(_state_after(limited)) == 4.0
    capped = RateLimitError(429, _body(), _headers(retry_after="3600"))
    assert retry_wait(_state_after(capped)) == MAX_RETRY_AFTER_S
    refused = APIConnectionError("refused")
    first, third = retry_wait(_state_after(refused, 1)), retry_wait(_state_after(refused, 3))
    assert 0.5 <= first <= 1.5
    assert 2.0 <= third <= 3.0


def _body() -> ErrorResponse:
    return ErrorResponse.model_validate({"error": {"message": "m", "type": "t"}})
