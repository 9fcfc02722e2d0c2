"""Iterators over the typed items of an SSE response (sync and async).

Both close the HTTP response when they end, break or are closed; a connection that drops
mid-stream raises :class:`sdk.errors.APIConnectionError`, an in-stream error event or a
missing ``[DONE]`` raises :class:`sdk.errors.APIStreamError`.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Generator, Iterator
from types import TracebackType
from typing import Generic

import httpx

from sdk._core import ModelT, SSEDecoder, connection_error


class Stream(Generic[ModelT]):
    """``for chunk in stream: ...``; use as a context manager (or call ``close``) to stop early."""

    def __init__(self, response: httpx.Response, model: type[ModelT]) -> None:
        self.response = response
        self._items = self._iterate(SSEDecoder(model))

    def _iterate(self, decoder: SSEDecoder[ModelT]) -> Generator[ModelT, None, None]:
        try:
            for line in self.response.iter_lines():
                if (item := decoder.feed(line)) is not None:
                    yield item
            if (item := decoder.finish()) is not None:
                yield item
        except httpx.TransportError as exc:
            raise connection_error(exc, self.response.request) from exc
        finally:
            self.response.close()

    def __iter__(self) -> Iterator[ModelT]:
        return self._items

    def __next__(self) -> ModelT:
        return next(self._items)

    def close(self) -> None:
        """Stop reading and release the connection."""
        self._items.close()
        self.response.close()

    def __enter__(self) -> Stream[ModelT]:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class AsyncStream(Generic[ModelT]):
    """``async for chunk in stream: ...``; ``async with`` (or ``aclose``) stops early."""

    def __init__(self, response: httpx.Response, model: type[ModelT]) -> None:
        self.response = response
        self._items = self._iterate(SSEDecoder(model))

    async def _iterate(self, decoder: SSEDecoder[ModelT]) -> AsyncGenerator[ModelT, None]:
        try:
            async for line in self.response.aiter_lines():
                if (item := decoder.feed(line)) is not None:
                    yield item
            if (item := decoder.finish()) is not None:
                yield item
        except httpx.TransportError as exc:
            raise connection_error(exc, self.response.request) from exc
        finally:
            await self.response.aclose()

    def __aiter__(self) -> AsyncIterator[ModelT]:
        return self._items

    async def __anext__(self) -> ModelT:
        return await self._items.__anext__()

    async def aclose(self) -> None:
        """Stop reading and release the connection."""
        await self._items.aclose()
        await self.response.aclose()

    async def __aenter__(self) -> AsyncStream[ModelT]:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()
