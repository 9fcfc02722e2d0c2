"""A chat-completions event stream as a Messages event stream.

In: ``data:`` events of ``chat.completion.chunk`` objects (text in ``delta.content``,
calls in ``delta.tool_calls``, the finish reason, a usage chunk), ``data: [DONE]``, or
an error event (``{"error": {...}}``). Out, in Anthropic's order: ``message_start`` and a
``ping``; per block ``content_block_start``, ``content_block_delta`` (``text_delta`` or
``input_json_delta``) and ``content_block_stop``; at ``[DONE]`` a ``message_delta`` with
the stop reason and the whole usage, then ``message_stop``. ``message_start``'s usage
holds the prompt's tokens where the endpoint counted them before answering (local and
remotely verified endpoints; 0 where only the final usage has them). An error event in,
or a stream that ends before ``[DONE]``, is an ``error`` event out and the end of the
stream.

A block is open until another begins: text after a call opens a new text block. Calls
are streamed one after the other (as OpenAI and every chat-completions server send
them); a fragment of a call whose block was already closed is an error, never glued onto
another call.
"""

from __future__ import annotations

import uuid
from typing import Any

import orjson
from pydantic import BaseModel

from gateway.apis.anthropic import errors
from gateway.apis.anthropic.response import stop_reason, usage
from sdk.wire import (
    ContentBlockDelta,
    ContentBlockStart,
    ContentBlockStop,
    InputJSONDelta,
    MessageDelta,
    MessageDeltaBody,
    MessagesResponse,
    MessageStart,
    MessageStop,
    MessagesUsage,
    Ping,
    TextBlock,
    TextDelta,
    ToolUseBlock,
)

_DONE = b"[DONE]"
# an OpenAI error type's status, for the Anthropic error type of a mid-stream error
_STATUS_OF = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "permission_error": 403,
    "rate_limit_error": 429,
}


def event(obj: BaseModel, extra: dict[str, Any] | None = None) -> bytes:
    """One server-sent event: ``event: <type>`` and the object as ``data``."""
    data = obj.model_dump(mode="json")
    if extra:
        data.update(extra)
    name: str = data["type"]
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


def error_event(status: int, message: str) -> bytes:
    """Anthropic's ``error`` event for a failure of ``status``'s kind."""
    return b"event: error\ndata: " + errors.body(status, message) + b"\n\n"


class StreamTranscoder:
    """Turns the internal stream's bytes into Messages events (:meth:`feed`, then
    :meth:`close` once the internal stream ended)."""

    def __init__(
        self, model: str, stops: list[str], prompt: int | None = None, cached: int = 0
    ) -> None:
        self.model = model
        self.stops = stops
        self.prompt = prompt  # the prompt's tokens when known at the start, ``cached`` of them
        self.cached = cached  # from a prefix cache
        self.id = "msg_" + uuid.uuid4().hex
        self.finished = False  # message_stop or an error event went out
        self._started = False
        self._pending = b""
        self._index = -1  # the open block's index (-1: none yet)
        self._open: str | int | None = None  # "text", a call's index, or None
        self._calls: set[int] = set()  # calls whose block was opened
        self._finish: Any = None
        self._choice: dict[str, Any] = {}
        self._usage: Any = None
        self._draftgate: Any = None

    def start(self) -> bytes:
        """``message_start`` (with the prompt's usage when known, as the final usage counts
        it) and a ``ping`` (once)."""
        if self._started:
            return b""
        self._started = True
        start = MessagesUsage()
        if self.prompt is not None:
            start.input_tokens = max(self.prompt - self.cached, 0)
            start.cache_read_input_tokens = self.cached
        head = MessagesResponse(id=self.id, model=self.model, content=[], usage=start)
        return event(MessageStart(message=head)) + event(Ping())

    def feed(self, chunk: bytes) -> bytes:
        """The Messages events for the whole internal events ``chunk`` completes."""
        if self.finished:
            return b""
        data = self._pending + chunk
        cut = max(data.rfind(b"\n\n"), data.rfind(b"\r\n\r\n"))
        if cut < 0:
            self._pending = data
            return b""
        end = cut + (4 if data[cut : cut + 4] == b"\r\n\r\n" else 2)
        self._pending = data[end:]
        out: list[bytes] = []
        for line in data[:end].splitlines():
            if line.startswith(b"data:") and not self.finished:
                out.append(self._data(line[5:].strip()))
        return b"".join(out)

    def close(self) -> bytes:
        """What ends the stream when the internal one ended: an error event unless the
        answer was complete."""
        if self.finished:
            return b""
        self.finished = True
        return self.start() + error_event(502, "the answer ended before it was complete")

    def _data(self, data: bytes) -> bytes:
        if data == _DONE:
            return self._end()
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            return b""
        if not isinstance(obj, dict):
            return b""
        out = self.start()
        if "error" in obj:
            return out + self._error(obj["error"])
        if obj.get("usage"):
            self._usage = obj["usage"]
        if "draftgate" in obj:
            self._draftgate = obj["draftgate"]
        for choice in obj.get("choices") or ():
            if isinstance(choice, dict) and choice.get("index", 0) == 0:
                out += self._choice_delta(choice)
        return out

    def _choice_delta(self, choice: dict[str, Any]) -> bytes:
        out = b""
        delta = choice.get("delta") or {}
        text = delta.get("content")
        if isinstance(text, str) and text:
            if self._open != "text":
                out += self._begin("text", TextBlock(text=""))
            out += event(ContentBlockDelta(index=self._index, delta=TextDelta(text=text)))
        for call in delta.get("tool_calls") or ():
            out += self._call_delta(call)
        if choice.get("finish_reason") is not None:
            self._finish = choice["finish_reason"]
            self._choice = choice
        return out

    def _call_delta(self, call: dict[str, Any]) -> bytes:
        out = b""
        index = call.get("index", 0)
        function = call.get("function") or {}
        if self._open != index:
            if index in self._calls:
                return self._error({"message": "a tool call's arguments came interleaved"})
            self._calls.add(index)
            block = ToolUseBlock(
                id=str(call.get("id") or ""), name=str(function.get("name") or ""), input={}
            )
            out += self._begin(index, block)
        arguments = function.get("arguments")
        if isinstance(arguments, str) and arguments:
            delta = InputJSONDelta(partial_json=arguments)
            out += event(ContentBlockDelta(index=self._index, delta=delta))
        return out

    def _begin(self, key: str | int, block: TextBlock | ToolUseBlock) -> bytes:
        out = self._stop_block()
        self._index += 1
        self._open = key
        return out + event(ContentBlockStart(index=self._index, content_block=block))

    def _stop_block(self) -> bytes:
        if self._open is None:
            return b""
        self._open = None
        return event(ContentBlockStop(index=self._index))

    def _end(self) -> bytes:
        out = self.start() + self._stop_block()
        reason, sequence = stop_reason(self._finish, self._choice, self.stops, bool(self._calls))
        body = MessageDeltaBody(stop_reason=reason, stop_sequence=sequence)
        extra = None if self._draftgate is None else {"draftgate": self._draftgate}
        out += event(MessageDelta(delta=body, usage=usage(self._usage)), extra)
        self.finished = True
        return out + event(MessageStop())

    def _error(self, detail: Any) -> bytes:
        self.finished = True
        message = detail.get("message") if isinstance(detail, dict) else None
        kind = detail.get("type") if isinstance(detail, dict) else None
        status = _STATUS_OF.get(kind, 500) if isinstance(kind, str) else 500
        return error_event(status, str(message or "the answer failed"))
