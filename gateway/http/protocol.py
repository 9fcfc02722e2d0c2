"""uvicorn's httptools protocol with a deadline on request headers.

uvicorn bounds the idle time between requests (``timeout_keep_alive``) but not the time a
client takes to send a request's headers, so a client trickling header bytes would hold
its connection (and a slot of ``limit_concurrency``) forever. This protocol closes a
connection whose headers have not all arrived within ``header_timeout_s`` of the
request's first byte (or of the connection, for its first request).
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


class _HeaderDeadline(HttpToolsProtocol):
    header_timeout_s = 10.0
    _timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm()

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        if self._timer is None:
            self._timer = self.loop.call_later(self.header_timeout_s, self._too_slow)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _too_slow(self) -> None:
        self._timer = None
        if not self.transport.is_closing():
            self.transport.close()


def header_deadline_protocol(header_timeout_s: float) -> type[Any]:
    """The protocol class to give uvicorn as ``http=``."""
    return type(
        "HeaderDeadlineProtocol", (_HeaderDeadline,), {"header_timeout_s": header_timeout_s}
    )
