"""An httpx transport over aiohttp's connection pool (C-accelerated HTTP/1.1 parsing).

The upstream hop keeps httpx's API (``httpx.Request`` in, streamed ``httpx.Response``
out) but sends through aiohttp: cheaper per request than httpcore + h11, and its pool
does not slow down as concurrent requests grow.
Written here rather than taken from ``httpx-aiohttp`` (0.2.0), whose error mapping
turns a refused connection or a server disconnect into ``httpx.ConnectTimeout`` (a 504
instead of a 502), lets malformed responses escape as aiohttp errors, and whose default
session keeps a cookie jar shared by every request.

aiohttp errors become the httpx errors httpcore raises for the same event: connect
failures ``ConnectError``, timeouts ``ConnectTimeout``/``ReadTimeout``, disconnects, cut
bodies and malformed answers ``RemoteProtocolError``, socket errors ``ReadError``.
Timeouts come from the request's ``timeout`` extension: ``connect`` per socket connect,
``read`` per socket read (before headers and between chunks), ``pool`` for a free
connection plus connecting.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import httpx

_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError)
# aiohttp adds these unless told not to; httpcore sends only what the request carries
_SKIP_AUTO_HEADERS = ("Accept", "User-Agent")


def httpx_error(exc: BaseException) -> httpx.TransportError:
    """The httpx exception httpcore would raise for aiohttp's ``exc``."""
    message = str(exc) or type(exc).__name__
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return httpx.ConnectTimeout(message)
    if isinstance(exc, asyncio.TimeoutError):
        return httpx.ReadTimeout(message)
    if isinstance(exc, aiohttp.ClientConnectorError):
        return httpx.ConnectError(message)
    if isinstance(exc, aiohttp.ClientOSError):
        return httpx.ReadError(message)
    return httpx.RemoteProtocolError(message)


class _Body(httpx.AsyncByteStream):
    """A response body, forwarded as it arrives (whatever bytes each read returns)."""

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self._response = response

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._response.content.iter_any():
                yield chunk
        except _ERRORS as exc:
            raise httpx_error(exc) from exc

    async def aclose(self) -> None:
        # back to the pool when the body was read to the end, closed otherwise
        self._response.release()


class AiohttpTransport(httpx.AsyncBaseTransport):
    """One pooled aiohttp session (created on first use, inside the event loop)."""

    def __init__(self, max_connections: int) -> None:
        self._max_connections = max_connections
        self._ssl = httpx.create_ssl_context()  # certifi's CAs and SSL_CERT_* as httpx
        self._session: aiohttp.ClientSession | None = None

    def _open(self) -> aiohttp.ClientSession:
        return aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=self._max_connections, ssl=self._ssl),
            cookie_jar=aiohttp.DummyCookieJar(),  # never carry one request's cookies to another
            skip_auto_headers=_SKIP_AUTO_HEADERS,
            auto_decompress=False,
        )

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        session = self._session
        if session is None:
            session = self._session = self._open()
        timeout = request.extensions.get("timeout", {})
        try:
            response = await session.request(
                request.method,
                str(request.url),
                headers=request.headers.multi_items(),
                data=request.content,
                allow_redirects=False,
                timeout=aiohttp.ClientTimeout(
                    connect=timeout.get("pool"),
                    sock_connect=timeout.get("connect"),
                    sock_read=timeout.get("read"),
                ),
            )
        except _ERRORS as exc:
            raise httpx_error(exc) from exc
        return httpx.Response(
            response.status,
            headers=response.raw_headers,
            stream=_Body(response),
            request=request,
            extensions={"http_version": b"HTTP/1.1"},
        )

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
