"""The Messages front door (:class:`gateway.front_door.FrontDoor`): a Messages body parsed
into the internal chat request, the endpoint's chat-completions answer sent back as a
Messages answer, errors in Anthropic's shape.

The door knows the routing table, for two facts about the model a request names, from
its endpoints' configuration: the temperature a request without one gets (the first
endpoint's ``messages_temperature``, else Anthropic's 1.0), and whether every endpoint
speaks Messages itself (the ``anthropic`` kind): then what the translation cannot carry
(server tools, PDF documents, ...) is no refusal, since the body goes upstream as sent and
the internal request only sizes the limits."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson
from pydantic import ValidationError
from starlette.types import Message, Send

from gateway.apis.anthropic import errors
from gateway.apis.anthropic.request import ANTHROPIC_TEMPERATURE, to_chat, to_chat_text
from gateway.apis.anthropic.response import BadToolCall, message
from gateway.apis.anthropic.stream import StreamTranscoder
from gateway.call import Api, Call
from gateway.config import EndpointConfig
from gateway.errors import GatewayError, InvalidRequest
from gateway.http.validation import validate
from gateway.provider_table import PROVIDERS
from sdk.wire import ChatCompletionRequest, MessagesRequest

_EVENT_STREAM = b"text/event-stream"


def parse_messages(data: dict[str, Any]) -> MessagesRequest:
    """``data`` as a Messages request; a 400 naming the first bad field if it is not one."""
    try:
        return MessagesRequest.model_validate(data)
    except ValidationError as err:
        raise errors.invalid(err, data) from None


class MessagesDoor:
    """``POST /v1/messages`` (any query string, such as Claude Code's ``?beta=true``), for
    the models of ``routes`` (client model name -> its endpoints, in order)."""

    api: Api = "messages"

    def __init__(self, routes: Mapping[str, tuple[EndpointConfig, ...]]) -> None:
        self.routes = routes

    def parse(self, data: dict[str, Any]) -> ChatCompletionRequest:
        request = parse_messages(data)
        endpoints = self.routes.get(request.model, ())
        default = next(iter(endpoints), None)
        temperature = ANTHROPIC_TEMPERATURE
        if default is not None and default.messages_temperature is not None:
            temperature = default.messages_temperature
        try:
            body = to_chat(request, temperature)
        except InvalidRequest:
            native = all("messages" in PROVIDERS[e.kind].native_apis for e in endpoints)
            if not endpoints or not native:
                raise
            body = to_chat_text(request, temperature)
        return validate(ChatCompletionRequest, body)

    def error_body(self, error: GatewayError) -> bytes:
        return errors.error_body(error)

    def transcode(self, call: Call, send: Send) -> Send:
        return _Answer(call, send)


class _Answer:
    """The send a non-native endpoint answers through: a stream is transcoded event by
    event as it arrives; a JSON answer (or error) is held whole, then sent transcoded."""

    def __init__(self, call: Call, send: Send) -> None:
        self.send = send
        self.model = call.request.model
        self.stops = call.request.stop_list()
        self.stream: StreamTranscoder | None = None
        self.start: Message | None = None
        self.chunks: list[bytes] = []

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            await self._start(message)
        elif message["type"] != "http.response.body":
            await self.send(message)
        elif self.stream is not None:
            await self._stream_body(message)
        else:
            await self._json_body(message)

    async def _start(self, message: Message) -> None:
        headers = message.get("headers", [])
        kind = next((v for k, v in headers if k == b"content-type"), b"")
        if message["status"] != 200 or not kind.startswith(_EVENT_STREAM):
            self.start = message  # sent with the transcoded body and its new length
            return
        self.stream = StreamTranscoder(self.model, self.stops)
        await self.send(message)
        await self.send(
            {"type": "http.response.body", "body": self.stream.start(), "more_body": True}
        )

    async def _stream_body(self, message: Message) -> None:
        assert self.stream is not None
        more = bool(message.get("more_body", False))
        out = self.stream.feed(message.get("body", b""))
        if not more:
            out += self.stream.close()
        if out or not more:
            await self.send({"type": "http.response.body", "body": out, "more_body": more})

    async def _json_body(self, message: Message) -> None:
        self.chunks.append(message.get("body", b""))
        if message.get("more_body", False):
            return
        assert self.start is not None
        raw = b"".join(self.chunks)
        status = self.start["status"]
        if status == 200:
            status, body = self._message(raw)
        else:
            body = errors.from_openai(status, raw)
        headers = [(k, v) for k, v in self.start.get("headers", []) if k != b"content-length"]
        await self.send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-length", str(len(body)).encode()), *headers],
            }
        )
        await self.send({"type": "http.response.body", "body": body})

    def _message(self, raw: bytes) -> tuple[int, bytes]:
        try:
            chat = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return 502, errors.body(502, "the endpoint's answer is not JSON")
        if not isinstance(chat, dict):
            return 502, errors.body(502, "the endpoint's answer is not a JSON object")
        try:
            return 200, orjson.dumps(message(chat, self.model, self.stops))
        except BadToolCall as exc:
            return 502, errors.body(502, str(exc))
