"""A stand-in for a provider that speaks the Responses API itself (OpenAI, Azure OpenAI).

``POST /v1/responses`` (and Azure's ``/openai/responses``, the deployment named by ``model``)
answers :data:`ANSWER` as a response object, or streamed as OpenAI streams it
(``response.created``, ``response.in_progress``, the message item's added / part added /
text deltas / text done / part done / item done, ``response.completed``; each event as
``event:`` and ``data:`` lines, numbered, no ``[DONE]``). Every request is logged (path,
query, headers, JSON body) in ``requests``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

ANSWER = "Hello from a provider's Responses API."


@dataclass
class Seen:
    path: str
    query: str
    headers: dict[str, str]
    body: dict[str, Any]


class ResponsesStandIn:
    """The stand-in's ASGI app and what it saw."""

    def __init__(self) -> None:
        self.requests: list[Seen] = []
        self._app = Starlette(
            routes=[
                Route("/v1/responses", self._create, methods=["POST"]),
                Route("/openai/responses", self._create, methods=["POST"]),
            ]
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._app(scope, receive, send)

    async def _create(self, request: Request) -> Response:
        body = await request.json()
        self.requests.append(Seen(request.url.path, request.url.query, dict(request.headers), body))
        n = len(self.requests)
        message = {
            "id": f"msg_standin_{n}",
            "type": "message",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": ANSWER, "annotations": [], "logprobs": []}],
        }
        response: dict[str, Any] = {
            "id": f"resp_standin_{n}",
            "object": "response",
            "created_at": time.time(),
            "status": "completed",
            "model": body.get("model"),
            "output": [message],
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
            "usage": {
                "input_tokens": 5,
                "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
                "output_tokens": 7,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": 12,
            },
        }
        if not body.get("stream"):
            return JSONResponse(response)
        return StreamingResponse(_events(response, message), media_type="text/event-stream")


def _events(response: dict[str, Any], message: dict[str, Any]) -> Iterator[str]:
    started = {**response, "status": "in_progress", "output": [], "usage": None}
    part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
    where = {"item_id": message["id"], "output_index": 0}
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": started},
        {"type": "response.in_progress", "response": started},
        {
            "type": "response.output_item.added",
            "output_index": 0,
            "item": {**message, "status": "in_progress", "content": []},
        },
        {"type": "response.content_part.added", **where, "content_index": 0, "part": part},
        *(
            {
                "type": "response.output_text.delta",
                **where,
                "content_index": 0,
                "delta": piece,
                "logprobs": [],
            }
            for piece in (ANSWER[:10], ANSWER[10:])
        ),
        {
            "type": "response.output_text.done",
            **where,
            "content_index": 0,
            "text": ANSWER,
            "logprobs": [],
        },
        {
            "type": "response.content_part.done",
            **where,
            "content_index": 0,
            "part": {**part, "text": ANSWER},
        },
        {"type": "response.output_item.done", "output_index": 0, "item": message},
        {"type": "response.completed", "response": response},
    ]
    for number, event in enumerate(events):
        yield f"event: {event['type']}\ndata: {json.dumps({**event, 'sequence_number': number})}\n\n"
