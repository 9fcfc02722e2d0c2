"""The Responses front door (:class:`gateway.front_door.FrontDoor`): a Responses body
parsed into the internal chat request, the endpoint's chat-completions answer sent back
as a Responses answer (JSON or the Responses event stream), errors in OpenAI's shape
with the client's own field names.

``previous_response_id`` is resolved by :meth:`ResponsesDoor.resolve` (the tenant's
stored response, or a 404): the conversation it continues is expanded into the internal
request. A response whose ``store`` is not false is stored before its last event (or its
JSON body) goes out, so the next request can continue it at once.
"""

from __future__ import annotations

import logging
from typing import Any

import orjson
from starlette.types import Message, Send

from gateway.apis.responses import translate
from gateway.apis.responses.native import Relayed, last_boundary
from gateway.apis.responses.store import Limits, ResponseStore, Stored, open_response_store
from gateway.apis.responses.transcode import (
    StreamTranscoder,
    base_response,
    client_param,
    from_completion,
    new_id,
)
from gateway.apis.responses.translate import TranslatedRequest
from gateway.call import Api, Call
from gateway.config import Settings
from gateway.errors import GatewayError, NotFound, ServiceUnavailable, UpstreamError
from gateway.front_door import Transcoder
from lookup.corpus.errors import StoreUnavailable
from sdk.wire import ChatCompletionRequest, CompletionRequest
from sdk.wire.responses import InputItem, MessageItem, ReasoningItem, ResponsesRequest

log = logging.getLogger(__name__)

_EVENT_STREAM = b"text/event-stream"
_DONE = b"[DONE]"


def error_payload(error: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI error object with its ``param`` named as the Responses request names it."""
    return {**error, "param": client_param(error.get("param"))}


class ResponsesDoor:
    """``POST /v1/responses``; its stored responses are kept in ``store``."""

    api: Api = "responses"

    def __init__(self, store: ResponseStore) -> None:
        self.store = store

    def parse(self, data: dict[str, Any]) -> ChatCompletionRequest | CompletionRequest:
        return translate.translate(translate.validated(ResponsesRequest, data), [])

    async def resolve(
        self,
        tenant: str,
        raw: bytes,
        data: dict[str, Any],
        request: ChatCompletionRequest | CompletionRequest,
    ) -> tuple[bytes, dict[str, Any], ChatCompletionRequest | CompletionRequest]:
        """The body and request continuing the body's ``previous_response_id``: the
        tenant's stored response's input and output items go before the request's own,
        in the internal request and in the body an endpoint speaking the Responses API
        itself is sent (which never sees the id: it is the gateway's). Another tenant's
        id is not found (404), as an unknown one is."""
        if not isinstance(request, TranslatedRequest):
            return raw, data, request
        previous = request.source.previous_response_id
        if previous is None:
            return raw, data, request
        stored = await self.stored(tenant, previous, "previous_response_id")
        history = [
            *translate.stored_items(stored.input),
            *translate.output_items(stored.response.get("output", [])),
        ]
        continued = translate.translate(request.source, history)
        body = {k: v for k, v in data.items() if k != "previous_response_id"}
        # without ids: the provider would look for items of its own by them
        body["input"] = [
            item.model_dump(mode="json", exclude_none=True, exclude={"id"})
            for item in continued.items
            if not isinstance(item, ReasoningItem) or item.encrypted_content
        ]
        return orjson.dumps(body), body, continued

    async def stored(self, tenant: str, response_id: str, param: str | None = None) -> Stored:
        """The tenant's stored response ``response_id``; 404 when there is none, 503 when
        the store cannot answer."""
        try:
            stored = await self.store.get(tenant, response_id)
        except StoreUnavailable as exc:
            raise ServiceUnavailable(str(exc)) from None
        if stored is None:
            raise NotFound(f"no response with id {response_id!r}", param=param)
        return stored

    def error_body(self, error: GatewayError) -> bytes:
        detail = error.payload()["error"]
        assert isinstance(detail, dict)
        return orjson.dumps({"error": error_payload(detail)})

    def relayed(self, call: Call, send: Send) -> Send:
        request = call.request
        assert isinstance(request, TranslatedRequest)
        if request.source.store is False:
            return send
        items = [_with_id(item) for item in request.items]
        return Relayed(self.store, call.tenant, request, items, send)

    def transcode(self, call: Call, send: Send) -> Send:
        request = call.request
        assert isinstance(request, TranslatedRequest)
        return _Answer(self.store, call.tenant, request, send)


def open_door(settings: Settings) -> ResponsesDoor:
    """The door over the store ``settings`` name (``redis.url``, else memory)."""
    config = settings.responses
    limits = Limits(config.ttl_s, config.max_responses, config.max_bytes)
    store = open_response_store(
        settings.redis.url, limits, prefix=settings.redis.prefix, timeout_s=settings.redis.timeout_s
    )
    return ResponsesDoor(store)


class _Answer(Transcoder):
    """The send a non-native endpoint answers through: a stream is transcoded event by
    event as it arrives; a JSON answer (or error) is held whole, then sent transcoded."""

    def __init__(
        self, store: ResponseStore, tenant: str, request: TranslatedRequest, send: Send
    ) -> None:
        self.store = store
        self.tenant = tenant
        self.request = request
        self.send = send
        self.response = base_response(request.source, new_id("resp"))
        self.stream: StreamTranscoder | None = None
        self.start: Message | None = None
        self.chunks: list[bytes] = []
        self.pending = b""  # an unfinished event of the internal stream
        self.ended = False  # the final event went out

    async def _start(self, message: Message) -> None:
        headers = message.get("headers", [])
        kind = next((v for k, v in headers if k == b"content-type"), b"")
        if message["status"] != 200 or not kind.startswith(_EVENT_STREAM):
            self.start = message  # sent with the transcoded body and its new length
            return
        self.stream = StreamTranscoder(self.response, self.request.namespaced)
        await self.send(message)
        await self._emit(self.stream.start())

    async def _emit(self, body: bytes, more: bool = True) -> None:
        await self.send({"type": "http.response.body", "body": body, "more_body": more})

    async def _keep(self) -> None:
        """Store the finished response (unless ``store`` is false); a store that fails is
        logged, the answer still goes out."""
        if not self.response.store:
            return
        stored = Stored(
            self.response.model_dump(mode="json"),
            [_with_id(item) for item in self.request.items],
        )
        try:
            kept = await self.store.put(self.tenant, self.response.id, stored)
        except StoreUnavailable as exc:
            log.warning("response %s not stored: %s", self.response.id, exc)
            return
        if not kept:
            log.warning("response %s not stored: larger than a tenant may keep", self.response.id)

    async def _stream_body(self, message: Message) -> None:
        stream = self.stream
        assert stream is not None
        more = bool(message.get("more_body", False))
        data = self.pending + message.get("body", b"")
        cut = last_boundary(data)
        self.pending = data[cut:]
        out = b""
        for line in data[:cut].splitlines():
            if self.ended or not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == _DONE:
                out += stream.close()
                await self._emit(out)
                out = b""
                await self._keep()
                out = stream.final()
                self.ended = True
                continue
            try:
                chunk = orjson.loads(payload)
            except orjson.JSONDecodeError:
                out += self._fail("the endpoint sent an event that is not JSON", None, None)
                continue
            if isinstance(chunk, dict) and isinstance(chunk.get("error"), dict):
                error = chunk["error"]
                out += self._fail(
                    str(error.get("message") or "the endpoint failed"),
                    error.get("code"),
                    error.get("param"),
                    error.get("type"),
                )
            elif isinstance(chunk, dict):
                out += stream.chunk(chunk)
        if not more and not self.ended:
            out += self._fail("the endpoint's stream ended before its answer did", None, None)
        if out or not more:
            await self._emit(out, more)

    def _fail(self, message: str, code: Any, param: Any, kind: Any = None) -> bytes:
        assert self.stream is not None
        self.ended = True
        return self.stream.fail(
            message,
            code if isinstance(code, str) else None,
            param if isinstance(param, str) else None,
            kind if isinstance(kind, str) else None,
        )

    async def _json_body(self, message: Message) -> None:
        self.chunks.append(message.get("body", b""))
        if message.get("more_body", False):
            return
        assert self.start is not None
        raw = b"".join(self.chunks)
        status = self.start["status"]
        if status == 200:
            status, body = await self._response(raw)
        else:
            body = _error(raw, status)
        headers = [(k, v) for k, v in self.start.get("headers", []) if k != b"content-length"]
        await self.send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-length", str(len(body)).encode()), *headers],
            }
        )
        await self.send({"type": "http.response.body", "body": body})

    async def _response(self, raw: bytes) -> tuple[int, bytes]:
        try:
            chat = orjson.loads(raw)
        except orjson.JSONDecodeError:
            chat = None
        if not isinstance(chat, dict):
            error = UpstreamError("the endpoint's answer is not a JSON object")
            return error.status, error.body()
        response = from_completion(chat, self.response, self.request.namespaced)
        await self._keep()
        return 200, response.model_dump_json().encode()


def _error(raw: bytes, status: int) -> bytes:
    """An endpoint's OpenAI error body with the client's field names (any other body is
    wrapped as one)."""
    try:
        payload = orjson.loads(raw)
    except orjson.JSONDecodeError:
        payload = None
    if isinstance(payload, dict) and isinstance(payload.get("error"), dict):
        return orjson.dumps({"error": error_payload(payload["error"])})
    error = GatewayError(f"the endpoint answered HTTP {status}")
    return error.body()


def _with_id(item: InputItem) -> dict[str, Any]:
    """An input item as stored and listed (``GET .../input_items``), in the shape OpenAI
    lists them: with an id and a type, a message's text as one text part."""
    data = item.model_dump(mode="json", exclude_none=True)
    if not data.get("id"):
        prefix = "msg" if isinstance(item, MessageItem) else "item"
        data["id"] = new_id(prefix)
    if isinstance(item, MessageItem) and isinstance(item.content, str):
        part = (
            {"type": "output_text", "text": item.content, "annotations": []}
            if item.role == "assistant"
            else {"type": "input_text", "text": item.content}
        )
        data["content"] = [part]
    return data
