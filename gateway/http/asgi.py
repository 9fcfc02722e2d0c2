"""Small pure-ASGI helpers for the hot path (no Request/Response objects, no
``BaseHTTPMiddleware``): header lookup, bounded body reading, JSON answers, the
overhead header, and cancelling work when the client goes away."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Awaitable, Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.errors import GatewayError, InvalidRequest, PayloadTooLarge, RequestTimeout

Headers = list[tuple[bytes, bytes]]

OVERHEAD_HEADER = b"x-draftgate-overhead-ms"
PREDICTION_HEADER = b"x-draftgate-prediction"
ENDPOINT_HEADER = b"x-draftgate-endpoint"
JSON = b"application/json"
WATCH_AFTER_S = 0.05  # requests running longer get a task that watches for a disconnect
INSPECT_BYTES = 64 * 1024  # a body's start that ``read_body`` shows ``inspect`` as it arrives


class ClientDisconnected(Exception):
    """The client closed the connection before the request body arrived."""


class UpstreamWait:
    """Seconds this request spent waiting on its upstream/engine (not gateway overhead)."""

    __slots__ = ("seconds", "t_start")

    def __init__(self, t_start: float) -> None:
        self.t_start = t_start
        self.seconds = 0.0

    def overhead_ms(self) -> float:
        return (time.perf_counter() - self.t_start - self.seconds) * 1000.0


def header(scope: Scope, name: bytes) -> bytes | None:
    """The first value of header ``name`` (lower-case) or ``None``."""
    headers: Headers = scope["headers"]
    for key, value in headers:
        if key == name:
            return value
    return None


def declared_length(content_length: bytes | None, limit: int) -> int | None:
    """The body length a ``Content-Length`` value declares (None: not declared);
    :class:`InvalidRequest` if it is not a number, :class:`PayloadTooLarge` past ``limit``."""
    if content_length is None:
        return None
    if not content_length.strip().isdigit():  # int() would take "-1" and "1_000" too
        raise InvalidRequest("invalid Content-Length header")
    declared = int(content_length)
    if declared > limit:
        raise PayloadTooLarge(f"request body is {declared} bytes; the limit is {limit}")
    return declared


async def read_body(
    receive: Receive,
    limit: int,
    content_length: bytes | None,
    timeout_s: float | None = None,
    inspect: Callable[[bytes], None] | None = None,
) -> bytes:
    """The whole request body; :class:`PayloadTooLarge` past ``limit`` bytes,
    :class:`RequestTimeout` when it has not all arrived within ``timeout_s``.

    ``inspect`` is shown the body's first ``INSPECT_BYTES`` (or more) once they arrived,
    if it is that long: what it raises stops the read, so a body it can refuse from its
    start is answered without the rest being read (the server discards that)."""
    declared_length(content_length, limit)
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(timeout_s):
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    raise ClientDisconnected
                chunk = message.get("body", b"")
                if chunk:
                    size += len(chunk)
                    if size > limit:
                        raise PayloadTooLarge(f"request body is over the limit of {limit} bytes")
                    chunks.append(chunk)
                    if inspect is not None and size >= INSPECT_BYTES:
                        inspect(b"".join(chunks))
                        inspect = None
                if not message.get("more_body", False):
                    break
    except TimeoutError:
        raise RequestTimeout(f"the request body did not arrive within {timeout_s:g} s") from None
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def send_body(send: Send, status: int, body: bytes, headers: Headers) -> None:
    """A complete response in two ASGI messages."""
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-length", str(len(body)).encode()), *headers],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def send_error(send: Send, error: GatewayError, headers: Headers | None = None) -> None:
    """An OpenAI-style error response."""
    extra = [(k.lower().encode(), v.encode()) for k, v in error.headers.items()]
    await send_body(
        send, error.status, error.body(), [(b"content-type", JSON), *extra, *(headers or [])]
    )


async def run_until_disconnect(receive: Receive, work: Callable[[], Awaitable[None]]) -> bool:
    """Run ``work`` and cancel it as soon as the client disconnects.

    Returns ``True`` when the client went away first. The cancellation reaches whatever
    ``work`` awaits (an upstream request, a local generation), so it stops at once. The
    task that watches for the disconnect starts only once ``work`` ran ``WATCH_AFTER_S``:
    most requests finish sooner and never pay for it (a stream whose client left fails
    on its next send before that).
    """
    task = asyncio.current_task()
    assert task is not None
    loop = asyncio.get_running_loop()
    disconnected = False
    watcher: asyncio.Task[None] | None = None

    async def watch() -> None:
        nonlocal disconnected
        while (await receive())["type"] != "http.disconnect":
            pass
        disconnected = True
        task.cancel()

    def start_watching() -> None:
        nonlocal watcher
        watcher = loop.create_task(watch())

    timer = loop.call_later(WATCH_AFTER_S, start_watching)
    try:
        await work()
    except OSError:  # servers that raise on send after the client left (ClientDisconnected)
        return True
    except asyncio.CancelledError:
        if not disconnected:
            raise
        if sys.version_info >= (3, 11):
            task.uncancel()
    finally:
        timer.cancel()
        if watcher is not None:
            watcher.cancel()
    return disconnected


def overhead_middleware(app: ASGIApp, *, catch: bool = False) -> ASGIApp:
    """Adds ``X-Draftgate-Overhead-Ms`` to every HTTP response (time since the request
    arrived minus the time recorded as waiting upstream in ``scope["draftgate.wait"]``),
    and ``X-Draftgate-Prediction: none`` where the route did not set it.

    With ``catch`` (an app served outside Starlette's middleware stack) it also does what
    that stack would: an exception raised before the response started becomes an
    OpenAI-style error response (an unexpected one a 500, then re-raised for the log).
    """

    async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        wait = UpstreamWait(time.perf_counter())
        scope["draftgate.wait"] = wait
        started = False

        async def send_with_overhead(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                headers = list(message.get("headers", ()))
                if not any(k == PREDICTION_HEADER for k, _ in headers):
                    headers.append((PREDICTION_HEADER, b"none"))
                headers.append((OVERHEAD_HEADER, f"{wait.overhead_ms():.3f}".encode()))
                message["headers"] = headers
            await send(message)

        if not catch:
            await app(scope, receive, send_with_overhead)
            return
        try:
            await app(scope, receive, send_with_overhead)
        except GatewayError as error:
            if started:
                raise
            await send_error(send_with_overhead, error)
        except Exception:
            if not started:
                await send_error(send_with_overhead, GatewayError("internal gateway error"))
            raise

    return middleware
