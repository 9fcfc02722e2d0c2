"""The tests' stand-in for Anthropic's API, speaking the Messages wire format exactly.

``POST /v1/messages`` needs ``x-api-key`` (the key it was built with: else a 401
``authentication_error``) and ``anthropic-version`` (else a 400); the body is validated
with the Messages wire types (a 400 ``invalid_request_error`` naming the field). It
answers a ``message`` object, or with ``stream: true`` Anthropic's event sequence:
``message_start``, a ``ping``, per block ``content_block_start`` / ``content_block_delta``
(``text_delta``, ``input_json_delta`` in two pieces) / ``content_block_stop``,
``message_delta`` with the stop reason and usage, ``message_stop``.
``POST /v1/messages/count_tokens`` answers ``{"input_tokens": n}``. Tokens are the OpenAI
stand-in's (:func:`tests.openai_standin.tokens`).

What it answers is set per test on :class:`Script`: a text reply (default
:data:`ANSWER`), or tool calls. Every request is logged (path, query, headers, JSON body)
in ``requests``.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from sdk.wire import CountTokensRequest, MessagesRequest
from tests.openai_standin import BrokenStream, Seen, tokens

ANSWER = "Hello from the Messages stand-in."
VERSION = "2023-06-01"


def _no_calls(body: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return []


@dataclass
class Script:
    """What the stand-in answers next: ``error`` (status, error type) when set, else
    ``calls`` (name, input) when it returns any, else ``reply``'s text."""

    reply: Callable[[dict[str, Any]], str] = lambda body: ANSWER
    calls: Callable[[dict[str, Any]], list[tuple[str, dict[str, Any]]]] = _no_calls
    error: tuple[int, str] | None = None
    break_after: int | None = None  # drop the connection after this many stream events


def error(status: int, type_: str, message: str) -> JSONResponse:
    """An Anthropic error response."""
    return JSONResponse({"type": "error", "error": {"type": type_, "message": message}}, status)


def _prompt_tokens(body: dict[str, Any]) -> int:
    return len(tokens(json.dumps([body.get("system"), body.get("messages"), body.get("tools")])))


def _sse(obj: dict[str, Any]) -> str:
    return f"event: {obj['type']}\ndata: {json.dumps(obj)}\n\n"


class AnthropicStandIn:
    """The stand-in's ASGI app, its :class:`Script` and what it saw."""

    def __init__(self, key: str) -> None:
        self.key = key
        self.script = Script()
        self.requests: list[Seen] = []
        self._app = Starlette(
            routes=[
                Route("/v1/messages", self._messages, methods=["POST"]),
                Route("/v1/messages/count_tokens", self._count, methods=["POST"]),
            ]
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._app(scope, receive, send)

    def reset(self, script: Script | None = None) -> Script:
        self.script = script or Script()
        self.requests.clear()
        return self.script

    async def _checked(self, request: Request) -> dict[str, Any] | Response:
        """The request's body once its headers pass, else the error response."""
        body = await request.json()
        self.requests.append(
            Seen(request.url.path, request.url.query, dict(request.headers), body, time.monotonic())
        )
        if request.headers.get("x-api-key") != self.key:
            return error(401, "authentication_error", "invalid x-api-key")
        if not request.headers.get("anthropic-version"):
            return error(400, "invalid_request_error", "anthropic-version: header is required")
        return dict(body)

    async def _count(self, request: Request) -> Response:
        body = await self._checked(request)
        if isinstance(body, Response):
            return body
        try:
            CountTokensRequest.model_validate(body)
        except ValidationError as exc:
            return error(400, "invalid_request_error", str(exc.errors()[0]["msg"]))
        return JSONResponse({"input_tokens": _prompt_tokens(body)})

    async def _messages(self, request: Request) -> Response:
        body = await self._checked(request)
        if isinstance(body, Response):
            return body
        try:
            req = MessagesRequest.model_validate(body)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            return error(400, "invalid_request_error", f"{where}: {first['msg']}")
        if self.script.error is not None:
            status, kind = self.script.error
            return error(status, kind, f"scripted {kind}")
        calls = self.script.calls(body)
        blocks: list[dict[str, Any]] = [
            {"type": "tool_use", "id": f"toolu_{uuid.uuid4().hex[:20]}", "name": n, "input": i}
            for n, i in calls
        ]
        stop = "tool_use" if calls else "end_turn"
        if not calls:
            words = tokens(self.script.reply(body))
            if len(words) > req.max_tokens:
                words, stop = words[: req.max_tokens], "max_tokens"
            blocks = [{"type": "text", "text": "".join(words)}]
        usage = {
            "input_tokens": _prompt_tokens(body),
            "output_tokens": sum(len(tokens(json.dumps(b))) for b in blocks),
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
        }
        message = {
            "id": f"msg_{uuid.uuid4().hex[:24]}",
            "type": "message",
            "role": "assistant",
            "model": req.model,
            "content": blocks,
            "stop_reason": stop,
            "stop_sequence": None,
            "usage": usage,
        }
        if not req.stream:
            return JSONResponse(message)
        return StreamingResponse(self._events(message), media_type="text/event-stream")

    async def _events(self, message: dict[str, Any]) -> AsyncIterator[str]:
        limit = self.script.break_after
        for sent, event in enumerate(self._sequence(message)):
            if sent == limit:
                raise BrokenStream("the stand-in drops the connection mid-stream")
            yield event

    def _sequence(self, message: dict[str, Any]) -> Iterator[str]:
        usage = message["usage"]
        start = {
            **message,
            "content": [],
            "stop_reason": None,
            "usage": {**usage, "output_tokens": 1},
        }
        yield _sse({"type": "message_start", "message": start})
        yield _sse({"type": "ping"})
        for index, block in enumerate(message["content"]):
            if block["type"] == "text":
                opening: dict[str, Any] = {"type": "text", "text": ""}
                words = tokens(block["text"])
                deltas = [{"type": "text_delta", "text": w} for w in words]
            else:
                opening = {**block, "input": {}}
                text = json.dumps(block["input"])
                half = len(text) // 2
                deltas = [
                    {"type": "input_json_delta", "partial_json": part}
                    for part in (text[:half], text[half:])
                ]
            yield _sse({"type": "content_block_start", "index": index, "content_block": opening})
            for delta in deltas:
                yield _sse({"type": "content_block_delta", "index": index, "delta": delta})
            yield _sse({"type": "content_block_stop", "index": index})
        yield _sse(
            {
                "type": "message_delta",
                "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
                "usage": {"output_tokens": usage["output_tokens"]},
            }
        )
        yield _sse({"type": "message_stop"})
