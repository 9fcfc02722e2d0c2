"""A stand-in upstream that speaks OpenAI's Chat Completions / Completions wire format.

It stands in for provider behaviour unreachable from here. The upstream model name
picks the behaviour:

- ``ok-*``: answers; with ``prediction`` the answer is the prediction text and usage
  reports every prediction word as accepted (OpenAI's usage fields);
- ``ignores-prediction``: like vLLM, accepts and ignores ``prediction``, no
  prediction usage fields;
- ``rate-limited-once``: 429 with ``Retry-After: 1`` on a request's first try, then ok;
  ``always-429``: 429 with ``retry-after-ms: 10`` every time;
- ``unavailable-once``: 503 on the first try, then ok; ``always-500``: 500;
- ``bad-request``: 400 with an OpenAI error body; ``leaky-401``: 401 whose message
  contains the credential it was sent;
- ``stream-cut``: streams two chunks then drops the connection;
- ``slow-stream``: one chunk every 50 ms for up to a minute; sets ``cancelled``
  when the client goes away; ``slow-headers``: waits 2 s before answering.

Every request is logged (path, query, headers, JSON body) in ``requests``.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any

ANSWER = "Hello from the stand-in."


@dataclass
class Seen:
    path: str
    query: str
    headers: dict[str, str]
    body: dict[str, Any]
    at: float


def _words(text: str) -> list[str]:
    return text.split(" ")


@dataclass
class StandIn:
    """The stand-in's ASGI app and what it saw."""

    requests: list[Seen] = field(default_factory=list)
    tries: dict[str, int] = field(default_factory=dict)
    cancelled: threading.Event = field(default_factory=threading.Event)
    slow_started: threading.Event = field(default_factory=threading.Event)

    def retry_gap_s(self) -> float:
        """Seconds between the last two requests (how long the client waited to retry)."""
        return self.requests[-1].at - self.requests[-2].at

    def reset(self) -> None:
        self.requests.clear()
        self.tries.clear()
        self.cancelled.clear()
        self.slow_started.clear()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                else:
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        data = json.loads(body) if body else {}
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        self.requests.append(
            Seen(scope["path"], scope["query_string"].decode(), headers, data, time.monotonic())
        )
        await self._answer(data, headers, scope["path"], receive, send)

    async def _answer(
        self, data: dict[str, Any], headers: dict[str, str], path: str, receive: Any, send: Any
    ) -> None:
        model = str(data.get("model", ""))
        key = json.dumps(data.get("messages") or data.get("prompt"), sort_keys=True) + model
        attempt = self.tries[key] = self.tries.get(key, 0) + 1
        if model == "rate-limited-once" and attempt == 1:
            return await _error(
                send, 429, "Rate limit reached", "rate_limit_exceeded", [(b"retry-after", b"1")]
            )
        if model == "always-429":
            wait = [(b"retry-after-ms", b"10"), (b"retry-after", b"1")]
            return await _error(send, 429, "Rate limit reached", "rate_limit_exceeded", wait)
        if model == "unavailable-once" and attempt == 1:
            return await _error(send, 503, "The server is overloaded", "server_error")
        if model == "always-500":
            return await _error(send, 500, "The server had an error", "server_error")
        if model == "bad-request":
            return await _error(
                send, 400, "Invalid value for 'temperature'", "invalid_value", param="temperature"
            )
        if model == "leaky-401":
            sent = headers.get("authorization", "")
            return await _error(send, 401, f"Incorrect API key provided: {sent}", "invalid_api_key")
        if model == "slow-headers":
            await asyncio.sleep(2.0)
        completions = path.endswith("/completions") and not path.endswith("chat/completions")
        prediction = data.get("prediction")
        text = ANSWER
        accepted = rejected = 0
        honours = model != "ignores-prediction"
        if honours and isinstance(prediction, dict) and isinstance(prediction.get("content"), str):
            text = prediction["content"]
            accepted = len(_words(text))
        usage: dict[str, Any] = {
            "prompt_tokens": 11,
            "completion_tokens": len(_words(text)),
            "total_tokens": 11 + len(_words(text)),
            "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
            "completion_tokens_details": {
                "reasoning_tokens": 0,
                "audio_tokens": 0,
                "accepted_prediction_tokens": accepted,
                "rejected_prediction_tokens": rejected,
            },
        }
        if not honours:
            usage.pop("completion_tokens_details")
            usage.pop("prompt_tokens_details")
        if data.get("stream"):
            include_usage = bool((data.get("stream_options") or {}).get("include_usage"))
            return await self._stream(
                model, text, usage if include_usage else None, completions, receive, send
            )
        head = {
            "id": "chatcmpl-standin",
            "created": int(time.time()),
            "model": model,
            "system_fingerprint": "fp_standin",
        }
        if completions:
            obj = {
                **head,
                "object": "text_completion",
                "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": "stop"}],
            }
        else:
            message = {"role": "assistant", "content": text, "refusal": None}
            obj = {
                **head,
                "object": "chat.completion",
                "choices": [
                    {"index": 0, "message": message, "logprobs": None, "finish_reason": "stop"}
                ],
            }
        obj["usage"] = usage
        await _send_json(send, 200, obj)

    async def _stream(
        self,
        model: str,
        text: str,
        usage: dict[str, Any] | None,
        completions: bool,
        receive: Any,
        send: Any,
    ) -> None:
        head = {
            "id": "chatcmpl-standin",
            "object": "text_completion" if completions else "chat.completion.chunk",
            "created": int(time.time()),
            "model": model,
            "system_fingerprint": "fp_standin",
        }

        def chunk(content: str | None, finish: str | None = None, role: bool = False) -> bytes:
            if completions:
                choice: dict[str, Any] = {
                    "index": 0,
                    "text": content or "",
                    "logprobs": None,
                    "finish_reason": finish,
                }
            else:
                delta: dict[str, Any] = (
                    {"role": "assistant", "content": "", "refusal": None}
                    if role
                    else ({} if content is None else {"content": content})
                )
                choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            obj: dict[str, Any] = {**head, "choices": [choice]}
            if usage is not None:
                obj["usage"] = None
            return b"data: " + json.dumps(obj).encode() + b"\n\n"

        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream; charset=utf-8")],
            }
        )

        async def body(data: bytes) -> None:
            await send({"type": "http.response.body", "body": data, "more_body": True})

        if not completions:
            await body(chunk(None, role=True))
        if model == "slow-stream":
            await self._slow(body, chunk, receive)
            return
        words = _words(text)
        for i, word in enumerate(words):
            await body(chunk(word if i == 0 else " " + word))
            if model == "stream-cut" and i == 1:
                raise ConnectionAbortedError("stand-in drops the connection mid-stream")
        await body(chunk(None, finish="stop"))
        if usage is not None:
            await body(
                b"data: " + json.dumps({**head, "choices": [], "usage": usage}).encode() + b"\n\n"
            )
        await body(b"data: [DONE]\n\n")
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _slow(self, body: Any, chunk: Any, receive: Any) -> None:
        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            self.cancelled.set()

        watcher = asyncio.get_running_loop().create_task(watch())
        self.slow_started.set()
        try:
            for _ in range(1200):
                if watcher.done():
                    return
                await body(chunk("tick "))
                await asyncio.sleep(0.05)
        except OSError:
            self.cancelled.set()
        finally:
            watcher.cancel()


async def _send_json(
    send: Any, status: int, obj: Any, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    body = json.dumps(obj).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *(headers or []),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def _error(
    send: Any,
    status: int,
    message: str,
    code: str,
    headers: list[tuple[bytes, bytes]] | None = None,
    param: str | None = None,
) -> None:
    kind = "invalid_request_error" if status < 500 else "server_error"
    await _send_json(
        send,
        status,
        {"error": {"message": message, "type": kind, "param": param, "code": code}},
        headers,
    )
