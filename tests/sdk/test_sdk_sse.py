"""The SSE decoder shared by Stream and AsyncStream."""

from __future__ import annotations

import json

import pytest

from sdk._core import SSEDecoder
from sdk.errors import APIStreamError
from sdk.wire import ChatCompletionChunk


def chunk(content: str) -> dict[str, object]:
    return {
        "id": "c",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "delta": {"content": content}, "finish_reason": None}],
    }


def decode(text: str) -> tuple[list[ChatCompletionChunk], SSEDecoder[ChatCompletionChunk]]:
    decoder = SSEDecoder(ChatCompletionChunk)
    items = [item for line in text.split("\n") if (item := decoder.feed(line)) is not None]
    if (last := decoder.finish()) is not None:
        items.append(last)
    return items, decoder


def test_events_comments_and_done() -> None:
    text = (
        ": keep-alive\n\n"
        f"data: {json.dumps(chunk('a'))}\n\n"
        f"data:{json.dumps(chunk('b'))}\n\n"
        "event: ignored-field\n"
        f"data: {json.dumps(chunk('c'))}\n\n"
        "data: [DONE]\n\n"
    )
    items, decoder = decode(text)
    assert [i.choices[0].delta.content for i in items] == ["a", "b", "c"]
    assert decoder.done


def test_data_split_over_lines_is_joined() -> None:
    body = json.dumps(chunk("x"), indent=1).split("\n")
    text = "".join(f"data: {line}\n" for line in body) + "\ndata: [DONE]\n\n"
    items, _ = decode(text)
    assert items[0].choices[0].delta.content == "x"


def test_last_event_without_blank_line_is_kept_but_missing_done_raises() -> None:
    with pytest.raises(APIStreamError, match=r"\[DONE\]"):
        decode(f"data: {json.dumps(chunk('a'))}")


def test_error_event_raises_with_the_openai_body() -> None:
    err = {
        "error": {
            "message": "upstream failed",
            "type": "upstream_error",
            "code": "x",
            "param": None,
        }
    }
    text = f"data: {json.dumps(chunk('a'))}\n\ndata: {json.dumps(err)}\n\n"
    decoder = SSEDecoder(ChatCompletionChunk)
    with pytest.raises(APIStreamError) as caught:
        for line in text.split("\n"):
            decoder.feed(line)
    assert caught.value.body is not None
    assert caught.value.body.error.message == "upstream failed"
    assert caught.value.body.error.code == "x"


def test_error_event_with_a_plain_string() -> None:
    decoder = SSEDecoder(ChatCompletionChunk)
    decoder.feed('data: {"error": "boom"}')
    with pytest.raises(APIStreamError, match="boom"):
        decoder.feed("")


def test_non_json_event_raises() -> None:
    decoder = SSEDecoder(ChatCompletionChunk)
    decoder.feed("data: {not json")
    with pytest.raises(APIStreamError, match="not JSON"):
        decoder.feed("")
