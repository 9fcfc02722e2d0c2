"""The Messages front door (:class:`gateway.front_door.FrontDoor`): a Messages body parsed
into the internal chat request, the endpoint's chat-completions answer sent back as a
Messages answer, errors in Anthropic's shape.

The door knows the routing table, for two facts about the model a request names, from
its endpoints' configuration: the temperature a request without one gets (the first
endpoint's ``messages_temperature``, else Anthropic's 1.0), and whether every endpoint
speaks Messages itself (the ``anthropic`` kind): then what the translation cannot carry
(server tools, PDF documents, block types this gateway does not know) is no refusal, since
the body goes upstream as sent and the internal request only sizes the limits."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import orjson
from pydantic import ValidationError
from starlette.types import Message, Send

from gateway.apis.anthropic import errors
from gateway.apis.anthropic.request import ANTHROPIC_TEMPERATURE, relayed_only, to_chat
from gateway.apis.anthropic.response import BadToolCall, message
from gateway.apis.anthropic.stream import StreamTranscoder, error_event
from gateway.call import Api, Call
from gateway.config import EndpointConfig
from gateway.errors import GatewayError, InvalidRequest
from gateway.front_door import Transcoder
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
        model = data.get("model")
        endpoints = self.routes.get(model, ()) if isinstance(model, str) else ()
        try:
            body = to_chat(parse_messages(data), self._temperature(endpoints))
        except InvalidRequest:
            native = all("messages" in PROVIDERS[e.kind].native_apis for e in endpoints)
            relayed = relayed_only(data) if endpoints and native else None
            if relayed is None:
                raise
            body = relayed
        return validate(ChatCompletionRequest, body)

    @staticmethod
    def _temperature(endpoints: tuple[EndpointConfig, ...]) -> float:
        """A request's temperature when it sends none: its first endpoint's
        ``messages_temperature``, else Anthropic's default."""
        first = next(iter(endpoints), None)
        if first is None or first.messages_temperature is None:
            return ANTHROPIC_TEMPERATURE
        return first.messages_temperature

    def error_body(self, error: GatewayError) -> bytes:
        return errors.error_body(error)

    def transcode(self, call: Call, send: Send) -> Send:
        return _Answer(call, send)

    def relayed(self, call: Call, send: Send) -> Send:
        return _Relayed(send)


def _is_stream(message: Message) -> bool:
    headers = message.get("headers", [])
    kind = next((v for k, v in headers if k == b"content-type"), b"")
    return message["status"] == 200 and kind.startswith(_EVENT_STREAM)


class _Held:
    """A JSON answer held whole (its length changes), then sent as ``convert`` makes it."""

    def __init__(self, start: Message) -> None:
        self.start = start
        self.chunks: list[bytes] = []

    async def feed(
        self, message: Message, send: Send, convert: Callable[[int, bytes], tuple[int, bytes]]
    ) -> None:
        self.chunks.append(message.get("body", b""))
        if message.get("more_body", False):
            return
        status, body = convert(self.start["status"], b"".join(self.chunks))
        headers = [(k, v) for k, v in self.start.get("headers", []) if k != b"content-length"]
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-length", str(len(body)).encode()), *headers],
            }
        )
        await send({"type": "http.response.body", "body": body})


def _error_message(message: Message) -> str:
    """The message of the OpenAI error event a body holds."""
    try:
        detail = orjson.loads(message["body"].removeprefix(b"data:")).get("error")
    except (orjson.JSONDecodeError, AttributeError):
        detail = None
    text = detail.get("message") if isinstance(detail, dict) else None
    return text if isinstance(text, str) and text else "the answer failed"


def _anthropic_error(status: int, raw: bytes) -> tuple[int, bytes]:
    return status, errors.from_openai(status, raw)


class _Relayed:
    """The send of an answer an ``anthropic`` endpoint relays: passed on as it is, but for
    the gateway's own errors, written in OpenAI's shape (an error body, or the event that
    ends an interrupted stream), put in Anthropic's. An Anthropic event always opens with
    its ``event:`` line, so a body that opens with ``data: {"error"`` is the gateway's."""

    def __init__(self, send: Send) -> None:
        self.send = send
        self.held: _Held | None = None

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start" and message["status"] >= 400:
            self.held = _Held(message)
        elif message["type"] == "http.response.body" and self.held is not None:
            await self.held.feed(message, self.send, _anthropic_error)
        elif message["type"] == "http.response.body" and message.get("body", b"").startswith(
            b'data: {"error"'
        ):
            await self.send({**message, "body": error_event(502, _error_message(message))})
        else:
            await self.send(message)


class _Answer(Transcoder):
    """The send a non-native endpoint answers through: a stream is transcoded event by
    event as it arrives; a JSON answer (or error) is held whole, then sent transcoded."""

    def __init__(self, call: Call, send: Send) -> None:
        self.send = send
        self.call = call
        self.model = call.request.model
        self.stops = call.request.stop_list()
        self.stream: StreamTranscoder | None = None
        self.held: _Held | None = None

    async def _start(self, message: Message) -> None:
        if not _is_stream(message):
            self.held = _Held(message)  # sent with the transcoded body and its new length
            return
        call = self.call
        self.stream = StreamTranscoder(
            self.model, self.stops, call.prompt_tokens, call.cached_tokens
        )
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
        assert self.held is not None
        await self.held.feed(message, self.send, self._converted)

    def _converted(self, status: int, raw: bytes) -> tuple[int, bytes]:
        if status == 200:
            return self._message(raw)
        return status, errors.from_openai(status, raw)

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
