"""Server-sent events on the way through: event-aligned forwarding and the observations
telemetry needs (first content, chunk times, usage, the closing ``[DONE]``).

Events are not parsed on the way through: content is found in the bytes (a JSON string
value of a ``content``/``text`` key that is not empty), and an event is decoded only when
it carries ``usage`` or when the response text is kept for capture.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any

from gateway.telemetry import RequestTiming

DONE = b"[DONE]"
# a non-empty string value of a "content" or "text" key; inside JSON strings quotes are
# escaped, so an unescaped ``"content"`` is a key (or the bare string "content")
_CONTENT = re.compile(rb'"(?:content|text)"\s*:\s*"(?!")')
_USAGE = b'"usage"'
DONE_EVENT = b"data: [DONE]\n\n"
MAX_EVENT_BYTES = 4 << 20
MAX_KEPT_CHARS = 1 << 20
SSE_HEADERS: list[tuple[bytes, bytes]] = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]


def error_event(
    message: str, type_: str = "upstream_error", code: str = "stream_interrupted"
) -> bytes:
    """An OpenAI-style error event; the stream ends after it."""
    payload = {"error": {"message": message, "type": type_, "code": code, "param": None}}
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


def data_event(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


def _content(choice: dict[str, Any]) -> str | None:
    delta = choice.get("delta")
    if isinstance(delta, dict):
        content = delta.get("content")
        return content if isinstance(content, str) else None
    text = choice.get("text")
    return text if isinstance(text, str) else None


class EventTooLarge(Exception):
    """An upstream event grew past ``MAX_EVENT_BYTES`` without ending."""


def _last_boundary(data: bytes) -> int:
    """The index just past the last event boundary (blank line) in ``data``, or -1."""
    cut_lf = data.rfind(b"\n\n")
    cut_crlf = data.rfind(b"\r\n\r\n")
    return max(cut_lf + 2 if cut_lf >= 0 else -1, cut_crlf + 4 if cut_crlf >= 0 else -1)


class StreamRelay:
    """Splits upstream bytes into whole events to forward, and notes what they carry.

    ``feed`` returns the bytes ready to send (complete events only, so an interrupted
    stream never leaves half an event before the error event). An unfinished event is
    held as a list of chunks, each searched once, so a long event costs linear time; past
    ``MAX_EVENT_BYTES`` it raises :class:`EventTooLarge`. Kept text (for capture) stops
    at ``MAX_KEPT_CHARS``.
    """

    def __init__(self, timing: RequestTiming, keep_text: bool) -> None:
        self.timing = timing
        self.done = False
        self.usage: dict[str, Any] | None = None
        self.text: list[str] | None = [] if keep_text else None
        self._kept = 0
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self._tail = b""  # the last 3 pending bytes (a boundary may span chunks)

    def feed(self, chunk: bytes) -> bytes:
        if not self._pending:
            cut = _last_boundary(chunk)
            if cut < 0:
                self._hold(chunk)
                return b""
            if cut < len(chunk):
                self._hold(chunk[cut:])
            return chunk[:cut]
        # the pending bytes hold no boundary: one can only end in the new chunk
        tail = self._tail
        cut = _last_boundary(tail + chunk) - len(tail)
        if cut <= 0:
            self._hold(chunk)
            return b""
        ready = b"".join([*self._pending, chunk[:cut]])
        self._pending, self._pending_bytes, self._tail = [], 0, b""
        if cut < len(chunk):
            self._hold(chunk[cut:])
        return ready

    def _hold(self, data: bytes) -> None:
        self._pending.append(data)
        self._pending_bytes += len(data)
        self._tail = (self._tail + data[-3:])[-3:]
        if self._pending_bytes > MAX_EVENT_BYTES:
            raise EventTooLarge(f"upstream event over {MAX_EVENT_BYTES} bytes")

    def observe(self, ready: bytes) -> None:
        """Record what the forwarded events carried (after they were sent)."""
        now = time.perf_counter()
        timing = self.timing
        if timing.t_first_byte is None:
            timing.t_first_byte = now
        for line in ready.splitlines():
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == DONE:
                self.done = True
                continue
            contents = len(_CONTENT.findall(data))
            if self.text is not None and contents or _USAGE in data:
                self._decode(data, now)
            elif contents:
                if timing.t_first_content is None:
                    timing.t_first_content = now
                timing.chunk_times.extend([now] * contents)

    def _decode(self, data: bytes, now: float) -> None:
        """The slow path: one event decoded for its usage and text."""
        try:
            event = json.loads(data)
        except ValueError:
            return
        if not isinstance(event, dict):
            return
        usage = event.get("usage")
        if isinstance(usage, dict):
            self.usage = usage
        timing = self.timing
        for choice in event.get("choices") or ():
            content = _content(choice) if isinstance(choice, dict) else None
            if content:
                if timing.t_first_content is None:
                    timing.t_first_content = now
                timing.chunk_times.append(now)
                if self.text is not None:
                    self._keep(content)

    def _keep(self, content: str) -> None:
        assert self.text is not None
        self._kept += len(content)
        if self._kept > MAX_KEPT_CHARS:  # too long to capture: keep nothing
            self.text = None
        else:
            self.text.append(content)
