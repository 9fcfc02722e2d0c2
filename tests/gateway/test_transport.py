"""The aiohttp-backed httpx transport against real sockets: the httpx errors the upstream
code catches, chunk-by-chunk bodies, no cookies kept, the pool limit, closing."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import httpx
import pytest

from gateway.endpoints.hosted.transport import AiohttpTransport

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
OK_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
)
TIMEOUTS = {"connect": 2.0, "read": 2.0, "write": 2.0, "pool": 2.0}


@asynccontextmanager
async def server(handler: Handler) -> AsyncIterator[str]:
    """A raw TCP server on a free loopback port; yields its base URL."""
    srv = await asyncio.start_server(handler, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{srv.sockets[0].getsockname()[1]}"
    finally:
        srv.close()


async def read_request(reader: asyncio.StreamReader) -> bytes:
    """The request head (the test requests carry a 2-byte body, read with it)."""
    head = await reader.readuntil(b"\r\n\r\n")
    await reader.readexactly(2)
    return head


def request(url: str, **timeouts: float) -> httpx.Request:
    return httpx.Request(
        "POST", f"{url}/v1/x", content=b"{}", extensions={"timeout": {**TIMEOUTS, **timeouts}}
    )


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


async def test_refused_connection_is_connect_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    transport = AiohttpTransport(4)
    with pytest.raises(httpx.ConnectError):
        await transport.handle_async_request(request(f"http://127.0.0.1:{port}"))
    await transport.aclose()


@pytest.mark.parametrize(
    "answer",
    [b"", b"NOT HTTP\r\n\r\n"],
    ids=["closed-before-answering", "malformed-status-line"],
)
async def test_disconnect_or_garbage_is_protocol_error(answer: bytes) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(answer)
        writer.close()

    transport = AiohttpTransport(4)
    async with server(handler) as url:
        with pytest.raises(httpx.RemoteProtocolError):
            await transport.handle_async_request(request(url))
    await transport.aclose()


async def test_no_headers_in_time_is_read_timeout() -> None:
    release = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        await release.wait()
        writer.close()

    transport = AiohttpTransport(4)
    async with server(handler) as url:
        with pytest.raises(httpx.ReadTimeout):
            await transport.handle_async_request(request(url, read=0.2))
        release.set()
    await transport.aclose()


async def test_chunks_arrive_one_by_one_and_a_cut_body_is_protocol_error() -> None:
    """Each chunk reaches the caller before the server sends the next one; a body that
    ends early raises (never a silently short body)."""
    got_first = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(OK_HEAD + chunk(b"data: 1\n\n"))
        await writer.drain()
        await got_first.wait()  # sent only once the client saw the first chunk
        writer.write(chunk(b"data: 2\n\n"))
        await writer.drain()
        writer.close()  # no terminating zero-length chunk

    transport = AiohttpTransport(4)
    async with server(handler) as url:
        response = await transport.handle_async_request(request(url))
        assert response.status_code == 200
        assert response.headers["content-type"] == "text/event-stream"
        received = []
        with pytest.raises(httpx.RemoteProtocolError):
            async for data in response.aiter_raw():
                received.append(data)
                got_first.set()
        await response.aclose()
    assert received == [b"data: 1\n\n", b"data: 2\n\n"]
    await transport.aclose()


async def test_cookies_are_not_kept_and_nothing_is_added_to_the_request() -> None:
    heads: list[bytes] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                heads.append(await read_request(reader))
            except asyncio.IncompleteReadError:
                break
            writer.write(
                b"HTTP/1.1 200 OK\r\nset-cookie: tenant=alice; Path=/\r\n"
                b"content-length: 2\r\n\r\nok"
            )
            await writer.drain()
        writer.close()

    transport = AiohttpTransport(4)
    async with server(handler) as url:
        for _ in range(2):
            response = await transport.handle_async_request(request(url))
            assert await response.aread() == b"ok"
            await response.aclose()
        await transport.aclose()
    assert len(heads) == 2
    for head in heads:
        names = {line.split(b":")[0].lower() for line in head.split(b"\r\n")[1:] if line}
        assert b"cookie" not in names
        assert names.isdisjoint({b"user-agent", b"accept"})


async def test_pool_limit_and_reuse() -> None:
    """With one connection allowed, a second request waits for it (pool timeout while the
    first response is still arriving) and reuses it once the first is done."""
    connections = 0
    finish_first = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        while True:
            try:
                await read_request(reader)
            except asyncio.IncompleteReadError:
                break
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\no")
            await writer.drain()
            await finish_first.wait()
            writer.write(b"k")
            await writer.drain()
        writer.close()

    transport = AiohttpTransport(1)
    async with server(handler) as url:
        first = await transport.handle_async_request(request(url))
        with pytest.raises(httpx.ConnectTimeout):
            await transport.handle_async_request(request(url, pool=0.2))
        finish_first.set()
        assert await first.aread() == b"ok"
        await first.aclose()
        second = await transport.handle_async_request(request(url))
        assert await second.aread() == b"ok"
        await second.aclose()
        await transport.aclose()
    assert connections == 1
