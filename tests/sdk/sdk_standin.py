"""A stand-in OpenAI-compatible server for SDK tests, speaking the wire format exactly.

It answers ``/v1/chat/completions`` and ``/v1/completions`` (JSON and SSE, with usage
including accepted/rejected prediction tokens), ``/v1/models`` and the gateway's
``/v1/documents`` API. What it answers and how a stream misbehaves is set per test
through :class:`Script`. Token counts are the stand-in's own (words and punctuation),
prediction tokens are counted as the predicted tokens that appear, in order, in the answer.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import re
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from sdk.wire import ChatCompletionRequest, CompletionRequest, DocumentIn
from sdk.wire.endpoints import AuditRequest


def tokens(text: str) -> list[str]:
    """The stand-in's tokens: runs of word characters, single other characters, whitespace."""
    return re.findall(r"\w+|\s+|[^\w\s]", text)


@dataclass
class Script:
    """What the stand-in does for the next requests."""

    reply: Callable[[dict[str, Any]], str] = lambda body: "Hello there."
    break_after: int | None = None  # drop the connection after this many content chunks
    error_after: int | None = None  # send an in-stream error event after this many chunks
    requests: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)


class BrokenStream(Exception):
    """Raised inside a streaming body so the server drops the connection mid-stream."""


def error(status: int, message: str, type_: str, code: str | None = None) -> JSONResponse:
    return JSONResponse(
        {"error": {"message": message, "type": type_, "code": code, "param": None}}, status
    )


def _usage(prompt: str, answer: str, prediction: str | None) -> dict[str, Any]:
    completion = tokens(answer)
    usage: dict[str, Any] = {
        "prompt_tokens": len(tokens(prompt)),
        "completion_tokens": len(completion),
        "total_tokens": len(tokens(prompt)) + len(completion),
    }
    if prediction is not None:
        predicted = tokens(prediction)
        matcher = difflib.SequenceMatcher(None, predicted, completion, autojunk=False)
        accepted = sum(block.size for block in matcher.get_matching_blocks())
        usage["completion_tokens_details"] = {
            "accepted_prediction_tokens": accepted,
            "rejected_prediction_tokens": len(predicted) - accepted,
            "reasoning_tokens": 0,
        }
    return usage


def create_standin() -> Starlette:
    """The stand-in app; ``app.state.script`` controls it, ``app.state.documents`` holds documents."""

    async def read(request: Request, model: type[Any]) -> tuple[dict[str, Any], Any]:
        script: Script = request.app.state.script
        body = await request.json()
        script.requests.append(body)
        script.headers.append(dict(request.headers))
        return body, model.model_validate(body)

    async def chat(request: Request) -> Response:
        try:
            body, req = await read(request, ChatCompletionRequest)
        except ValidationError as exc:
            return error(400, str(exc.errors()[0]["msg"]), "invalid_request_error")
        prompt = "\n".join(m.text() for m in req.messages)
        prediction = req.prediction.text() if req.prediction else None
        return answer(request, body, req, prompt, prediction, chat=True)

    async def completions(request: Request) -> Response:
        try:
            body, req = await read(request, CompletionRequest)
        except ValidationError as exc:
            return error(400, str(exc.errors()[0]["msg"]), "invalid_request_error")
        return answer(request, body, req, str(req.prompt), None, chat=False)

    def answer(
        request: Request,
        body: dict[str, Any],
        req: Any,
        prompt: str,
        prediction: str | None,
        chat: bool,
    ) -> Response:
        script: Script = request.app.state.script
        text = script.reply(body)
        finish = "stop"
        limit = req.token_limit() if chat else req.max_tokens
        if limit is not None and len(tokens(text)) > limit:
            text, finish = "".join(tokens(text)[:limit]), "length"
        usage = _usage(prompt, text, prediction)
        common = {"id": "cmpl-standin", "created": int(time.time()), "model": req.model}
        if not req.stream:
            if chat:
                choice: dict[str, Any] = {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": finish,
                    "logprobs": None,
                }
                return JSONResponse(
                    {**common, "object": "chat.completion", "choices": [choice], "usage": usage}
                )
            choice = {"index": 0, "text": text, "finish_reason": finish, "logprobs": None}
            return JSONResponse(
                {**common, "object": "text_completion", "choices": [choice], "usage": usage}
            )
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        events = _events(common, text, finish, usage if include_usage else None, chat, script)
        return StreamingResponse(events, media_type="text/event-stream")

    async def models(request: Request) -> Response:
        return JSONResponse(
            {
                "object": "list",
                "data": [{"id": "standin", "object": "model", "created": 0, "owned_by": "test"}],
            }
        )

    async def put_document(request: Request) -> Response:
        try:
            doc = DocumentIn.model_validate(await request.json())
        except ValidationError as exc:
            return error(400, str(exc.errors()[0]["msg"]), "invalid_request_error")
        now = time.time()
        info = {
            "id": doc.id,
            "bytes": len(doc.text.encode()),
            "sha256": hashlib.sha256(doc.text.encode()).hexdigest(),
            "path": doc.path,
            "language": doc.language,
            "created": now,
            "last_used": now,
        }
        request.app.state.documents[doc.id] = (info, doc.text)
        return JSONResponse(info)

    async def list_documents(request: Request) -> Response:
        infos = [info for info, _ in request.app.state.documents.values()]
        return JSONResponse({"object": "list", "data": infos})

    async def one_document(request: Request) -> Response:
        doc_id = request.path_params["id"]
        stored = request.app.state.documents.get(doc_id)
        if stored is None:
            return error(404, f"no document {doc_id!r}", "not_found_error", "document_not_found")
        if request.method == "DELETE":
            del request.app.state.documents[doc_id]
            return JSONResponse({"id": doc_id, "object": "document", "deleted": True})
        info, text = stored
        return JSONResponse({**info, "text": text})

    async def endpoints(request: Request) -> Response:
        record = {
            "name": "standin",
            "kind": "openai_compatible",
            "models": ["standin"],
            "enabled": "unknown",
        }
        return JSONResponse({"object": "list", "data": [record]})

    async def audits(request: Request) -> Response:
        try:
            audit = AuditRequest.model_validate(await request.json())
        except ValidationError as exc:
            return error(400, str(exc.errors()[0]["msg"]), "invalid_request_error")
        if audit.endpoint != "standin":
            return error(404, f"no endpoint {audit.endpoint!r}", "not_found_error")
        now = time.time()
        plan = {
            "endpoint": audit.endpoint,
            "kind": "openai_compatible",
            "model": "standin",
            "workload_items": 1,
            "requests_per_config": audit.requests or 1,
            "concurrency": audit.concurrency,
            "temperature": audit.temperature,
        }
        evidence = {
            "kind": "measured",
            "source": "audit",
            "verdict": "unknown",
            "detail": "no pairs",
            "observed_at": now,
        }
        sections = ("levels", "groups", "speedup", "break_even", "quality", "lossless", "languages")
        summary = {
            "plan": plan,
            "formulas": {},
            **{name: [] for name in sections},
            "requests": 0,
            "measured_evidence": evidence,
        }
        return JSONResponse(
            {
                "endpoint": audit.endpoint,
                "model": "standin",
                "started_at": now,
                "finished_at": now,
                "summary": summary,
            }
        )

    app = Starlette(
        routes=[
            Route("/v1/endpoints", endpoints),
            Route("/v1/audits", audits, methods=["POST"]),
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/v1/completions", completions, methods=["POST"]),
            Route("/v1/models", models),
            Route("/v1/documents", put_document, methods=["POST"]),
            Route("/v1/documents", list_documents, methods=["GET"]),
            Route("/v1/documents/{id:path}", one_document, methods=["GET", "DELETE"]),
        ]
    )
    app.state.script = Script()
    app.state.documents = {}
    return app


async def _events(
    common: dict[str, Any],
    text: str,
    finish: str,
    usage: dict[str, Any] | None,
    chat: bool,
    script: Script,
) -> AsyncIterator[str]:
    obj = "chat.completion.chunk" if chat else "text_completion"

    def event(choices: list[dict[str, Any]], **extra: Any) -> str:
        return f"data: {json.dumps({**common, 'object': obj, 'choices': choices, **extra})}\n\n"

    def piece(content: str | None, finish_reason: str | None, role: bool = False) -> dict[str, Any]:
        if not chat:
            return {
                "index": 0,
                "text": content or "",
                "finish_reason": finish_reason,
                "logprobs": None,
            }
        delta: dict[str, Any] = {"role": "assistant", "content": ""} if role else {}
        if content is not None:
            delta["content"] = content
        return {"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}

    if chat:
        yield event([piece(None, None, role=True)])
    for n, tok in enumerate(tokens(text)):
        if script.break_after is not None and n == script.break_after:
            raise BrokenStream("the stand-in drops the connection mid-stream")
        if script.error_after is not None and n == script.error_after:
            err = {
                "message": "upstream failed mid-stream",
                "type": "upstream_error",
                "code": "upstream_stream_broken",
            }
            yield f"data: {json.dumps({'error': err})}\n\n"
            return
        yield event([piece(tok, None)])
    yield event([piece(None if chat else "", finish)])
    if usage is not None:
        yield event([], usage=usage)
    yield "data: [DONE]\n\n"
