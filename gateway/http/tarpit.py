"""Holding the refusals of clients already over a limit (a tarpit).

A client past its limit that asks again as soon as it is answered keeps the gateway
answering it as fast as it can send. :class:`Tarpit` answers such a refusal (a 429 the
door gives from what it already knows) only after ``min(Retry-After, hold_s)``: a client
that waits for its answers is slowed to its connections / ``hold_s`` requests a second.
A held answer is a timer on the event loop and the request's task waiting on the
connection: no CPU while held, and a client that hangs up meanwhile is forgotten without
an answer. At most ``max_held`` are held at once; past that a refusal is answered at once
with ``Connection: close``, so its client must open a new connection to ask again; so is
one whose client sends more than ``HELD_BODY_BYTES`` of body while held (the body is read
while held, as that is how a hang-up is seen, and dropped).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol

from starlette.types import Message, Receive, Send

from gateway.errors import GatewayError


class Cancellable(Protocol):
    def cancel(self) -> None: ...


HELD_BODY_BYTES = 64 * 1024  # body read (and dropped) while held, past it answered at once
CallLater = Callable[[float, Callable[[], None]], Cancellable]
"""``loop.call_later`` without extra arguments: a timer that runs a callback once."""


class Tarpit:
    """Holds the door's 429s for ``min(Retry-After, hold_s)`` (``hold_s`` 0: never), at most
    ``max_held`` at once. ``call_later`` (the running loop's by default) sets the timers."""

    def __init__(self, hold_s: float, max_held: int, call_later: CallLater | None = None) -> None:
        self._hold_s = hold_s
        self._max_held = max_held
        self._call_later = call_later
        self.held = 0  # refusals held now

    def delay(self, refusal: GatewayError) -> float:
        """Seconds ``refusal`` is held: a 429 saying ``Retry-After``, else 0."""
        retry = refusal.headers.get("retry-after")
        if refusal.status != 429 or retry is None or not retry.isdigit():
            return 0.0
        return min(float(retry), self._hold_s)

    async def hold(self, refusal: GatewayError, receive: Receive, send: Send) -> Send | None:
        """Wait out ``refusal``'s delay; the send to answer it through then (one adding
        ``Connection: close`` when ``max_held`` are held already), or None when the client
        hung up while held (nothing to answer)."""
        delay = self.delay(refusal)
        if delay <= 0:
            return send
        if self.held >= self._max_held:
            return _closing(send)
        self.held += 1
        try:
            waited = await self._wait(delay, receive)
        finally:
            self.held -= 1
        if waited == "hung up":
            return None
        return send if waited == "expired" else _closing(send)

    async def _wait(self, delay: float, receive: Receive) -> str:
        """``"expired"`` once ``delay`` passed, or earlier ``"hung up"`` or ``"body"`` (the
        client sent more than ``HELD_BODY_BYTES`` of body: the body is read and dropped
        meanwhile, as reading is how a hang-up is seen)."""
        task = asyncio.current_task()
        assert task is not None
        expired = False

        def expire() -> None:
            nonlocal expired
            expired = True
            task.cancel()

        call_later = self._call_later or asyncio.get_running_loop().call_later
        timer = call_later(delay, expire)
        body = 0
        try:
            while (message := await receive())["type"] != "http.disconnect":
                body += len(message.get("body", b""))
                if body > HELD_BODY_BYTES:
                    return "body"
        except asyncio.CancelledError:
            if not expired:
                raise
            task.uncancel()
            return "expired"
        finally:
            timer.cancel()
        return "hung up"


def _closing(send: Send) -> Send:
    """``send`` with ``Connection: close`` added to the response's start."""

    async def closing(message: Message) -> None:
        if message["type"] == "http.response.start":
            message["headers"] = [*message.get("headers", ()), (b"connection", b"close")]
        await send(message)

    return closing
