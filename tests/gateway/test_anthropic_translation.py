"""The Messages door as pure code: what a request becomes, what an answer and a stream
become, and the refusals, without a server."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import TypeAdapter

from gateway.apis.anthropic import errors
from gateway.apis.anthropic.door import MessagesDoor
from gateway.apis.anthropic.response import message
from gateway.apis.anthropic.stream import StreamTranscoder
from gateway.config import build_settings
from gateway.errors import GatewayError, InvalidRequest, RateLimited, ServiceUnavailable
from sdk.wire import MessagesResponse, StreamEvent
from sdk.wire.anthropic import MessagesError

EVENTS: TypeAdapter[Any] = TypeAdapter(StreamEvent)
MESSAGES = MessagesDoor({})


def internal(**fields: Any) -> dict[str, Any]:
    body = {"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}
    request = MESSAGES.parse({**body, **fields})
    return request.model_dump(mode="json", exclude_unset=True)


def refusal(**fields: Any) -> str:
    with pytest.raises(InvalidRequest) as raised:
        internal(**fields)
    return raised.value.message


def test_defaults() -> None:
    assert internal() == {
        "model": "m",
        "max_tokens": 10,
        "temperature": 1.0,
        "stream": False,
        "messages": [{"role": "user", "content": "hi"}],
    }
    assert internal(temperature=0.2, top_p=0.9, top_k=5)["temperature"] == 0.2
    streamed = internal(stream=True)
    assert streamed["stream_options"] == {"include_usage": True}


def test_blocks_become_chat_messages() -> None:
    image = {"type": "base64", "media_type": "image/jpeg", "data": "AAAA"}
    messages = internal(
        system=[{"type": "text", "text": "one"}, {"type": "text", "text": "two"}],
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "look"},
                    {"type": "image", "source": image},
                    {"type": "document", "source": {"type": "text", "data": "notes"}},
                ],
            },
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "hmm", "signature": "s"},
                    {"type": "redacted_thinking", "data": "xx"},
                    {"type": "text", "text": "ok"},
                    {"type": "tool_use", "id": "t1", "name": "Read", "input": {"p": "é"}},
                    {"type": "tool_use", "id": "t2", "name": "Read", "input": {}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "t1", "content": "a"},
                    {
                        "type": "tool_result",
                        "tool_use_id": "t2",
                        "content": [{"type": "text", "text": "b"}, {"type": "text", "text": "c"}],
                        "is_error": True,
                    },
                    {"type": "text", "text": "next"},
                ],
            },
            {"role": "system", "content": [{"type": "text", "text": "env"}]},
        ],
    )["messages"]
    assert messages == [
        {"role": "system", "content": "one\n\ntwo"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "look"},
                {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,AAAA"}},
                {"type": "text", "text": "notes"},
            ],
        },
        {
            "role": "assistant",
            "content": "ok",
            "tool_calls": [
                {
                    "id": "t1",
                    "type": "function",
                    "function": {"name": "Read", "arguments": '{"p":"é"}'},
                },
                {"id": "t2", "type": "function", "function": {"name": "Read", "arguments": "{}"}},
            ],
        },
        {"role": "tool", "tool_call_id": "t1", "content": "a"},
        {"role": "tool", "tool_call_id": "t2", "content": "b\n\nc"},
        {"role": "user", "content": "next"},
        {"role": "system", "content": "env"},
    ]


def test_tools_and_structured_output() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    body = internal(
        tools=[{"name": "f", "input_schema": schema, "type": "custom", "strict": True}],
        tool_choice={"type": "tool", "name": "f"},
        stop_sequences=["END", ""],
        output_config={"effort": "low", "format": {"type": "json_schema", "schema": schema}},
        draftgate={"draft": False},
    )
    assert body["tools"] == [
        {"type": "function", "function": {"name": "f", "parameters": schema, "strict": True}}
    ]
    assert body["tool_choice"] == {"type": "function", "function": {"name": "f"}}
    assert "parallel_tool_calls" not in body
    assert body["stop"] == ["END"]
    assert body["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "output", "schema": schema},
    }
    assert body["draftgate"] == {"draft": False}
    assert "tool_choice" not in internal(tool_choice={"type": "any"})  # no tools: nothing to choose


@pytest.mark.parametrize(
    ("fields", "start"),
    [
        ({"tools": [{"type": "bash_20250124", "name": "bash"}]}, "tools.0.type: "),
        ({"tools": [{"name": "f"}]}, "tools.0.input_schema: "),
        ({"mcp_servers": [{"type": "url", "url": "http://x"}]}, "mcp_servers: "),
        ({"stop_sequences": ["a", "b", "c", "d", "e"]}, "stop_sequences: "),
        ({"output_format": {"type": "regex"}}, "output_format: "),
        (
            {"tool_choice": {"type": "tool"}, "tools": [{"name": "f", "input_schema": {}}]},
            "tool_choice.name",
        ),
        ({"temperature": 1.5}, "temperature: "),
        ({"messages": []}, "messages: "),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages.0.role: "),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "image", "source": {"type": "file", "file_id": "f"}}],
                    }
                ]
            },
            "messages.0.content.0: images of source type 'file'",
        ),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "document",
                                "source": {
                                    "type": "base64",
                                    "media_type": "application/pdf",
                                    "data": "x",
                                },
                            }
                        ],
                    }
                ]
            },
            "messages.0.content.0: documents of source type 'base64'",
        ),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}],
                    }
                ]
            },
            "messages.0.content.0: tool_use blocks belong in assistant turns",
        ),
        (
            {
                "messages": [
                    {"role": "assistant", "content": [{"type": "tool_result", "tool_use_id": "t"}]}
                ]
            },
            "messages.0.content.0: tool_result blocks belong in user turns",
        ),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "tool_result",
                                "tool_use_id": "t",
                                "content": [
                                    {"type": "image", "source": {"type": "url", "url": "u"}}
                                ],
                            }
                        ],
                    }
                ]
            },
            "messages.0.content.0.content.0: images in a tool result",
        ),
    ],
)
def test_refusals_name_the_field(fields: dict[str, Any], start: str) -> None:
    assert refusal(**fields).startswith(start)


def test_error_bodies() -> None:
    cases: list[tuple[GatewayError, str]] = [
        (InvalidRequest("bad"), "invalid_request_error"),
        (RateLimited("slow down"), "rate_limit_error"),
        (ServiceUnavailable("full"), "overloaded_error"),
        (GatewayError("boom"), "api_error"),
    ]
    for error, kind in cases:
        body = json.loads(MESSAGES.error_body(error))
        assert MessagesError.model_validate(body).error.type == kind
        assert body == {"type": "error", "error": {"type": kind, "message": error.message}}
    assert errors.error_type(413) == "request_too_large"
    assert errors.error_type(404) == "not_found_error"
    openai = json.dumps({"error": {"message": "no", "type": "invalid_request_error"}}).encode()
    assert json.loads(errors.from_openai(400, openai))["error"] == {
        "type": "invalid_request_error",
        "message": "no",
    }
    assert json.loads(errors.from_openai(502, b"<html>"))["error"]["message"] == "<html>"


def chat_answer(
    finish: str, content: str | None, calls: list[Any] | None = None, **choice: Any
) -> dict[str, Any]:
    answer: dict[str, Any] = {"role": "assistant", "content": content}
    if calls is not None:
        answer["tool_calls"] = calls
    return {
        "id": "chatcmpl-abc",
        "choices": [{"index": 0, "message": answer, "finish_reason": finish, **choice}],
        "usage": {
            "prompt_tokens": 9,
            "completion_tokens": 3,
            "prompt_tokens_details": {"cached_tokens": 5},
        },
    }


def test_message_from_a_chat_answer() -> None:
    body = message(chat_answer("stop", "Hi"), "claude-x", [])
    MessagesResponse.model_validate(body)
    assert body == {
        "id": "msg_abc",
        "type": "message",
        "role": "assistant",
        "model": "claude-x",
        "content": [{"type": "text", "text": "Hi"}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {
            "input_tokens": 4,
            "output_tokens": 3,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 5,
        },
    }
    vllm = message(chat_answer("stop", "Hi", stop_reason="END"), "m", ["END"])
    assert (vllm["stop_reason"], vllm["stop_sequence"]) == ("stop_sequence", "END")
    assert message(chat_answer("length", "Hi"), "m", [])["stop_reason"] == "max_tokens"
    assert message(chat_answer("content_filter", ""), "m", [])["stop_reason"] == "refusal"
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
    used = message(chat_answer("tool_calls", None, [call]), "m", [])
    assert used["stop_reason"] == "tool_use"
    assert used["content"] == [{"type": "tool_use", "id": "c1", "name": "f", "input": {"a": 1}}]
    cut = {**call, "function": {"name": "f", "arguments": '{"a": '}}
    assert message(chat_answer("length", None, [cut]), "m", [])["content"][0]["input"] == {}


def sse(*objects: Any) -> bytes:
    return b"".join(
        b"data: " + (o if isinstance(o, bytes) else json.dumps(o).encode()) + b"\n\n"
        for o in objects
    )


def parsed(out: bytes) -> list[dict[str, Any]]:
    """The events of ``out``, each checked against the wire types and its ``event:`` line."""
    found = []
    for block in out.decode().strip().split("\n\n"):
        name_line, data_line = block.split("\n")
        data = json.loads(data_line.removeprefix("data: "))
        assert name_line == f"event: {data['type']}"
        EVENTS.validate_python(data)
        found.append(data)
    return found


def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def test_stream_split_anywhere_gives_the_same_events() -> None:
    stream = sse(
        chunk({"role": "assistant", "content": ""}),
        chunk({"content": "Hé"}),
        chunk(
            {"tool_calls": [{"index": 0, "id": "c1", "function": {"name": "f", "arguments": ""}}]}
        ),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"a":'}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": "1}"}}]}),
        chunk(
            {"tool_calls": [{"index": 1, "id": "c2", "function": {"name": "g", "arguments": "{}"}}]}
        ),
        chunk({}, "tool_calls"),
        {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 4}},
        b"[DONE]",
    ).replace(b"\n\n", b"\r\n\r\n", 2)
    whole = StreamTranscoder("m", [])
    expected = parsed(whole.start() + whole.feed(stream) + whole.close())
    for size in (1, 7, 64):
        split = StreamTranscoder("m", [])
        out = split.start()
        for i in range(0, len(stream), size):
            out += split.feed(stream[i : i + size])
        out += split.close()
        events = parsed(out)
        events[0]["message"]["id"] = expected[0]["message"]["id"]
        assert events == expected
    assert [e["type"] for e in expected] == [
        "message_start",
        "ping",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert expected[5]["content_block"] == {
        "type": "tool_use",
        "id": "c1",
        "name": "f",
        "input": {},
    }
    assert expected[9]["index"] == 2
    assert expected[12]["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert expected[12]["usage"]["output_tokens"] == 4


def test_stream_failures_are_error_events() -> None:
    failed = StreamTranscoder("m", [])
    out = parsed(
        failed.start()
        + failed.feed(
            sse(chunk({"content": "a"}), {"error": {"message": "boom", "type": "server_error"}})
        )
        + failed.feed(sse(chunk({"content": "ignored"})))
        + failed.close()
    )
    assert out[-1] == {"type": "error", "error": {"type": "api_error", "message": "boom"}}
    assert [e["type"] for e in out].count("error") == 1
    cut = StreamTranscoder("m", [])
    tail = parsed(cut.start() + cut.feed(sse(chunk({"content": "a"}))) + cut.close())[-1]
    assert tail["type"] == "error" and "ended before" in tail["error"]["message"]
    interleaved = StreamTranscoder("m", [])
    calls = [
        chunk(
            {"tool_calls": [{"index": 0, "id": "a", "function": {"name": "f", "arguments": "{"}}]}
        ),
        chunk(
            {"tool_calls": [{"index": 1, "id": "b", "function": {"name": "g", "arguments": "{"}}]}
        ),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": "}"}}]}),
    ]
    last = parsed(interleaved.start() + interleaved.feed(sse(*calls)))[-1]
    assert last["type"] == "error" and "interleaved" in last["error"]["message"]


def test_the_models_endpoints_set_the_default_temperature_and_native_leniency() -> None:
    settings = build_settings(
        {
            "endpoints": [
                {
                    "name": "chat",
                    "kind": "openai",
                    "models": ["m"],
                    "api_key_env": "K",
                    "messages_temperature": 0.3,
                },
                {"name": "claude", "kind": "anthropic", "models": ["claude"], "api_key_env": "K"},
            ]
        },
        "test",
    )
    door = MessagesDoor(settings.routes())
    body: dict[str, Any] = {"max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
    assert door.parse({**body, "model": "m"}).temperature == 0.3
    assert door.parse({**body, "model": "m", "temperature": 0.9}).temperature == 0.9
    assert door.parse({**body, "model": "claude"}).temperature == 1.0
    server_tool = {"tools": [{"type": "web_search_20250305", "name": "web_search"}]}
    with pytest.raises(InvalidRequest):
        door.parse({**body, **server_tool, "model": "m"})
    relayed = door.parse({**body, **server_tool, "model": "claude", "system": "s"})
    assert [m.model_dump(exclude_unset=True) for m in relayed.messages] == [
        {"role": "user", "content": "s\n\nhi"}
    ]
    assert relayed.tools is None and relayed.max_tokens == 5
    searched = [
        {"role": "user", "content": "find it"},
        {
            "role": "assistant",
            "content": [
                {"type": "server_tool_use", "id": "s1", "name": "web_search", "input": {}},
                {"type": "web_search_tool_result", "tool_use_id": "s1", "content": []},
                {"type": "text", "text": "found"},
            ],
        },
    ]
    unknown = door.parse({**body, "model": "claude", "messages": searched})
    assert unknown.messages[0].content == "find it\n\nfound"
    with pytest.raises(InvalidRequest):
        door.parse({**body, "model": "m", "messages": searched})
    with pytest.raises(InvalidRequest):  # no max_tokens: not even relayed
        door.parse({"model": "claude", "messages": searched})
