"""An answer relayed from an endpoint that speaks the Responses API itself (``openai``,
``azure``), kept in the gateway's store on its way to the client.

The client gets the provider's bytes unchanged. A response whose request did not set
``store: false`` is stored as the provider answered it, with the input items the model
saw, before its last event (``response.completed`` or ``response.incomplete``) or its JSON
body goes out: the tenant's next request can continue it by ``previous_response_id``,
which the gateway resolves itself for every endpoint kind. Error answers pass untouched.
"""

from __future__ import annotations

import logging
import re
from typing import Any

import orjson
from starlette.types import Message, Send

from gateway.apis.responses.store import ResponseStore, Stored
from gateway.apis.responses.translate import TranslatedRequest
from lookup.corpus.errors import StoreUnavailable

log = logging.getLogger(__name__)

_FINAL = (b"response.completed", b"response.incomplete")
_FINAL_TYPES = ("response.completed", "response.incomplete")
_BOUNDARY = re.compile(rb"\r\n\r\n|\n\n")


def last_boundary(data: bytes) -> int:
    """The index just past the last event boundary (a blank line) in ``data``, or 0."""
    lf, crlf = data.rfind(b"\n\n"), data.rfind(b"\r\n\r\n")
    return max(lf + 2 if lf >= 0 else 0, crlf + 4 if crlf >= 0 else 0)


def final_event(events: bytes) -> tuple[int, dict[str, Any]] | None:
    """Where the ``response.completed``/``.incomplete`` event starts in ``events`` (whole
    server-sent events) and its response object; None when there is none."""
    if not any(name in events for name in _FINAL):
        return None
    offset = 0
    for boundary in _BOUNDARY.finditer(events):
        event = events[offset : boundary.start()]
        for line in event.splitlines():
            if not line.startswith(b"data:"):
                continue
            try:
                data = orjson.loads(line[5:])
            except orjson.JSONDecodeError:
                break
            if isinstance(data, dict) and data.get("type") in _FINAL_TYPES:
                response = data.get("response")
                if isinstance(response, dict):
                    return offset, response
        offset = boundary.end()
    return None


class Relayed:
    """The send a native relay answers through (see the module's docstring)."""

    def __init__(
        self,
        store: ResponseStore,
        tenant: str,
        request: TranslatedRequest,
        items: list[dict[str, Any]],
        send: Send,
    ) -> None:
        self.store = store
        self.tenant = tenant
        self.keep = request.source.store is not False
        self.items = items
        self.send = send
        self.start: Message | None = None
        self.stream = False
        self.chunks: list[bytes] = []
        self.pending = b""

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            headers = message.get("headers", [])
            kind = next((v for k, v in headers if k == b"content-type"), b"")
            if not self.keep or message["status"] != 200:
                self.keep = False
                await self.send(message)
            elif kind.startswith(b"text/event-stream"):
                self.stream = True
                await self.send(message)
            else:
                self.start = message
        elif message["type"] != "http.response.body":
            await self.send(message)
        elif self.stream:
            await self._stream_body(message)
        elif self.start is not None:
            await self._json_body(message)
        else:
            await self.send(message)

    async def _stream_body(self, message: Message) -> None:
        """Whole events as they come; the final one once its response is stored."""
        more = bool(message.get("more_body", False))
        data = self.pending + message.get("body", b"")
        cut = last_boundary(data) if more else len(data)
        self.pending, out = data[cut:], data[:cut]
        final = final_event(out) if self.keep else None
        if final is not None:
            start, response = final
            if start:
                await self.send(
                    {"type": "http.response.body", "body": out[:start], "more_body": True}
                )
            out = out[start:]
            await self._store(response)
            self.keep = False  # one response per stream
        if out or not more:
            await self.send({"type": "http.response.body", "body": out, "more_body": more})

    async def _json_body(self, message: Message) -> None:
        self.chunks.append(message.get("body", b""))
        if message.get("more_body", False):
            return
        body = b"".join(self.chunks)
        try:
            response = orjson.loads(body)
        except orjson.JSONDecodeError:
            response = None
        if isinstance(response, dict):
            await self._store(response)
        assert self.start is not None
        await self.send(self.start)
        await self.send({"type": "http.response.body", "body": body})

    async def _store(self, response: dict[str, Any]) -> None:
        response_id = response.get("id")
        if not isinstance(response_id, str) or not response_id:
            return
        try:
            kept = await self.store.put(self.tenant, response_id, Stored(response, self.items))
        except StoreUnavailable as exc:
            log.warning("response %s not stored: %s", response_id, exc)
            return
        if not kept:
            log.warning("response %s not stored: larger than a tenant may keep", response_id)
