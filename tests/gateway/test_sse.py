"""What the stream relay notes from forwarded events without decoding most of them."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.http.sse import MAX_EVENT_BYTES, MAX_KEPT_CHARS, EventTooLarge, StreamRelay
from gateway.telemetry import RequestTiming


def _event(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def _chunk(*contents: Any, usage: Any = None, key: str = "delta") -> bytes:
    choices = [
        {"index": i, key: {"content": c}} if key == "delta" else {"index": i, "text": c}
        for i, c in enumerate(contents)
    ]
    body: dict[str, Any] = {"object": "chat.completion.chunk", "choices": choices}
    if usage is not None:
        body["usage"] = usage
    return _event(body)


def _observe(ready: bytes, keep_text: bool) -> StreamRelay:
    relay = StreamRelay(RequestTiming("e", "m", True, t_start=0.0), keep_text=keep_text)
    relay.observe(relay.feed(ready))
    return relay


STREAM = (
    _event({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
    + _chunk("He")
    + _chunk('say "content": "x"')
    + _chunk(None)
    + _chunk("a", "b")  # n = 2: two contents in one event
    + _event({"choices": [{"index": 0, "delta": {}, "logprobs": {"content": [{"t": 1}]}}]})
    + b": keep-alive\n\n"
    + _chunk(usage={"completion_tokens": 4, "prompt_tokens": 2})
    + b"data: [DONE]\n\n"
)


def test_content_chunks_usage_and_done_without_capture() -> None:
    for keep_text in (False, True):
        relay = _observe(STREAM, keep_text)
        timing = relay.timing
        assert len(timing.chunk_times) == 4 and timing.t_first_content is not None
        assert relay.usage == {"completion_tokens": 4, "prompt_tokens": 2}
        assert relay.done
        assert relay.text == (["He", 'say "content": "x"', "a", "b"] if keep_text else None)


def test_completions_text_counts_and_empty_events_do_not() -> None:
    relay = _observe(_chunk("x", key="text") + _chunk("", key="text"), keep_text=False)
    assert len(relay.timing.chunk_times) == 1 and not relay.done
    empty = _observe(_event({"choices": [{"index": 0, "delta": {"role": "assistant"}}]}), False)
    assert empty.timing.t_first_content is None and empty.usage is None


def test_events_split_anywhere_come_out_whole() -> None:
    stream = STREAM + b"data: {}\r\n\r\ndata: [DONE]\r\n\r\n"
    for size in (1, 2, 3, 5, 7):
        relay = StreamRelay(RequestTiming("e", "m", True, t_start=0.0), keep_text=False)
        out = [relay.feed(stream[i : i + size]) for i in range(0, len(stream), size)]
        assert b"".join(out) == stream
        for ready in filter(None, out):  # only whole events are ever released
            assert ready.endswith((b"\n\n", b"\r\n\r\n"))


def test_an_event_that_never_ends_is_bounded() -> None:
    relay = StreamRelay(RequestTiming("e", "m", True, t_start=0.0), keep_text=False)
    assert relay.feed(b'data: {"choices": [{"delta": {"content": "') == b""
    chunk = b"x" * (1 << 16)
    with pytest.raises(EventTooLarge):
        for _ in range(MAX_EVENT_BYTES // len(chunk) + 1):
            assert relay.feed(chunk) == b""


def test_kept_text_stops_past_its_bound() -> None:
    relay = StreamRelay(RequestTiming("e", "m", True, t_start=0.0), keep_text=True)
    relay.observe(relay.feed(_chunk("x" * MAX_KEPT_CHARS)))
    assert relay.text == ["x" * MAX_KEPT_CHARS]
    relay.observe(relay.feed(_chunk("y")))
    assert relay.text is None
