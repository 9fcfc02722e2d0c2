# Generated from sdk/async_client.py by tools/unasync.py; edit that file, not this one.
"""The synchronous client: every method of the asynchronous one, blocking."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
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
from sdk.documents import Documents
from sdk.edits import DEFAULT_MAX_FILE_BYTES, EditDelta, EditResult, EditSession, FileEdit
from sdk.streaming import Stream
from sdk.wire import ChatCompletion, ChatCompletionChunk, Completion, ModelList
from sdk.wire.endpoints import AuditRequest, AuditResult, EndpointList, EndpointRecord


class Client:
    """A client for the draftgate gateway or any OpenAI-compatible endpoint.

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
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.base_url = base_url
        self.max_retries = max_retries
        self._http = httpx.Client(
            base_url=base_url_with_slash(base_url),
            headers=default_headers(api_key, headers),
            timeout=timeout,
            transport=transport,
        )
        self.documents = Documents(self._send)

    # ------------------------------------------------------------ plumbing

    def _send(
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
        for attempt in tenacity.Retrying(**retry_policy(self.max_retries)):
            with attempt:
                try:
                    response = self._http.send(request, stream=stream)
                    if response.is_error:
                        response.read()
                except httpx.TransportError as exc:
                    raise connection_error(exc, request) from exc
                if response.is_error:
                    response.close()
                    raise_for_status(response)
        return response

    def _post(self, path: str, body: dict[str, Any], model: type[ModelT]) -> ModelT:
        return parse_body(self._send("POST", path, json=body), model)

    def _post_stream(self, path: str, body: dict[str, Any], model: type[ModelT]) -> Stream[ModelT]:
        return Stream(self._send("POST", path, json=body, stream=True), model)

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # ------------------------------------------------------------ OpenAI API

    @overload
    def chat(
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
    def chat(
        self,
        *,
        model: str,
        messages: Sequence[Mapping[str, Any] | BaseModel],
        stream: Literal[True],
        prediction: str | None = None,
        documents: Sequence[str] | None = None,
        **params: Any,
    ) -> Stream[ChatCompletionChunk]: ...
    def chat(
        self,
        *,
        model: str,
        messages: Sequence[Mapping[str, Any] | BaseModel],
        stream: bool = False,
        prediction: str | None = None,
        documents: Sequence[str] | None = None,
        **params: Any,
    ) -> ChatCompletion | Stream[ChatCompletionChunk]:
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
            return self._post_stream("chat/completions", body, ChatCompletionChunk)
        return self._post("chat/completions", body, ChatCompletion)

    @overload
    def complete(
        self,
        *,
        model: str,
        prompt: str | list[str] | list[int],
        stream: Literal[False] = False,
        documents: Sequence[str] | None = None,
        **params: Any,
    ) -> Completion: ...
    @overload
    def complete(
        self,
        *,
        model: str,
        prompt: str | list[str] | list[int],
        stream: Literal[True],
        documents: Sequence[str] | None = None,
        **params: Any,
    ) -> Stream[Completion]: ...
    def complete(
        self,
        *,
        model: str,
        prompt: str | list[str] | list[int],
        stream: bool = False,
        documents: Sequence[str] | None = None,
        **params: Any,
    ) -> Completion | Stream[Completion]:
        """``POST /completions``; ``stream=True`` returns a :class:`Stream` of completion chunks."""
        body = completion_body(
            model=model, prompt=prompt, stream=stream, documents=documents, params=params
        )
        if stream:
            return self._post_stream("completions", body, Completion)
        return self._post("completions", body, Completion)

    def models(self) -> ModelList:
        """``GET /models``."""
        return parse_body(self._send("GET", "models"), ModelList)

    # ------------------------------------------------------------ draftgate API

    def endpoints(self, *, probe: bool = False) -> list[EndpointRecord]:
        """``GET /endpoints``: the gateway's speculation record of each endpoint.

        ``probe=True`` has the gateway probe every endpoint first (metrics, server info).
        """
        return parse_body(
            self._send("GET", "endpoints", params={"probe": "1"} if probe else None),
            EndpointList,
        ).data

    def audit(self, endpoint: str, **options: Any) -> AuditResult:
        """``POST /audits``: a latency audit of ``endpoint``; ``options`` as in :class:`AuditRequest`.

        Audits run for minutes: pass a client ``timeout`` that allows for it.
        """
        body = AuditRequest(endpoint=endpoint, **options).model_dump(
            mode="json", exclude_unset=True
        )
        return self._post("audits", body, AuditResult)

    # ------------------------------------------------------------ code edits

    @overload
    def edit(
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
    def edit(
        self,
        code: str,
        instruction: str,
        *,
        model: str,
        language: str | None = None,
        documents: Sequence[str] | None = None,
        stream: Literal[True],
        **sampling: Any,
    ) -> Iterator[EditDelta | EditResult]: ...
    def edit(
        self,
        code: str,
        instruction: str,
        *,
        model: str,
        language: str | None = None,
        documents: Sequence[str] | None = None,
        stream: bool = False,
        **sampling: Any,
    ) -> EditResult | Iterator[EditDelta | EditResult]:
        """Apply ``instruction`` to ``code``, sending the code as the prediction.

        Returns an :class:`EditResult`; with ``stream=True`` an iterator of
        :class:`EditDelta` pieces whose last item is the :class:`EditResult` (the request
        is sent when iteration starts). ``sampling``: temperature (default 0), max_tokens,
        seed, ... Raises :class:`sdk.errors.IncompleteEditError` if the answer was cut off.
        """
        session = EditSession(code, instruction, language=language, sampling=sampling)
        items = self._edit_items(session, model, documents, None)
        return items if stream else _final(items)

    @overload
    def edit_file(
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
    def edit_file(
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
    ) -> Iterator[EditDelta | EditResult]: ...
    def edit_file(
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
    ) -> EditResult | Iterator[EditDelta | EditResult]:
        """Edit a text file in place, atomically, once the whole answer has arrived.

        ``dry_run`` only returns the result (with its diff); ``backup`` keeps the old
        file as ``PATH.bak``. Binary files and files over ``max_bytes`` are refused
        (:class:`sdk.errors.BinaryFileError`, :class:`sdk.errors.FileTooLargeError`). If
        the stream breaks, the file is left exactly as it was.
        """
        file = FileEdit.open(path, max_bytes=max_bytes, dry_run=dry_run, backup=backup)
        items = self._edit_items(
            file.session(instruction, language, sampling), model, documents, file
        )
        return items if stream else _final(items)

    def _edit_items(
        self,
        session: EditSession,
        model: str,
        documents: Sequence[str] | None,
        file: FileEdit | None,
    ) -> Iterator[EditDelta | EditResult]:
        session.start()
        with self.chat(
            model=model,
            messages=session.messages,
            stream=True,
            prediction=session.prediction,
            documents=documents,
            **session.sampling,
        ) as chunks:
            session.answered(chunks.response.headers)
            for chunk in chunks:
                if (delta := session.feed(chunk)) is not None:
                    yield delta
        result = session.result()
        yield file.finish(result) if file else result


def _final(items: Iterator[EditDelta | EditResult]) -> EditResult:
    """Run an edit's items to the end; its result."""
    for item in items:
        if isinstance(item, EditResult):
            return item
    raise AssertionError("an edit's items end with its result")
