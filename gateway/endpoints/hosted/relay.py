"""An upstream's answer relayed to the client as it arrives: a JSON body read whole
(bounded), or an SSE stream forwarded event by event; what telemetry and capture need is
noted on the way through. With ``private_cache`` the engine's cached-token counts are
removed from what the client receives (:mod:`gateway.endpoints.hosted.cache_report`)."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

import httpx
from starlette.types import Send

from gateway.call import Call, apply_usage
from gateway.endpoints.hosted.cache_report import scrub_body, scrub_events
from gateway.errors import GatewayError, UpstreamError
from gateway.http.asgi import PREDICTION_HEADER, Headers, send_body, send_error
from gateway.http.sse import SSE_HEADERS, EventTooLarge, StreamRelay, error_event


class ResponseTooLarge(Exception):
    """An upstream answer is longer than the gateway will hold."""


async def fail(
    call: Call, send: Send, error: GatewayError, extra: Sequence[tuple[bytes, bytes]] = ()
) -> None:
    """Answer ``error`` (with the request's prediction status and ``extra`` headers) and
    note it."""
    call.timing.status = error.status
    call.timing.error = error.message
    status = call.timing.prediction_status.encode()
    await send_error(send, error, [(PREDICTION_HEADER, status), *extra])


async def relay_body(
    call: Call,
    response: httpx.Response,
    send: Send,
    headers: Headers,
    *,
    limit: int,
    capture: bool,
    private_cache: bool,
) -> None:
    """The whole answer read (up to ``limit`` bytes), then sent with ``headers``."""
    t0 = time.perf_counter()
    try:
        body = await read_capped(response, limit)
    except ResponseTooLarge:
        error = UpstreamError(f"upstream answer is over {limit} bytes", code="response_too_large")
        await fail(call, send, error)
        return
    except httpx.TimeoutException:
        error = UpstreamError("upstream timed out sending the body", code="gateway_timeout")
        await fail(call, send, error)
        return
    except httpx.HTTPError as exc:
        await fail(call, send, UpstreamError(f"upstream body interrupted: {type(exc).__name__}"))
        return
    finally:
        await response.aclose()
        call.wait.seconds += time.perf_counter() - t0
    content_type = response.headers.get("content-type", "application/json").encode()
    call.timing.status = response.status_code
    sent = scrub_body(body) if private_cache else body
    await send_body(send, response.status_code, sent, [(b"content-type", content_type), *headers])
    now = time.perf_counter()
    call.timing.t_first_content = call.timing.t_end = now
    try:
        payload = json.loads(body)
    except ValueError:
        return
    if isinstance(payload, dict):
        apply_usage(call.timing, payload.get("usage"))
        if capture:
            call.response_text = texts(payload)


async def relay_stream(
    call: Call,
    response: httpx.Response,
    send: Send,
    headers: Headers,
    *,
    capture: bool,
    private_cache: bool,
) -> None:
    """The stream forwarded in whole events; an interruption ends it with an error event."""
    await send({"type": "http.response.start", "status": 200, "headers": [*SSE_HEADERS, *headers]})
    relay = StreamRelay(call.timing, keep_text=capture)
    problem: str | None = None
    # the transport's byte stream itself: ``aiter_raw`` re-chunks and wraps every chunk
    stream = response.stream
    assert isinstance(stream, httpx.AsyncByteStream)
    try:
        async for chunk in stream:
            ready = relay.feed(chunk)
            if ready:
                sent = scrub_events(ready) if private_cache else ready
                await send({"type": "http.response.body", "body": sent, "more_body": True})
                relay.observe(ready)
        # a native stream (Messages, Responses) has no [DONE]: its end is the close
        if not relay.done and not call.native:
            problem = "upstream stream ended before [DONE]"
    except EventTooLarge as exc:
        problem = str(exc)
    except httpx.TimeoutException:
        problem = "upstream timed out mid-stream"
    except httpx.HTTPError as exc:
        problem = f"upstream stream interrupted: {type(exc).__name__}"
    finally:
        await response.aclose()
    call.timing.t_end = time.perf_counter()
    apply_usage(call.timing, relay.usage)
    if problem is not None:
        call.timing.status = 502
        call.timing.error = problem
        await send({"type": "http.response.body", "body": error_event(problem), "more_body": True})
    elif relay.text is not None:
        call.response_text = ["".join(relay.text)]
    await send({"type": "http.response.body", "body": b"", "more_body": False})


async def read_capped(response: httpx.Response, limit: int) -> bytes:
    """The whole body of ``response``; :class:`ResponseTooLarge` past ``limit`` bytes."""
    declared = response.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise ResponseTooLarge
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.aiter_bytes():
        size += len(chunk)
        if size > limit:
            raise ResponseTooLarge
        chunks.append(chunk)
    return b"".join(chunks)


def texts(payload: dict[str, Any]) -> list[str]:
    """The answer texts of an OpenAI chat or completion body (for capture)."""
    found = []
    for choice in payload.get("choices") or ():
        if not isinstance(choice, dict):
            continue
        message = choice.get("message")
        text = message.get("content") if isinstance(message, dict) else choice.get("text")
        if isinstance(text, str) and text:
            found.append(text)
    return found
