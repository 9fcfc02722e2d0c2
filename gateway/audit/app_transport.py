"""An httpx transport that sends requests to the gateway app in this process.

Audits and probes call the gateway that received them through this transport, never
through a URL: no request header decides where the gateway connects. Unlike httpx's
``ASGITransport``, which returns a response only once the app has finished, this one
hands the response out at ``http.response.start`` and streams the body as the app sends
it, so an audit still measures time to first token. Closing the response early tells
the app the client went away, as a server does (``http.disconnect``, and a send fails),
and cancels it if it has not stopped after a grace period.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx
from starlette.types import ASGIApp, Message

DISCONNECT_GRACE_S = 5.0
IN_PROCESS_URL = "http://127.0.0.1"
"""The root URL clients of this transport use (a loopback Host: the app's own checks pass)."""


class _Body(httpx.AsyncByteStream):
    """The response body as the app sends it; closing it disconnects the app."""

    def __init__(
        self, chunks: asyncio.Queue[bytes | None], task: asyncio.Task[None], gone: asyncio.Event
    ) -> None:
        self._chunks = chunks
        self._task = task
        self._gone = gone
        self._complete = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while (chunk := await self._chunks.get()) is not None:
            yield chunk
        self._complete = True

    async def aclose(self) -> None:
        """Tell the app the client left; give it ``DISCONNECT_GRACE_S`` to stop, then cancel it."""
        self._gone.set()
        if not self._complete:
            await asyncio.wait({self._task}, timeout=DISCONNECT_GRACE_S)
            self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._task


class AppTransport(httpx.AsyncBaseTransport):
    """Runs each request through ``app`` (an ASGI app already started) as its own task."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        scope: dict[str, Any] = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": request.method,
            "headers": [(k.lower(), v) for k, v in request.headers.raw],
            "scheme": request.url.scheme,
            "path": request.url.path,
            "raw_path": request.url.raw_path.split(b"?")[0],
            "query_string": request.url.query,
            "root_path": "",
            "server": ("127.0.0.1", request.url.port or 80),
            "client": ("127.0.0.1", 0),
            "state": {},
        }
        body = await request.aread()
        chunks: asyncio.Queue[bytes | None] = asyncio.Queue()
        started: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        gone = asyncio.Event()
        body_sent = False

        async def receive() -> Message:
            nonlocal body_sent
            if not body_sent:
                body_sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            await gone.wait()
            return {"type": "http.disconnect"}

        async def send(message: Message) -> None:
            if gone.is_set():
                raise OSError("the client disconnected")
            if message["type"] == "http.response.start":
                started.set_result(message)
            elif message["type"] == "http.response.body":
                if message.get("body"):
                    chunks.put_nowait(message["body"])
                if not message.get("more_body", False):
                    chunks.put_nowait(None)

        async def run() -> None:
            try:
                await self.app(scope, receive, send)
            except Exception as exc:
                if not started.done():
                    started.set_exception(httpx.RemoteProtocolError(type(exc).__name__))
                raise
            finally:
                if not started.done():
                    started.set_exception(httpx.RemoteProtocolError("no response"))
                chunks.put_nowait(None)

        task = asyncio.get_running_loop().create_task(run())
        try:
            start = await started
        except BaseException:
            gone.set()
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
            raise
        return httpx.Response(
            start["status"],
            headers=list(start.get("headers", [])),
            stream=_Body(chunks, task, gone),
            request=request,
        )
