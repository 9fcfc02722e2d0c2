"""HTTP upstreams: one pooled httpx transport per endpoint, retries before headers.

The pool is an httpx transport (:class:`gateway.endpoints.hosted.transport.AiohttpTransport`, aiohttp's
pool behind httpx's API), used directly rather than through an ``AsyncClient``: the
client layer would persist cookies across requests (one tenant's upstream cookies must
never reach another's request) and re-merge URLs and check redirects on every call,
which costs more than the rest of the proxy path.

``Upstream.open`` sends a request and returns the streamed response once a 2xx status
and headers arrived. Before that point it retries (the first failure waits, then
tenacity drives the remaining tries; exponential backoff with jitter) on transport
errors, timeouts, 429 (``Retry-After`` honoured up to a cap) and 502/503/504. Whatever fails is raised as :class:`UpstreamFailure`; the caller decides
on fallback and maps it to the client-facing error.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
from collections.abc import Mapping, Sequence

import httpx
from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt

from gateway.config import EndpointConfig
from gateway.endpoints.hosted.transport import AiohttpTransport
from gateway.endpoints.providers import adapter_for
from gateway.errors import (
    GatewayError,
    RateLimited,
    UpstreamError,
    UpstreamRejected,
    UpstreamTimeout,
    redact,
)
from sdk.retry_after import retry_after_s

RETRY_STATUSES = frozenset({429, 502, 503, 504})
RETRY_AFTER_LIMIT_S = 86400.0
"""The longest upstream ``Retry-After`` kept (and passed on to clients): one day."""
ERROR_BODY_BYTES = 64 * 1024  # an upstream error message is read up to this size
# 4xx answers caused by the client's request: passed back, never retried or failed over.
CLIENT_FAULT_STATUSES = frozenset({400, 413, 422})


class UpstreamFailure(Exception):
    """An attempt failed before the first byte went to the client."""

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        timeout: bool = False,
        retry_after: float | None = None,
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.timeout = timeout
        self.retry_after = retry_after
        self.param = param

    @property
    def retryable(self) -> bool:
        return self.status is None or self.status in RETRY_STATUSES

    @property
    def endpoint_fault(self) -> bool:
        """The endpoint is unwell (unreachable, timed out, 5xx): counts against its health."""
        return self.status is None or self.status >= 500

    @property
    def client_fault(self) -> bool:
        return self.status in CLIENT_FAULT_STATUSES

    def to_error(self, endpoint: str) -> GatewayError:
        """The client-facing error for this failure."""
        if self.client_fault and self.status is not None:
            return UpstreamRejected(self.status, self.message, param=self.param)
        if self.timeout:
            return UpstreamTimeout(f"endpoint {endpoint!r} timed out: {self.message}")
        if self.status == 429:
            headers = {}
            if self.retry_after is not None:
                headers["retry-after"] = str(math.ceil(self.retry_after))
            return RateLimited(
                f"endpoint {endpoint!r} is rate limited: {self.message}", headers=headers
            )
        return UpstreamError(f"endpoint {endpoint!r} failed: {self.message}")


def _error_message(body: bytes, status: int) -> tuple[str, str | None]:
    try:
        data = json.loads(body)
        error = data.get("error", data) if isinstance(data, dict) else None
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            param = error.get("param")
            return error["message"], param if isinstance(param, str) else None
        if isinstance(error, str):
            return error, None
    except ValueError:
        pass
    return f"upstream answered HTTP {status}", None


async def _error_body(response: httpx.Response) -> bytes:
    """An error answer's body, read no further than ``ERROR_BODY_BYTES`` (a longer one is
    no error message: empty, so the status alone is reported)."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.aiter_bytes():
        size += len(chunk)
        if size > ERROR_BODY_BYTES:
            return b""
        chunks.append(chunk)
    return b"".join(chunks)


class Upstream:
    """An endpoint reached over HTTP (every kind but in-process local)."""

    def __init__(
        self,
        config: EndpointConfig,
        environ: Mapping[str, str],
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.config = config
        self.adapter = adapter_for(config, environ)
        self._secrets = [self.adapter.api_key] if self.adapter.api_key else []
        self.transport = transport or AiohttpTransport(config.max_connections)
        self._extensions = {
            "timeout": {
                "connect": config.connect_timeout_s,
                "read": config.timeout_s,
                "write": config.timeout_s,
                "pool": config.timeout_s,
            }
        }
        self._base_headers = [
            (b"content-type", b"application/json"),
            (b"accept-encoding", b"identity"),
            *self.adapter.auth_headers(),
        ]
        self._urls: dict[tuple[str, str], httpx.URL] = {}

    def _delay(self, exc: BaseException | None, failed_attempts: int) -> float:
        """Seconds to wait before the next try: Retry-After (capped) or jittered backoff."""
        if isinstance(exc, UpstreamFailure) and exc.retry_after is not None:
            return min(float(exc.retry_after), self.config.retry_after_cap_s)
        backoff = self.config.backoff_s * 2.0 ** (failed_attempts - 1)
        return min(backoff, self.config.max_backoff_s) * (0.5 + random.random() / 2)

    async def open(
        self,
        path: str,
        body: bytes,
        upstream_model: str,
        client_headers: Sequence[tuple[bytes, bytes]] = (),
        *,
        retry: bool = True,
    ) -> httpx.Response:
        """POST ``body`` to ``path``; the response (2xx, body not yet read) or a failure.

        ``retry=False`` makes one try only (another replica of the model is next)."""
        url = self._urls.get((path, upstream_model))
        if url is None:
            url = self._urls[(path, upstream_model)] = httpx.URL(
                self.adapter.url(path, upstream_model)
            )
        headers = [*client_headers, *self._base_headers]
        try:  # the first try runs without the retry machinery: the common case stays cheap
            return await self._send_once(url, body, headers)
        except UpstreamFailure as exc:
            if not exc.retryable or self.config.retries == 0 or not retry:
                raise
            first = exc
        await asyncio.sleep(self._delay(first, 1))
        retrying = AsyncRetrying(
            stop=stop_after_attempt(self.config.retries),
            wait=lambda state: self._delay(
                state.outcome.exception() if state.outcome else None, state.attempt_number + 1
            ),
            retry=retry_if_exception(lambda e: isinstance(e, UpstreamFailure) and e.retryable),
            reraise=True,
        )
        async for attempt in retrying:
            with attempt:
                return await self._send_once(url, body, headers)
        raise AssertionError("unreachable")  # pragma: no cover

    async def _send_once(
        self, url: httpx.URL, body: bytes, headers: list[tuple[bytes, bytes]]
    ) -> httpx.Response:
        request = httpx.Request(
            "POST", url, content=body, headers=headers, extensions=self._extensions
        )
        try:
            response = await self.transport.handle_async_request(request)
        except httpx.TimeoutException as exc:
            raise UpstreamFailure(type(exc).__name__, timeout=True) from None
        except httpx.TransportError as exc:
            raise UpstreamFailure(f"{type(exc).__name__}: {self.safe(str(exc))}") from None
        if 200 <= response.status_code < 300:
            return response
        try:
            content = await _error_body(response)
        except httpx.HTTPError:
            content = b""
        finally:
            await response.aclose()
        message, param = _error_message(content, response.status_code)
        raise UpstreamFailure(
            self.safe(message),
            status=response.status_code,
            retry_after=retry_after_s(response.headers, RETRY_AFTER_LIMIT_S),
            param=param,
        )

    async def check(self) -> bool:
        """One active health check: ``GET {base_url}/models`` answers 2xx in time."""
        timeout = self.config.connect_timeout_s
        request = httpx.Request(
            "GET",
            self.adapter.url("models", ""),
            headers=[(b"accept-encoding", b"identity"), *self.adapter.auth_headers()],
            extensions={
                "timeout": {"connect": timeout, "read": timeout, "write": timeout, "pool": timeout}
            },
        )
        try:
            response = await self.transport.handle_async_request(request)
            try:
                await response.aread()
            finally:
                await response.aclose()
        except httpx.HTTPError:
            return False
        return 200 <= response.status_code < 300

    def safe(self, message: str) -> str:
        """``message`` with credentials removed."""
        return redact(message, self._secrets)

    async def aclose(self) -> None:
        await self.transport.aclose()
