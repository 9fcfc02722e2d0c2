"""The asynchronous client: the same API as :class:`sdk.client.Client`, awaited."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Mapping, Sequence
from types import TracebackType
from typing import Any, Literal, overload

import httpx
import tenacity
from pydantic import BaseModel

from sdk._core import (
    DEFAULT_MAX_RETRIES,
    DEFAULT_TIMEOUT,
    ModelT,
    base_url_with_slash,
    chat_body,
    completion_body,
    connection_error,
    default_headers,
    parse_body,
    raise_for_status,
    retry_policy,
)
from sdk.documents import AsyncDocuments
from sdk.edits import DEFAULT_MAX_FILE_BYTES, EditDelta, EditResult, EditSession, FileEdit
from sdk.streaming import AsyncStream
from sdk.wire import ChatCompletion, ChatCompletionChunk, Completion, ModelList
from sdk.wire.endpoints import AuditRequest, AuditResult, EndpointList, EndpointRecord


class AsyncClient:
    """An asyncio client for the draftgate gateway or any OpenAI-compatible endpoint.

    ``base_url`` is the API root, e.g. ``http://127.0.0.1:8000/v1``. Requests are retried
    ``max_retries`` times with exponential backoff on connection failures, 429 (waiting
    ``Retry-After``, capped) and 5xx, never once a response body has been handed out.
    ``transport`` replaces httpx's network transport (tests, ``httpx.ASGITransport``).
    """

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        *,
        timeout: float | httpx.Timeout = DEFAULT_TIMEOUT,
        max_retries: int = DEFAULT_MAX_RETRIES,
        headers: Mapping[str, str] | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.base_url = base_url
        self.max_retries = max_retries
        self._http = httpx.AsyncClient(
            base_url=base_url_with_slash(base_url),
            headers=default_headers(api_key, headers),
            timeout=timeout,
            transport=transport,
        )
        self.documents = AsyncDocuments(self._send)

    # ------------------------------------------------------------ plumbing

    async def _send(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Mapping[str, str] | None = None,
        stream: bool = False,
    ) -> httpx.Response:
        """Send with retries; returns a 2xx response (unread when ``stream``)."""
        request = self._http.build_request(method, path, json=json, params=params)
        async for attempt in tenacity.AsyncRetrying(**retry_policy(self.max_retries)):
            with attempt:
                try:
                    response = await self._http.send(request, stream=stream)
                    if response.is_error:
                        await response.aread()
                except httpx.TransportError as exc:
                    raise connection_error(exc, request) from exc
                if response.is_error:
                    await response.aclose()
                    raise_for_status(response)
        return response

    async def _post(self, path: str, body: dict[str, Any], model: type[ModelT]) -> ModelT:
        return parse_body(await self._send("POST", path, json=body), model)

    async def _post_stream(
        self, path: str, body: dict[str, Any], model: type[ModelT]
    ) -> AsyncStream[ModelT]:
        return AsyncStream(await self._send("POST", path, json=body, stream=True), model)

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    # ------------------------------------------------------------ OpenAI API

    @overload
    async def chat(
        self,
        *,
        model: str,
        messages: Sequence[Mapping[str, Any] | BaseModel],
        stream: Literal[False] = False,
        prediction: str | None = None,
        documents: Sequence[str] | None = None,
        **params: Any,
    ) -> ChatCompletion: ...
    @overload
    async def chat(
        self,
        *,
        model: str,
        messages: Sequence[Mapping[str, Any] | BaseModel],
        stream: Literal[True],
        prediction: str | None = None,
        documents: Sequence[str] | None = None,
        **params: Any,
    ) -> AsyncStream[ChatCompletionChunk]: ...
    async def chat(
        self,
        *,
        model: str,
        messages: Sequence[Mapping[str, Any] | BaseModel],
        stream: bool = False,
        prediction: str | None = None,
        documents: Sequence[str] | None = None,
        **params: Any,
    ) -> ChatCompletion | AsyncStream[ChatCompletionChunk]:
        """``POST /chat/completions``; ``stream=True`` returns a :class:`Stream` of chunks.

        ``prediction`` is the expected output text (OpenAI Predicted Outputs);
        ``documents`` names cached documents to draft from (draftgate extension); any
        other OpenAI parameter goes in ``params``.
        """
        body = chat_body(
            model=model,
            messages=messages,
            stream=stream,
            prediction=prediction,
            documents=documents,
            params=params,
        )
        if stream:
            return await self._post_stream("chat/completions", body, ChatCompletionChunk)
        return await self._post("chat/completions", body, ChatCompletion)

    @overload
    async def complete(
        self,
        *,
        model: str,
        prompt: str | list[str] | list[int],
        stream: Literal[False] = False,
        documents: Sequence[str] | None = None,
        **params: Any,
    ) -> Completion: ...
    @overload
    async def complete(
        self,
        *,
        model: str,
        prompt: str | list[str] | list[int],
        stream: Literal[True],
        documents: Sequence[str] | None = None,
        **params: Any,
    ) -> AsyncStream[Completion]: ...
    async def complete(
        self,
        *,
        model: str,
        prompt: str | list[str] | list[int],
        stream: bool = False,
        documents: Sequence[str] | None = None,
        **params: Any,
    ) -> Completion | AsyncStream[Completion]:
        """``POST /completions``; ``stream=True`` returns a :class:`Stream` of completion chunks."""
        body = completion_body(
            model=model, prompt=prompt, stream=stream, documents=documents, params=params
        )
        if stream:
            return await self._post_stream("completions", body, Completion)
        return await self._post("completions", body, Completion)

    async def models(self) -> ModelList:
        """``GET /models``."""
        return parse_body(await self._send("GET", "models"), ModelList)

    # ------------------------------------------------------------ draftgate API

    async def endpoints(self, *, probe: bool = False) -> list[EndpointRecord]:
        """``GET /endpoints``: the gateway's speculation record of each endpoint.

        ``probe=True`` has the gateway probe every endpoint first (``POST /endpoints/probe``:
        metrics, server info; needs an admin key where keys are configured).
        """
        return parse_body(
            await (
                self._send("POST", "endpoints/probe", json={})
                if probe
                else self._send("GET", "endpoints")
            ),
            EndpointList,
        ).data

    async def audit(self, endpoint: str, **options: Any) -> AuditResult:
        """``POST /audits``: a latency audit of ``endpoint``; ``options`` as in :class:`AuditRequest`.

        Audits run for minutes: pass a client ``timeout`` that allows for it.
        """
        body = AuditRequest(endpoint=endpoint, **options).model_dump(
            mode="json", exclude_unset=True
        )
        return await self._post("audits", body, AuditResult)

    # ------------------------------------------------------------ code edits

    @overload
    async def edit(
        self,
        code: str,
        instruction: str,
        *,
        model: str,
        language: str | None = None,
        documents: Sequence[str] | None = None,
        stream: Literal[False] = False,
        **sampling: Any,
    ) -> EditResult: ...
    @overload
    async def edit(
        self,
        code: str,
        instruction: str,
        *,
        model: str,
        language: str | None = None,
        documents: Sequence[str] | None = None,
        stream: Literal[True],
        **sampling: Any,
    ) -> AsyncIterator[EditDelta | EditResult]: ...
    async def edit(
        self,
        code: str,
        instruction: str,
        *,
        model: str,
        language: str | None = None,
        documents: Sequence[str] | None = None,
        stream: bool = False,
        **sampling: Any,
    ) -> EditResult | AsyncIterator[EditDelta | EditResult]:
        """Apply ``instruction`` to ``code``, sending the code as the prediction.

        Returns an :class:`EditResult`; with ``stream=True`` an iterator of
        :class:`EditDelta` pieces whose last item is the :class:`EditResult` (the request
        is sent when iteration starts). ``sampling``: temperature (default 0), max_tokens,
        seed, ... Raises :class:`sdk.errors.IncompleteEditError` if the answer was cut off.
        """
        session = EditSession(code, instruction, language=language, sampling=sampling)
        items = self._edit_items(session, model, documents, None)
        return items if stream else await _final(items)

    @overload
    async def edit_file(
        self,
        path: str | os.PathLike[str],
        instruction: str,
        *,
        model: str,
        dry_run: bool = False,
        backup: bool = True,
        max_bytes: int = DEFAULT_MAX_FILE_BYTES,
        language: str | None = None,
        documents: Sequence[str] | None = None,
        stream: Literal[False] = False,
        **sampling: Any,
    ) -> EditResult: ...
    @overload
    async def edit_file(
        self,
        path: str | os.PathLike[str],
        instruction: str,
        *,
        model: str,
        dry_run: bool = False,
        backup: bool = True,
        max_bytes: int = DEFAULT_MAX_FILE_BYTES,
        language: str | None = None,
        documents: Sequence[str] | None = None,
        stream: Literal[True],
        **sampling: Any,
    ) -> AsyncIterator[EditDelta | EditResult]: ...
    async def edit_file(
        self,
        path: str | os.PathLike[str],
        instruction: str,
        *,
        model: str,
        dry_run: bool = False,
        backup: bool = True,
        max_bytes: int = DEFAULT_MAX_FILE_BYTES,
        language: str | None = None,
        documents: Sequence[str] | None = None,
        stream: bool = False,
        **sampling: Any,
    ) -> EditResult | AsyncIterator[EditDelta | EditResult]:
        """Edit a text file in place, atomically, once the whole answer has arrived.

        ``dry_run`` only returns the result (with its diff); ``backup`` keeps the old
        file as ``PATH.bak``. Binary files and files over ``max_bytes`` are refused
        (:class:`sdk.errors.BinaryFileError`, :class:`sdk.errors.FileTooLargeError`). If
        the stream breaks, the file is left exactly as it was.
        """
        file = await asyncio.to_thread(
            FileEdit.open, path, max_bytes=max_bytes, dry_run=dry_run, backup=backup
        )
        items = self._edit_items(
            file.session(instruction, language, sampling), model, documents, file
        )
        return items if stream else await _final(items)

    async def _edit_items(
        self,
        session: EditSession,
        model: str,
        documents: Sequence[str] | None,
        file: FileEdit | None,
    ) -> AsyncIterator[EditDelta | EditResult]:
        session.start()
        async with await self.chat(
            model=model,
            messages=session.messages,
            stream=True,
            prediction=session.prediction,
            documents=documents,
            **session.sampling,
        ) as chunks:
            session.answered(chunks.response.headers)
            async for chunk in chunks:
                if (delta := session.feed(chunk)) is not None:
                    yield delta
        result = session.result()
        yield await asyncio.to_thread(file.finish, result) if file else result


async def _final(items: AsyncIterator[EditDelta | EditResult]) -> EditResult:
    """Run an edit's items to the end; its result."""
    async for item in items:
        if isinstance(item, EditResult):
            return item
    raise AssertionError("an edit's items end with its result")
