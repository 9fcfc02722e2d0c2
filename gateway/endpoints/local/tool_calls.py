"""An answer's text split into content and OpenAI tool calls as it arrives
(:class:`CallParser`): the streamed ``delta.tool_calls`` pieces and the whole answer's
``tool_calls`` come from the same parse, so the stream reassembles to the answer.

The answer follows the tool grammar (``tools.call_grammar``): text that never contains
:data:`~gateway.endpoints.local.tools.OPEN`, then calls, each ``{"name": "...",
"arguments": {...}}`` within the tags. A call is announced (id, name) once its name is
complete, and its arguments follow as fragments of the model's own text, ending where the
JSON value ends. An answer cut short (``max_tokens``, a stop string) ends with what was
complete: a call whose name had arrived, with the arguments so far.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

from gateway.endpoints.local.tools import CLOSE, OPEN

_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")')  # up to the name's value
_ARGUMENTS = re.compile(r'\s*,\s*"arguments"\s*:\s*(?=\S)')  # up to the value's first char


def call_id() -> str:
    """A new call id, as OpenAI's: ``call_`` and 24 characters."""
    return "call_" + uuid.uuid4().hex[:24]


@dataclass
class ToolCall:
    """One call of an answer, as far as it arrived."""

    id: str
    name: str
    arguments: str = ""

    def openai(self) -> dict[str, Any]:
        """The call as a message's ``tool_calls`` entry."""
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


@dataclass
class Parsed:
    """What one piece of an answer's text added: content, then tool-call deltas (OpenAI's
    ``delta.tool_calls`` entries: the first of a call has its index, id, type and name
    with empty arguments; later ones only the index and an argument fragment)."""

    content: str = ""
    deltas: list[dict[str, Any]] = field(default_factory=list)


class CallParser:
    """One answer's parse; feed it the text as it comes, then :meth:`close`."""

    def __init__(self) -> None:
        self.calls: list[ToolCall] = []
        self.content: list[str] = []
        self._buffer = ""  # text not yet assigned to content or a call
        self._state = "text"  # text, head (before the name), keys, arguments, tail
        self._depth = 0  # the arguments' open brackets
        self._string = False  # inside a JSON string of the arguments
        self._escape = False  # after a backslash in that string

    def feed(self, text: str) -> Parsed:
        """Parse ``text``, the next piece of the answer."""
        out = Parsed()
        self._buffer += text
        while self._buffer and self._step(out):
            pass
        return out

    def close(self) -> Parsed:
        """The end of the answer: text held back as a possible start of a call is content."""
        out = Parsed()
        if self._state == "text" and self._buffer:
            self._content(out, self._buffer)
        self._buffer = ""
        return out

    @property
    def text(self) -> str | None:
        """The answer's content: None when it has calls and no text (as OpenAI's)."""
        content = "".join(self.content)
        return None if self.calls and not content else content

    def _step(self, out: Parsed) -> bool:
        """Consume what the buffer allows in the current state; False: wait for more."""
        buffer = self._buffer
        if self._state == "text":
            at = buffer.find(OPEN)
            if at < 0:  # keep a tail that may begin the tag
                longest = min(len(OPEN) - 1, len(buffer))
                keep = next((k for k in range(longest, 0, -1) if OPEN.startswith(buffer[-k:])), 0)
                if not self.calls:  # between calls only separators: never content
                    self._content(out, buffer[: len(buffer) - keep])
                self._buffer = buffer[len(buffer) - keep :]
                return False
            if not self.calls:
                self._content(out, buffer[:at])
            self._buffer, self._state = buffer[at + len(OPEN) :], "head"
            return True
        if self._state == "head":
            match = _HEAD.match(buffer)
            if match is None:
                return False
            call = ToolCall(call_id(), json.loads(match.group(1)))
            self.calls.append(call)
            out.deltas.append(
                {
                    "index": len(self.calls) - 1,
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": ""},
                }
            )
            self._buffer, self._state = buffer[match.end() :], "keys"
            return True
        if self._state == "keys":
            match = _ARGUMENTS.match(buffer)
            if match is None:
                return False
            self._buffer, self._state = buffer[match.end() :], "arguments"
            self._depth, self._string, self._escape = 0, False, False
            return True
        if self._state == "arguments":
            end = self._value_end(buffer)
            piece = buffer if end is None else buffer[:end]
            self.calls[-1].arguments += piece
            out.deltas.append({"index": len(self.calls) - 1, "function": {"arguments": piece}})
            if end is None:
                self._buffer = ""
                return False
            self._buffer, self._state = buffer[end:], "tail"
            return True
        at = buffer.find(CLOSE)  # tail: the call's closing brace and tag
        if at < 0:
            return False
        self._buffer, self._state = buffer[at + len(CLOSE) :], "text"
        return True

    def _value_end(self, text: str) -> int | None:
        """Where the arguments' JSON value ends in ``text`` (None: not in it), the scan's
        state carried over from the earlier pieces."""
        for i, char in enumerate(text):
            if self._string:
                if self._escape:
                    self._escape = False
                elif char == "\\":
                    self._escape = True
                elif char == '"':
                    self._string = False
            elif char == '"':
                self._string = True
            elif char in "{[":
                self._depth += 1
            elif char in "}]":
                self._depth -= 1
                if self._depth == 0:
                    return i + 1
        return None

    def _content(self, out: Parsed, text: str) -> None:
        if text:
            out.content += text
            self.content.append(text)
