"""A stand-in OpenAI-compatible server speaking the documented streaming wire format:
role chunk, content chunks, a finish chunk, a usage chunk (``stream_options.include_usage``)
and ``data: [DONE]``. It can emulate speculation (several prediction tokens per step,
accepted/rejected usage fields), ignore ``prediction`` silently, and fail on schedule. Documents are answered as the gateway's ``/v1/documents`` does."""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import time
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

_TOKEN = re.compile(r"\s*\S+|\s+")
_FENCE = re.compile(r"```[A-Za-z]*\n.*?```", re.S)


@dataclass
class Behaviour:
    speculative: bool = True
    step_s: float = 0.002
    draft_per_step: int = 4
    http_error_every: int = 0
    stream_error_every: int = 0
    requests: list[dict[str, Any]] = field(default_factory=list)
    documents: dict[str, str] = field(default_factory=dict)


def answer_for(messages: list[dict[str, Any]]) -> str:
    """A deterministic answer: the prompt's code block, a JSON object, or a sentence."""
    prompt = str(messages[-1].get("content", ""))
    block = _FENCE.search(prompt)
    if block:
        return block.group(0)
    if "JSON" in prompt:
        return '{"name": "Anna Berg", "city": "Malmo"}'
    return "Speculative decoding drafts tokens and verifies them in one pass."


def _tokens(text: str) -> list[str]:
    return _TOKEN.findall(text)


def create_standin(b: Behaviour) -> Starlette:
    async def chat(request: Request) -> Response:
        body = await request.json()
        b.requests.append(body)
        n = len(b.requests)
        if b.http_error_every and n % b.http_error_every == 0:
            return JSONResponse(
                {"error": {"message": "overloaded", "type": "server_error", "code": "overloaded"}},
                status_code=503,
            )
        tokens = _tokens(answer_for(body["messages"]))[: body.get("max_tokens") or 10_000]
        draft_on = (body.get("draftgate") or {}).get("draft", True)
        prediction = (body.get("prediction") or {}).get("content")
        accepted = 0
        if b.speculative and draft_on and prediction:
            predicted = _tokens(prediction)
            while (
                accepted < min(len(tokens), len(predicted))
                and tokens[accepted] == predicted[accepted]
            ):
                accepted += 1
            rejected = len(predicted) - accepted
        steps: list[list[str]] = []
        i = 0
        while i < len(tokens):
            size = 1 + min(b.draft_per_step, max(0, accepted - i)) if i < accepted else 1
            steps.append(tokens[i : i + size])
            i += size
        head = {"id": f"chatcmpl-{n}", "created": int(time.time()), "model": body["model"]}
        usage: dict[str, Any] = {
            "prompt_tokens": 10,
            "completion_tokens": len(tokens),
            "total_tokens": 10 + len(tokens),
        }
        if b.speculative and prediction and draft_on:
            usage["completion_tokens_details"] = {
                "accepted_prediction_tokens": accepted,
                "rejected_prediction_tokens": rejected,
                "reasoning_tokens": 0,
            }

        def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
            obj = {
                **head,
                "object": "chat.completion.chunk",
                "choices": [
                    {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
                ],
            }
            return f"data: {json.dumps(obj)}\n\n".encode()

        if not body.get("stream"):
            await asyncio.sleep(b.step_s * len(steps))
            return JSONResponse(
                {
                    **head,
                    "object": "chat.completion",
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": "".join(tokens)},
                            "finish_reason": "stop",
                            "logprobs": None,
                        }
                    ],
                    "usage": usage,
                }
            )

        async def events():  # type: ignore[no-untyped-def]
            yield chunk({"role": "assistant", "content": ""})
            for k, step in enumerate(steps):
                await asyncio.sleep(b.step_s)
                if b.stream_error_every and n % b.stream_error_every == 0 and k == len(steps) // 2:
                    err = {
                        "error": {
                            "message": "upstream failed",
                            "type": "server_error",
                            "code": "upstream_error",
                        }
                    }
                    yield f"data: {json.dumps(err)}\n\n".encode()
                    return
                yield chunk({"content": "".join(step)})
            yield chunk({}, "stop")
            if (body.get("stream_options") or {}).get("include_usage"):
                obj = {**head, "object": "chat.completion.chunk", "choices": [], "usage": usage}
                yield f"data: {json.dumps(obj)}\n\n".encode()
            yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    async def documents(request: Request) -> Response:
        body = await request.json()
        b.documents[body["id"]] = body["text"]
        data = body["text"].encode()
        info = {
            "id": body["id"],
            "bytes": len(data),
            "sha256": hashlib.sha256(data).hexdigest(),
            "created": time.time(),
            "last_used": time.time(),
        }
        return JSONResponse(info, status_code=201)

    return Starlette(
        routes=[
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/v1/documents", documents, methods=["POST"]),
        ]
    )
