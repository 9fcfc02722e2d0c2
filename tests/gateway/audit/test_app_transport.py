"""The in-process transport streams a response as the app sends it, and closing the
response early disconnects the app."""

from __future__ import annotations

import asyncio

import httpx
from starlette.types import Message, Receive, Scope, Send

from gateway.audit.app_transport import IN_PROCESS_URL, AppTransport


class _TwoParts:
    """Sends ``first``, waits until told, sends ``second``; records a disconnect."""

    def __init__(self) -> None:
        self.go_on = asyncio.Event()
        self.disconnected = asyncio.Event()
        self.seen: dict[str, object] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request: Message = await receive()
        self.seen = {"path": scope["path"], "query": scope["query_string"], "body": request["body"]}
        await send({"type": "http.response.start", "status": 201, "headers": [(b"x-a", b"1")]})
        await send({"type": "http.response.body", "body": b"first", "more_body": True})
        waiter = asyncio.ensure_future(receive())
        go_on = asyncio.ensure_future(self.go_on.wait())
        done, _ = await asyncio.wait({waiter, go_on}, return_when=asyncio.FIRST_COMPLETED)
        if waiter in done and waiter.result()["type"] == "http.disconnect":
            self.disconnected.set()
            go_on.cancel()
            return
        waiter.cancel()
        await send({"type": "http.response.body", "body": b"second", "more_body": False})


async def test_the_body_streams_before_the_app_finishes() -> None:
    app = _TwoParts()
    async with (
        httpx.AsyncClient(base_url=IN_PROCESS_URL, transport=AppTransport(app)) as client,
        client.stream("POST", "/v1/x?y=1", content=b"hello") as response,
    ):
        assert (response.status_code, response.headers["x-a"]) == (201, "1")
        parts = response.aiter_bytes()
        # the app waits for go_on: a buffering transport would never hand out "first"
        assert await asyncio.wait_for(parts.__anext__(), timeout=10) == b"first"
        app.go_on.set()
        assert [p async for p in parts] == [b"second"]
    assert app.seen == {"path": "/v1/x", "query": b"y=1", "body": b"hello"}
    assert not app.disconnected.is_set()


async def test_closing_early_disconnects_the_app() -> None:
    app = _TwoParts()
    async with httpx.AsyncClient(base_url=IN_PROCESS_URL, transport=AppTransport(app)) as client:
        async with client.stream("POST", "/v1/x") as response:
            assert await response.aiter_bytes().__anext__() == b"first"
        assert app.disconnected.is_set()
