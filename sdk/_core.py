"""What the sync and async clients share: request bodies, retries, error and SSE parsing.

The two clients differ only in how they do I/O; every decision about what to send, when
to retry and how to read an answer is made here, once.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Generic, TypeVar

import httpx
import tenacity
from pydantic import BaseModel, ValidationError

from sdk import __version__
from sdk.errors import (
    APIConnectionError,
    APIResponseValidationError,
    APIStatusError,
    APIStreamError,
    APITimeoutError,
    InternalServerError,
    RateLimitError,
    status_error,
)
from sdk.retry_after import retry_after_s
from sdk.wire import ChatCompletionRequest, CompletionRequest, ErrorResponse

ModelT = TypeVar("ModelT", bound=BaseModel)

DEFAULT_TIMEOUT: httpx.Timeout = httpx.Timeout(600.0, connect=5.0)
"""Generation can be slow: 10 minutes to read, 5 seconds to connect."""
DEFAULT_MAX_RETRIES = 2
MAX_RETRY_AFTER_S = 30.0
"""The longest ``Retry-After`` the client waits; a longer one is cut to this."""
_BACKOFF = tenacity.wait_exponential(multiplier=0.5, max=8.0) + tenacity.wait_random(0, 1)


def default_headers(api_key: str | None, headers: Mapping[str, str] | None) -> dict[str, str]:
    """Headers sent with every request: user agent, bearer key, then the caller's own."""
    out = {"User-Agent": f"draftgate-sdk/{__version__}", "Accept": "application/json"}
    if api_key:
        out["Authorization"] = f"Bearer {api_key}"
    out.update(headers or {})
    return out


def base_url_with_slash(base_url: str) -> str:
    """``http://h/v1`` -> ``http://h/v1/`` so relative paths like ``chat/completions`` join."""
    return base_url if base_url.endswith("/") else base_url + "/"


# ---------------------------------------------------------------- request bodies


def _add_documents(body: dict[str, Any], documents: Sequence[str] | None) -> None:
    """Name ``documents`` in the body's ``draftgate`` extension object (keeping its other keys)."""
    if documents:
        body["draftgate"] = {**body.get("draftgate", {}), "documents": list(documents)}


def chat_body(
    *,
    model: str,
    messages: Sequence[Mapping[str, Any] | BaseModel],
    stream: bool,
    prediction: str | None,
    documents: Sequence[str] | None,
    params: Mapping[str, Any],
) -> dict[str, Any]:
    """A validated ``/chat/completions`` body holding only what the caller set."""
    body: dict[str, Any] = {
        "model": model,
        "messages": [
            m.model_dump(exclude_none=True) if isinstance(m, BaseModel) else m for m in messages
        ],
        **params,
    }
    if stream:
        body["stream"] = True
    if prediction is not None:
        body["prediction"] = {"type": "content", "content": prediction}
    _add_documents(body, documents)
    request = ChatCompletionRequest.model_validate(body)
    return request.model_dump(mode="json", exclude_unset=True)


def completion_body(
    *,
    model: str,
    prompt: str | list[str] | list[int],
    stream: bool,
    documents: Sequence[str] | None,
    params: Mapping[str, Any],
) -> dict[str, Any]:
    """A validated ``/completions`` body holding only what the caller set."""
    body: dict[str, Any] = {"model": model, "prompt": prompt, **params}
    if stream:
        body["stream"] = True
    _add_documents(body, documents)
    request = CompletionRequest.model_validate(body)
    return request.model_dump(mode="json", exclude_unset=True)


# ---------------------------------------------------------------- errors


def error_body(response: httpx.Response) -> ErrorResponse:
    """The OpenAI-style error of a response already read, or one made from its text."""
    try:
        return ErrorResponse.model_validate_json(response.content)
    except ValidationError:
        text = response.text.strip()[:500] or response.reason_phrase
        return ErrorResponse.model_validate(
            {"error": {"message": text, "type": "http_error", "code": str(response.status_code)}}
        )


def raise_for_status(response: httpx.Response) -> None:
    """Raise the matching :class:`APIStatusError` for a 4xx/5xx response (body already read)."""
    if response.is_error:
        raise status_error(response.status_code, error_body(response), response.headers)


def connection_error(exc: httpx.TransportError, request: httpx.Request) -> APIConnectionError:
    """The SDK error for an httpx transport failure."""
    if isinstance(exc, httpx.TimeoutException):
        return APITimeoutError(f"request timed out ({type(exc).__name__}): {exc}", request=request)
    return APIConnectionError(f"connection failed ({type(exc).__name__}): {exc}", request=request)


def parse_body(response: httpx.Response, model: type[ModelT]) -> ModelT:
    """A 2xx body as the expected wire type."""
    try:
        return model.model_validate_json(response.content)
    except ValidationError as exc:
        raise APIResponseValidationError(
            f"{response.request.method} {response.request.url.path}: the answer is not a "
            f"valid {model.__name__}: {exc}"
        ) from exc


# ---------------------------------------------------------------- retries


def is_retryable(exc: BaseException) -> bool:
    """Retry what cannot have run on the server, or what the server asks us to repeat.

    Connection failures and connect/pool timeouts (the request never left), 429 and 5xx.
    A read or write timeout is not retried: the server may still be generating.
    """
    if isinstance(exc, APITimeoutError):
        return isinstance(exc.__cause__, httpx.ConnectTimeout | httpx.PoolTimeout)
    return isinstance(exc, APIConnectionError | RateLimitError | InternalServerError)


def retry_wait(state: tenacity.RetryCallState) -> float:
    """The server's ``Retry-After`` when it sent one, else exponential backoff with jitter."""
    exc = state.outcome.exception() if state.outcome else None
    if (
        isinstance(exc, APIStatusError)
        and (wait := retry_after_s(exc.headers, MAX_RETRY_AFTER_S)) is not None
    ):
        return wait
    return float(_BACKOFF(state))


def retry_policy(max_retries: int) -> dict[str, Any]:
    """Keyword arguments for ``tenacity.Retrying`` / ``AsyncRetrying``."""
    return {
        "stop": tenacity.stop_after_attempt(max_retries + 1),
        "wait": retry_wait,
        "retry": tenacity.retry_if_exception(is_retryable),
        "reraise": True,
    }


# ---------------------------------------------------------------- server-sent events


class SSEDecoder(Generic[ModelT]):
    """Turns the lines of an OpenAI-style SSE stream into typed items.

    Feed it each line; it returns an item when an event is complete. ``done`` is set by
    ``data: [DONE]``; an event ``{"error": {...}}`` raises :class:`APIStreamError`.
    """

    def __init__(self, model: type[ModelT]) -> None:
        self._model = model
        self._data: list[str] = []
        self.done = False

    def feed(self, line: str) -> ModelT | None:
        """One line of the stream (without its newline); the item it completes, if any."""
        if line == "":
            return self._dispatch()
        if line.startswith(":"):
            return None  # a comment, e.g. a keep-alive
        field, _, value = line.partition(":")
        if field == "data":
            self._data.append(value[1:] if value.startswith(" ") else value)
        return None

    def finish(self) -> ModelT | None:
        """Call when the body ended: the last item if one was pending; raises if no ``[DONE]``."""
        item = self._dispatch()
        if not self.done:
            raise APIStreamError("the stream ended before data: [DONE]; the answer is incomplete")
        return item

    def _dispatch(self) -> ModelT | None:
        if not self._data:
            return None
        data = "\n".join(self._data)
        self._data = []
        if data == "[DONE]":
            self.done = True
            return None
        try:
            payload = json.loads(data)
        except json.JSONDecodeError as exc:
            raise APIStreamError(f"a stream event is not JSON: {data[:200]!r}") from exc
        if isinstance(payload, dict) and "error" in payload:
            body = ErrorResponse.model_validate(_error_payload(payload["error"]))
            raise APIStreamError(f"error in stream: {body.error.message}", body=body)
        try:
            return self._model.model_validate(payload)
        except ValidationError as exc:
            raise APIStreamError(f"a stream event is not a {self._model.__name__}: {exc}") from exc


def _error_payload(error: Any) -> dict[str, Any]:
    if isinstance(error, dict):
        given = {k: v for k, v in error.items() if v is not None}
        return {"error": {"message": "error", "type": "stream_error", **given}}
    return {"error": {"message": str(error), "type": "stream_error"}}
