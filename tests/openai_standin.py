"""The tests' one stand-in OpenAI server, speaking OpenAI's wire format exactly.

It stands in for provider behaviour unreachable from here. ``POST /v1/chat/completions``
and ``POST /v1/completions`` answer as JSON or as server-sent events (chat: a role chunk;
then content chunks, a finish chunk, a usage chunk when ``stream_options.include_usage``
asks, each chunk carrying ``"usage": null`` then, and ``data: [DONE]``), with usage in
OpenAI's shape including Predicted Outputs' accepted/rejected prediction tokens, and a
prompt seen before reported as cached (``prompt_tokens_details.cached_tokens``).
Azure OpenAI's deployment paths answer the same. ``GET /v1/models`` lists ``standin``; draftgate's own API is there for clients that talk
to a gateway: ``/v1/documents`` (put, list, get, delete), ``GET /v1/endpoints`` and
``POST /v1/audits`` (minimal answers).

What it answers is set per test on :class:`Script` (the default reply is the prompt's
fenced code block, a JSON object when the prompt asks for JSON, else :data:`ANSWER`;
``Script.calls`` makes it answer with tool calls instead, streamed as OpenAI streams
them: the call's id and name first, its arguments in two pieces).
Tokens are the stand-in's own (:func:`tokens`). A prediction it honours is matched
against the answer (difflib's matching blocks): matched tokens are accepted, the other
predicted tokens rejected, and with ``draft_per_step`` a stream carries runs of accepted
tokens several per chunk, as a server that speculates does.

The model name of a request picks a provider failure:

- ``ignores-prediction``: like vLLM, accepts ``prediction`` and ignores it (no token
  details in usage);
- ``rate-limited-once``: 429 with ``Retry-After: 1`` on a request's first try, then ok;
  ``always-429``: 429 with ``retry-after-ms: 10`` every time;
- ``unavailable-once``: 503 on the first try, then ok; ``always-500``: 500;
- ``bad-request``: 400 naming ``temperature``; ``leaky-401``: 401 whose message contains
  the credential it was sent;
- ``stream-cut``: streams two content chunks, then drops the connection;
- ``slow-stream``: a chunk every 50 ms for up to a minute; ``cancelled`` is set when the
  client goes away; ``slow-headers``: waits 2 s before answering.

Every completion request is logged (path, query, headers, JSON body) in ``requests``.
"""

from __future__ import annotations

import asyncio
import difflib
import hashlib
import json
import re
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from sdk.wire import ChatCompletionRequest, CompletionRequest, DocumentIn
from sdk.wire.endpoints import AuditRequest

ANSWER = "Hello there."
JSON_ANSWER = '{"name": "Anna Berg", "city": "Malmo"}'
AZURE = "/openai/deployments/{deployment}"  # Azure OpenAI's paths, same wire format
_FENCE = re.compile(r"```[A-Za-z]*\n.*?```", re.S)


def tokens(text: str) -> list[str]:
    """The stand-in's tokens: runs of word characters, single other characters, whitespace."""
    return re.findall(r"\w+|\s+|[^\w\s]", text)


def prompt_text(body: dict[str, Any]) -> str:
    """The last message's text (chat) or the prompt (completions)."""
    if "messages" in body:
        content = body["messages"][-1].get("content") or ""
        if isinstance(content, list):
            return "".join(part.get("text", "") for part in content)
        return str(content)
    return str(body.get("prompt", ""))


def default_reply(body: dict[str, Any]) -> str:
    """The prompt's fenced code block, a JSON object when asked for JSON, else ``ANSWER``."""
    prompt = prompt_text(body)
    block = _FENCE.search(prompt)
    if block:
        return block.group(0)
    if "JSON" in prompt:
        return JSON_ANSWER
    return ANSWER


@dataclass
class Script:
    """What the stand-in answers, and how it misbehaves, for the next requests."""

    reply: Callable[[dict[str, Any]], str] = default_reply
    speculative: bool = True  # honour ``prediction`` (False: ignore it, like vLLM)
    step_s: float = 0.0  # seconds per decoding step (one chunk)
    draft_per_step: int = 0  # accepted tokens a step may add after its first token
    break_after: int | None = None  # drop the connection after this many content chunks
    error_after: int | None = None  # an in-stream error event after this many content chunks
    http_error_every: int = 0  # every n-th request answers 503
    stream_error_every: int = 0  # every n-th request's stream ends half-way in an error event
    # the tool calls to answer a request with, as (name, arguments); none: a text reply
    calls: Callable[[dict[str, Any]], list[tuple[str, dict[str, Any]]]] = lambda body: []


@dataclass
class Seen:
    """One request as the stand-in received it."""

    path: str
    query: str
    headers: dict[str, str]
    body: dict[str, Any]
    at: float


class BrokenStream(Exception):
    """Raised inside a streaming body so the server drops the connection mid-stream."""


def error(
    status: int,
    message: str,
    type_: str,
    code: str | None = None,
    *,
    param: str | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    """An OpenAI error response."""
    body = {"error": {"message": message, "type": type_, "param": param, "code": code}}
    return JSONResponse(body, status, headers=headers)


STREAM_ERROR = {
    "message": "upstream failed mid-stream",
    "type": "server_error",
    "code": "upstream_stream_broken",
}


def _accepted(answer: list[str], prediction: list[str]) -> set[int]:
    """Positions of the answer's tokens that the prediction matched."""
    matcher = difflib.SequenceMatcher(None, prediction, answer, autojunk=False)
    return {b.b + i for b in matcher.get_matching_blocks() for i in range(b.size)}


def _steps(answer: list[str], accepted: set[int], draft_per_step: int) -> list[str]:
    """The answer cut into chunks: one token, plus up to ``draft_per_step`` accepted ones."""
    steps: list[str] = []
    i = 0
    while i < len(answer):
        size = 1
        while size <= draft_per_step and i + size < len(answer) and i + size in accepted:
            size += 1
        steps.append("".join(answer[i : i + size]))
        i += size
    return steps


class StandIn:
    """The stand-in's ASGI app, its :class:`Script` and what it saw."""

    def __init__(self, script: Script | None = None) -> None:
        self.script = script or Script()
        self.requests: list[Seen] = []
        self.tries: dict[str, int] = {}
        self.documents: dict[str, tuple[dict[str, Any], str]] = {}
        self.cancelled = threading.Event()
        self.slow_started = threading.Event()
        self._prompts: set[str] = set()  # prompt texts answered (a repeat is a cache hit)
        self._app = Starlette(
            routes=[
                Route("/v1/chat/completions", self._chat, methods=["POST"]),
                Route("/v1/completions", self._completions, methods=["POST"]),
                Route(f"{AZURE}/chat/completions", self._chat, methods=["POST"]),
                Route(f"{AZURE}/completions", self._completions, methods=["POST"]),
                Route("/v1/models", self._models),
                Route("/v1/documents", self._put_document, methods=["POST"]),
                Route("/v1/documents", self._list_documents, methods=["GET"]),
                Route("/v1/documents/{id:path}", self._one_document, methods=["GET", "DELETE"]),
                Route("/v1/endpoints", self._endpoints),
                Route("/v1/audits", self._audits, methods=["POST"]),
            ]
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._app(scope, receive, send)

    def reset(self, script: Script | None = None) -> Script:
        """Forget what was seen and stored; follow ``script`` (default: a fresh one)."""
        self.script = script or Script()
        self.requests.clear()
        self.tries.clear()
        self.documents.clear()
        self.cancelled.clear()
        self.slow_started.clear()
        return self.script

    def bodies(self) -> list[dict[str, Any]]:
        """The JSON bodies of the completion requests seen, in order."""
        return [seen.body for seen in self.requests]

    def retry_gap_s(self) -> float:
        """Seconds between the last two requests (how long the client waited to retry)."""
        return self.requests[-1].at - self.requests[-2].at

    # -- completions -------------------------------------------------------------------

    async def _chat(self, request: Request) -> Response:
        return await self._complete(request, chat=True)

    async def _completions(self, request: Request) -> Response:
        return await self._complete(request, chat=False)

    async def _complete(self, request: Request, *, chat: bool) -> Response:
        body = await request.json()
        headers = dict(request.headers)
        self.requests.append(
            Seen(request.url.path, request.url.query, headers, body, time.monotonic())
        )
        try:
            req: Any = (ChatCompletionRequest if chat else CompletionRequest).model_validate(body)
        except ValidationError as exc:
            return error(400, str(exc.errors()[0]["msg"]), "invalid_request_error")
        model = req.model
        key = json.dumps(body.get("messages") or body.get("prompt"), sort_keys=True) + model
        attempt = self.tries[key] = self.tries.get(key, 0) + 1
        failure = await self._failure(model, attempt, headers)
        if failure is not None:
            return failure
        script = self.script
        n = len(self.requests)
        if script.http_error_every and n % script.http_error_every == 0:
            return error(503, "overloaded", "server_error", "overloaded")

        calls = [
            {
                "id": f"call_standin_{n}_{i}",
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(arguments)},
            }
            for i, (name, arguments) in enumerate(script.calls(body) if chat else ())
        ]
        answer = [] if calls else tokens(script.reply(body))
        finish = "tool_calls" if calls else "stop"
        limit = req.token_limit() if chat else req.max_tokens
        if limit is not None and len(answer) > limit:
            answer, finish = answer[:limit], "length"
        honours = script.speculative and model != "ignores-prediction"
        draft_on = (body.get("draftgate") or {}).get("draft", True) is not False
        prediction = body.get("prediction") if honours and draft_on else None
        predicted = tokens(prediction["content"]) if isinstance(prediction, dict) else None
        accepted = _accepted(answer, predicted) if predicted else set()
        text = prompt_text(body)
        prompt_tokens = len(tokens(text))
        cached = prompt_tokens if text in self._prompts else 0
        self._prompts.add(text)
        usage: dict[str, Any] = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": len(answer) + len(calls),
            "total_tokens": prompt_tokens + len(answer) + len(calls),
        }
        if honours:
            usage["prompt_tokens_details"] = {"cached_tokens": cached, "audio_tokens": 0}
            usage["completion_tokens_details"] = {
                "reasoning_tokens": 0,
                "audio_tokens": 0,
                "accepted_prediction_tokens": len(accepted),
                "rejected_prediction_tokens": len(predicted or []) - len(accepted),
            }
        steps = _steps(answer, accepted, script.draft_per_step)
        head = {
            "id": f"{'chatcmpl' if chat else 'cmpl'}-standin-{n}",
            "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()),
            "model": model,
            "system_fingerprint": "fp_standin",
        }
        if model == "slow-headers":
            await asyncio.sleep(2.0)
        if not req.stream:
            if script.step_s:
                await asyncio.sleep(script.step_s * len(steps))
            text = "".join(answer)
            if chat:
                content = None if calls else text
                message: dict[str, Any] = {
                    "role": "assistant",
                    "content": content,
                    "refusal": None,
                }
                if calls:
                    message["tool_calls"] = calls
                choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": finish}
            else:
                choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
            return JSONResponse({**head, "choices": [choice], "usage": usage})
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        if chat:
            head["object"] = "chat.completion.chunk"
        if model == "slow-stream":
            events = self._slow(head, chat)
        else:
            events = self._events(
                head, steps, finish, usage if include_usage else None, chat, n, calls
            )
        return StreamingResponse(events, media_type="text/event-stream; charset=utf-8")

    async def _failure(self, model: str, attempt: int, headers: dict[str, str]) -> Response | None:
        if model == "rate-limited-once" and attempt == 1:
            return error(
                429,
                "Rate limit reached",
                "rate_limit_error",
                "rate_limit_exceeded",
                headers={"retry-after": "1"},
            )
        if model == "always-429":
            return error(
                429,
                "Rate limit reached",
                "rate_limit_error",
                "rate_limit_exceeded",
                headers={"retry-after-ms": "10", "retry-after": "1"},
            )
        if model == "unavailable-once" and attempt == 1:
            return error(503, "The server is overloaded", "server_error", "server_error")
        if model == "always-500":
            return error(500, "The server had an error", "server_error", "server_error")
        if model == "bad-request":
            return error(
                400,
                "Invalid value for 'temperature'",
                "invalid_request_error",
                "invalid_value",
                param="temperature",
            )
        if model == "leaky-401":
            sent = headers.get("authorization", "")
            return error(
                401,
                f"Incorrect API key provided: {sent}",
                "invalid_request_error",
                "invalid_api_key",
            )
        return None

    def _chunk(
        self,
        head: dict[str, Any],
        chat: bool,
        content: str | None,
        finish: str | None = None,
        *,
        role: bool = False,
        usage: bool = False,
    ) -> str:
        if chat:
            delta: dict[str, Any] = (
                {"role": "assistant", "content": "", "refusal": None}
                if role
                else ({} if content is None else {"content": content})
            )
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": content or "", "logprobs": None, "finish_reason": finish}
        obj: dict[str, Any] = {**head, "choices": [choice]}
        if usage:
            obj["usage"] = None
        return f"data: {json.dumps(obj)}\n\n"

    async def _events(
        self,
        head: dict[str, Any],
        steps: list[str],
        finish: str,
        usage: dict[str, Any] | None,
        chat: bool,
        n: int,
        calls: list[dict[str, Any]],
    ) -> AsyncIterator[str]:
        script = self.script
        with_usage = usage is not None
        if chat:
            yield self._chunk(head, chat, None, role=True, usage=with_usage)
        for i, call in enumerate(calls):
            arguments = call["function"]["arguments"]
            half = len(arguments) // 2
            opening = {**call, "function": {"name": call["function"]["name"], "arguments": ""}}
            for part in (
                {**opening, "index": i},
                *self._pieces(i, arguments[:half], arguments[half:]),
            ):
                delta = {"tool_calls": [part]}
                choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}
                yield f"data: {json.dumps({**head, 'choices': [choice]})}\n\n"
        for k, step in enumerate(steps):
            if script.step_s:
                await asyncio.sleep(script.step_s)
            if script.break_after is not None and k == script.break_after:
                raise BrokenStream("the stand-in drops the connection mid-stream")
            broken = script.stream_error_every and n % script.stream_error_every == 0
            if k == script.error_after or (broken and k == len(steps) // 2):
                yield f"data: {json.dumps({'error': STREAM_ERROR})}\n\n"
                return
            yield self._chunk(head, chat, step, usage=with_usage)
            if head["model"] == "stream-cut" and k == 1:
                raise BrokenStream("the stand-in drops the connection mid-stream")
        yield self._chunk(head, chat, None if chat else "", finish, usage=with_usage)
        if usage is not None:
            yield f"data: {json.dumps({**head, 'choices': [], 'usage': usage})}\n\n"
        yield "data: [DONE]\n\n"

    @staticmethod
    def _pieces(index: int, *pieces: str) -> list[dict[str, Any]]:
        """Argument fragments of call ``index`` as ``tool_calls`` delta entries."""
        return [{"index": index, "function": {"arguments": piece}} for piece in pieces]

    async def _slow(self, head: dict[str, Any], chat: bool) -> AsyncIterator[str]:
        """A tick every 50 ms; the client going away (the generator closed early) is seen."""
        self.slow_started.set()
        finished = False
        try:
            if chat:
                yield self._chunk(head, chat, None, role=True)
            for _ in range(1200):
                yield self._chunk(head, chat, "tick ")
                await asyncio.sleep(0.05)
            finished = True
        finally:
            if not finished:
                self.cancelled.set()

    # -- models and draftgate's API ----------------------------------------------------

    async def _models(self, request: Request) -> Response:
        model = {"id": "standin", "object": "model", "created": 0, "owned_by": "standin"}
        return JSONResponse({"object": "list", "data": [model]})

    async def _put_document(self, request: Request) -> Response:
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
        self.documents[doc.id] = (info, doc.text)
        return JSONResponse(info, 201)

    async def _list_documents(self, request: Request) -> Response:
        infos = [info for info, _ in self.documents.values()]
        return JSONResponse({"object": "list", "data": infos})

    async def _one_document(self, request: Request) -> Response:
        doc_id = request.path_params["id"]
        stored = self.documents.get(doc_id)
        if stored is None:
            return error(404, f"no document {doc_id!r}", "invalid_request_error", "not_found")
        if request.method == "DELETE":
            del self.documents[doc_id]
            return JSONResponse({"id": doc_id, "object": "document", "deleted": True})
        info, text = stored
        return JSONResponse({**info, "text": text})

    async def _endpoints(self, request: Request) -> Response:
        record = {
            "name": "standin",
            "kind": "openai_compatible",
            "models": ["standin"],
            "enabled": "unknown",
        }
        return JSONResponse({"object": "list", "data": [record]})

    async def _audits(self, request: Request) -> Response:
        try:
            audit = AuditRequest.model_validate(await request.json())
        except ValidationError as exc:
            return error(400, str(exc.errors()[0]["msg"]), "invalid_request_error")
        if audit.endpoint != "standin":
            return error(404, f"no endpoint {audit.endpoint!r}", "invalid_request_error")
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
