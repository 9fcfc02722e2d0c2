"""Front doors: the client-facing APIs the gateway answers, over one request pipeline.

A route (:class:`gateway.routes.completions.CompletionsRoute`) authenticates, reads and
bounds the body, and hands it to its door's :meth:`FrontDoor.parse`, which returns the
internal request (``sdk.wire.ChatCompletionRequest``, or ``CompletionRequest`` for the
completions door only). Limits, routing and the endpoints run on that request alike for
every door. Every endpoint answers in OpenAI chat-completions form (a JSON body, an SSE
stream of ``chat.completion.chunk`` events ending in ``[DONE]``, or an OpenAI error
body); :meth:`FrontDoor.transcode` turns that into the door's own answer. An HTTP
endpoint sends such an upstream ``call.openai_body()`` (the internal request encoded,
for every door but the two OpenAI ones) to ``call.openai_api``'s path. An endpoint that
relays the client's body to an upstream speaking the door's API itself (the kind's
``native_apis`` in :mod:`gateway.provider_table`) sets ``call.native`` before its first
byte, and the transcoder is skipped (:func:`answer_send`); such a stream ends at the
upstream's close, not at a ``[DONE]``. Errors raised before an endpoint runs are
answered with :meth:`FrontDoor.error_body`.

Adding a door: a class with the three methods below (in its package under
``gateway/apis/``), and one line in ``gateway.app.FRONT_DOORS`` mapping its path to it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Protocol, runtime_checkable

from starlette.types import Message, Send

from gateway.call import Api, Call
from gateway.errors import GatewayError
from gateway.http.validation import validate
from sdk.wire import ChatCompletionRequest, CompletionRequest


class FrontDoor(Protocol):
    """One client-facing API: its request parsed into the internal request, its answers
    and errors in its own shape."""

    api: Api

    def parse(self, data: dict[str, Any]) -> ChatCompletionRequest | CompletionRequest:
        """The internal request for a validated-JSON body (raise GatewayError subclasses)."""
        ...

    def error_body(self, error: GatewayError) -> bytes:
        """The error as this API's JSON error body (status is error.status)."""
        ...

    def transcode(self, call: Call, send: Send) -> Send:
        """A send that turns the internal OpenAI chat-completions answer (a JSON body, or
        an SSE stream of chat.completion.chunk events ending in [DONE], or an error body)
        into this API's answer. Identity for chat/completions."""
        ...


@runtime_checkable
class Relaying(Protocol):
    """A door that sees the answers an endpoint speaking its API itself relays."""

    def relayed(self, call: Call, send: Send) -> Send:
        """The send for an answer relayed from an endpoint that speaks the door's API
        itself: passed on as it is, the door keeping what a later request may continue
        or putting the gateway's own errors in its shape."""
        ...


@runtime_checkable
class Continuing(Relaying, Protocol):
    """A door whose requests may continue a conversation the gateway stored for the
    tenant (the Responses API's ``previous_response_id``)."""

    async def resolve(
        self,
        tenant: str,
        raw: bytes,
        data: dict[str, Any],
        request: ChatCompletionRequest | CompletionRequest,
    ) -> tuple[bytes, dict[str, Any], ChatCompletionRequest | CompletionRequest]:
        """The body (as sent upstream by a native endpoint) and the internal request with
        the stored conversation the request continues; run once the tenant is known,
        before routing (raise GatewayError subclasses: an unknown id is a 404)."""
        ...


class Transcoder(ABC):
    """A door's ``transcode`` send: the internal answer's start, then its body, read as one
    JSON document or, once ``_start`` has set ``stream`` (the door's stream transcoder), as
    a stream; other messages pass unchanged."""

    send: Send
    stream: object | None = None

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            await self._start(message)
        elif message["type"] != "http.response.body":
            await self.send(message)
        elif self.stream is not None:
            await self._stream_body(message)
        else:
            await self._json_body(message)

    @abstractmethod
    async def _start(self, message: Message) -> None: ...

    @abstractmethod
    async def _stream_body(self, message: Message) -> None: ...

    @abstractmethod
    async def _json_body(self, message: Message) -> None: ...


class OpenAIDoor:
    """``POST /v1/chat/completions`` or ``POST /v1/completions``: the internal request is
    the client's own, answers and errors pass unchanged."""

    def __init__(self, api: Api) -> None:
        self.api = api

    def parse(self, data: dict[str, Any]) -> ChatCompletionRequest | CompletionRequest:
        if self.api == "chat":
            return validate(ChatCompletionRequest, data)
        return validate(CompletionRequest, data)

    def error_body(self, error: GatewayError) -> bytes:
        return error.body()

    def transcode(self, call: Call, send: Send) -> Send:
        return send


CHAT = OpenAIDoor("chat")
COMPLETIONS = OpenAIDoor("completions")


def answer_send(door: FrontDoor, call: Call, send: Send) -> Send:
    """The send an endpoint answers ``call`` through: the door's transcoder, unless the
    endpoint set ``call.native`` by its first message (then the client's ``send``)."""
    transcoded = door.transcode(call, send)
    if transcoded is send:
        return send
    chosen: Send | None = None

    async def choose(message: Message) -> None:
        nonlocal chosen
        if chosen is None:
            if not call.native:
                chosen = transcoded
            elif isinstance(door, Relaying):
                chosen = door.relayed(call, send)
            else:
                chosen = send
        await chosen(message)

    return choose
