"""The Responses door's pure parts: a request translated to the internal chat request,
chat answers and streams transcoded back (checked with the openai SDK's own types)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from openai.types.responses import Response as SDKResponse
from pydantic import TypeAdapter

from gateway.apis.responses.door import ResponsesDoor
from gateway.apis.responses.store import Limits, MemoryResponseStore
from gateway.apis.responses.transcode import StreamTranscoder, base_response, from_completion
from gateway.apis.responses.translate import TranslatedRequest
from gateway.errors import InvalidRequest

DOOR = ResponsesDoor(MemoryResponseStore(Limits(ttl_s=60, max_responses=10, max_bytes=1 << 20)))
APPLY_PATCH_GRAMMAR = 'start: begin_patch hunk+ end_patch\nbegin_patch: "*** Begin Patch" LF\n'


def parse(**body: Any) -> TranslatedRequest:
    request = DOOR.parse({"model": "m", **body})
    assert isinstance(request, TranslatedRequest)
    return request


def test_a_string_input_is_one_user_message_after_the_instructions() -> None:
    request = parse(input="Hi", instructions="Be brief.", max_output_tokens=7, temperature=0)
    assert request.model_dump(exclude_unset=True) == {
        "model": "m",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi"},
        ],
        "stream": False,
        "temperature": 0.0,
        "max_tokens": 7,
    }


def test_a_codex_turn_maps_roles_calls_and_outputs_and_drops_reasoning() -> None:
    request = parse(
        input=[
            {
                "type": "message",
                "role": "developer",
                "content": [{"type": "input_text", "text": "Rules."}],
            },
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "Fix "},
                    {"type": "input_text", "text": "it"},
                ],
            },
            {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "gAAAA"},
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "Reading."}],
            },
            {
                "type": "function_call",
                "call_id": "c1",
                "name": "shell",
                "arguments": '{"cmd":"cat a"}',
            },
            {
                "type": "custom_tool_call",
                "call_id": "c2",
                "name": "apply_patch",
                "input": "*** Begin Patch",
            },
            {"type": "function_call_output", "call_id": "c1", "output": "1\tx = 1"},
            {
                "type": "custom_tool_call_output",
                "call_id": "c2",
                "output": [{"type": "input_text", "text": "ok"}],
            },
        ],
        stream=True,
        store=False,
        include=["reasoning.encrypted_content"],
        prompt_cache_key="k",
        client_metadata={"a": "b"},
        reasoning={"effort": "high"},
    )
    messages = request.model_dump(exclude_unset=True)["messages"]
    assert messages == [
        {"role": "system", "content": "Rules."},
        {"role": "user", "content": "Fix it"},
        {
            "role": "assistant",
            "content": "Reading.",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "shell", "arguments": '{"cmd":"cat a"}'},
                },
                {
                    "id": "c2",
                    "type": "custom",
                    "custom": {"name": "apply_patch", "input": "*** Begin Patch"},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "1\tx = 1"},
        {"role": "tool", "tool_call_id": "c2", "content": "ok"},
    ]
    assert request.stream_options is not None and request.stream_options.include_usage


def test_function_and_custom_tools_map_and_hosted_ones_are_dropped() -> None:
    request = parse(
        input="x",
        tools=[
            {"type": "function", "name": "read", "parameters": {"type": "object"}, "strict": False},
            {
                "type": "custom",
                "name": "apply_patch",
                "description": "Edit files.",
                "format": {"type": "grammar", "syntax": "lark", "definition": APPLY_PATCH_GRAMMAR},
            },
            {"type": "web_search"},
            {"type": "namespace", "name": "mcp", "description": "d", "tools": []},
        ],
        tool_choice={"type": "custom", "name": "apply_patch"},
        parallel_tool_calls=False,
    )
    assert request.tools == [
        {
            "type": "function",
            "function": {"name": "read", "parameters": {"type": "object"}, "strict": False},
        },
        {
            "type": "custom",
            "custom": {
                "name": "apply_patch",
                "description": "Edit files.",
                "format": {
                    "type": "grammar",
                    "grammar": {"syntax": "lark", "definition": APPLY_PATCH_GRAMMAR},
                },
            },
        },
    ]
    assert request.tool_choice == {"type": "custom", "custom": {"name": "apply_patch"}}
    assert request.model_extra == {"parallel_tool_calls": False}


def test_text_format_json_schema_becomes_response_format() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    request = parse(
        input="x",
        text={"format": {"type": "json_schema", "name": "A", "schema": schema, "strict": True}},
    )
    assert request.model_extra == {
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "A", "schema": schema, "strict": True},
        }
    }


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": [{"type": "item_reference", "id": "x"}]}, "input.0"),
        ({"input": [{"type": "function_call", "call_id": "c"}]}, "input.0.name"),
        ({"input": [{"role": "robot", "content": "x"}]}, "input.0.role"),
        ({"input": "x", "background": True}, "background"),
        ({"input": "x", "text": {"format": {"type": "xml"}}}, "text.format"),
        ({"input": "x", "tools": [{"type": "function", "name": "bad name!"}]}, "tools.0.name"),
        ({"input": "x", "tool_choice": {"type": "web_search"}}, "tool_choice"),
        ({"input": "x", "tool_choice": "required"}, "tool_choice"),
        ({"input": []}, "input"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]},
            "input.0.content.0",
        ),
    ],
)
def test_malformed_or_unsupported_input_is_a_400_naming_the_field(
    body: dict[str, Any], param: str
) -> None:
    with pytest.raises(InvalidRequest) as caught:
        DOOR.parse({"model": "m", **body})
    assert caught.value.status == 400
    assert caught.value.param == param
    error = json.loads(DOOR.error_body(caught.value))["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param


def test_an_internal_field_name_in_an_error_is_the_clients() -> None:
    error = InvalidRequest("prompt has 9000 tokens; the model's context is 8192", param="messages")
    assert json.loads(DOOR.error_body(error))["error"]["param"] == "input"


def _response(**fields: Any) -> Any:
    return base_response(parse(input="x", **fields).source, "resp_1")


def test_a_completion_with_text_and_a_call_is_a_message_and_a_function_call() -> None:
    body = {
        "choices": [
            {
                "index": 0,
                "finish_reason": "tool_calls",
                "message": {
                    "role": "assistant",
                    "content": "Reading.",
                    "tool_calls": [
                        {
                            "id": "call_9",
                            "type": "function",
                            "function": {"name": "read", "arguments": "{}"},
                        }
                    ],
                },
            }
        ],
        "usage": {
            "prompt_tokens": 5,
            "completion_tokens": 3,
            "total_tokens": 8,
            "prompt_tokens_details": {"cached_tokens": 2},
        },
    }
    response = SDKResponse.model_validate(
        from_completion(body, _response(metadata={"k": "v"})).model_dump(mode="json")
    )
    assert response.status == "completed" and response.output_text == "Reading."
    message, call = response.output
    assert call.type == "function_call" and call.call_id == "call_9" and call.name == "read"
    assert response.usage is not None and response.usage.input_tokens_details.cached_tokens == 2
    assert response.metadata == {"k": "v"} and response.usage.total_tokens == 8


def test_a_length_finish_is_incomplete() -> None:
    body = {"choices": [{"finish_reason": "length", "message": {"content": "abc"}}]}
    response = from_completion(body, _response())
    assert response.status == "incomplete"
    assert response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"


def _events(raw: bytes) -> list[dict[str, Any]]:
    events = []
    for block in raw.decode().split("\n\n"):
        if block:
            name, data = block.split("\n")
            event = json.loads(data.removeprefix("data: "))
            assert name == f"event: {event['type']}"
            events.append(event)
    return events


def test_a_stream_numbers_its_events_and_its_items_agree_with_the_final_response() -> None:
    stream = StreamTranscoder(_response())
    out = stream.start()
    for delta in (
        {"role": "assistant", "content": ""},
        {"content": "Hel"},
        {"content": "lo"},
        {
            "tool_calls": [
                {
                    "index": 0,
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "f", "arguments": ""},
                }
            ]
        },
        {"tool_calls": [{"index": 0, "function": {"arguments": '{"a"'}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": ": 1}"}}]},
        {
            "tool_calls": [
                {
                    "index": 1,
                    "id": "call_2",
                    "type": "custom",
                    "custom": {"name": "apply_patch", "input": "*** "},
                }
            ]
        },
        {"tool_calls": [{"index": 1, "custom": {"input": "Begin Patch"}}]},
    ):
        out += stream.chunk({"choices": [{"index": 0, "delta": delta, "finish_reason": None}]})
    out += stream.chunk({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
    out += stream.chunk({"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 6}})
    out += stream.close() + stream.final()
    events = _events(out)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert [e["type"] for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.output_item.added",
        "response.custom_tool_call_input.delta",
        "response.custom_tool_call_input.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.custom_tool_call_input.done",
        "response.output_item.done",
        "response.completed",
    ]
    final = SDKResponse.model_validate(events[-1]["response"])
    done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert [item.id for item in final.output] == [item["id"] for item in done]
    message, call, custom = final.output
    assert final.output_text == "Hello"
    assert call.type == "function_call" and (call.call_id, call.arguments) == ("call_1", '{"a": 1}')
    assert custom.type == "custom_tool_call" and custom.input == "*** Begin Patch"
    assert final.usage is not None and final.usage.total_tokens == 10


def test_a_stream_that_fails_ends_with_an_error_and_response_failed() -> None:
    stream = StreamTranscoder(_response())
    out = stream.start()
    out += stream.chunk({"choices": [{"index": 0, "delta": {"content": "par"}}]})
    out += stream.fail("the upstream went away", "stream_interrupted")
    events = _events(out)
    assert [e["type"] for e in events][-2:] == ["error", "response.failed"]
    assert events[-2]["message"] == "the upstream went away"
    failed = SDKResponse.model_validate(events[-1]["response"])
    assert failed.status == "failed" and failed.error is not None


def test_the_wire_types_validate_as_the_sdk_s_own() -> None:
    """Every event the transcoder writes is one the openai SDK's event union accepts."""
    from openai.types.responses import ResponseStreamEvent

    stream = StreamTranscoder(_response())
    out = stream.start() + stream.chunk({"choices": [{"index": 0, "delta": {"content": "a"}}]})
    out += stream.close() + stream.final()
    adapter: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)
    for event in _events(out):
        assert adapter.validate_python(event).type == event["type"]


@pytest.mark.parametrize("size", [1, 7, 64, 100_000])
@pytest.mark.parametrize("newline", ["\n", "\r\n"])
async def test_a_relayed_stream_is_passed_unchanged_and_stored_before_its_last_event(
    size: int, newline: str
) -> None:
    from gateway.apis.responses.native import Relayed

    stream = StreamTranscoder(_response())
    raw = stream.start() + stream.chunk({"choices": [{"index": 0, "delta": {"content": "Hi"}}]})
    raw += stream.close() + stream.final()
    raw = raw.replace(b"\n", newline.encode())
    store = MemoryResponseStore(Limits(ttl_s=60, max_responses=10, max_bytes=1 << 20))
    sent: list[bytes] = []
    stored_when_final_went: list[bool] = []

    async def send(message: Any) -> None:
        body = message.get("body", b"")
        if b"response.completed" in body:
            stored_when_final_went.append(await store.get("alice", "resp_1") is not None)
        sent.append(body)

    relay = Relayed(store, "alice", parse(input="x"), [{"id": "msg_1"}], send)
    await relay(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"text/event-stream")],
        }
    )
    for start in range(0, len(raw), size):
        more = start + size < len(raw)
        await relay(
            {"type": "http.response.body", "body": raw[start : start + size], "more_body": more}
        )
    assert b"".join(sent) == raw
    assert stored_when_final_went == [True]
    kept = await store.get("alice", "resp_1")
    assert kept is not None and kept.input == [{"id": "msg_1"}]
    assert kept.response["output"][0]["content"][0]["text"] == "Hi"


def test_a_namespaces_tools_go_by_qualified_names_and_come_back_split() -> None:
    read = {"type": "function", "name": "read", "parameters": {"type": "object"}}
    request = parse(
        input=[
            {"role": "user", "content": "x"},
            {
                "type": "function_call",
                "call_id": "c1",
                "name": "read",
                "namespace": "fs",
                "arguments": "{}",
            },
            {"type": "function_call_output", "call_id": "c1", "output": "ok"},
        ],
        tools=[
            {"type": "namespace", "name": "fs", "description": "Files.", "tools": [read]},
            {"type": "namespace", "name": "x" * 63, "description": "Too long.", "tools": [read]},
        ],
    )
    assert request.tools == [
        {"type": "function", "function": {"name": "fs__read", "parameters": {"type": "object"}}}
    ]
    assert request.namespaced == {"fs__read": ("fs", "read")}
    messages = request.model_dump(exclude_unset=True)["messages"]
    assert messages[1]["tool_calls"][0]["function"]["name"] == "fs__read"
    body = {
        "choices": [
            {
                "finish_reason": "tool_calls",
                "message": {
                    "tool_calls": [
                        {
                            "id": "c2",
                            "type": "function",
                            "function": {"name": "fs__read", "arguments": "{}"},
                        }
                    ]
                },
            }
        ]
    }
    base = base_response(request.source, "resp_2")
    (call,) = SDKResponse.model_validate(
        from_completion(body, base, request.namespaced).model_dump(mode="json")
    ).output
    assert call.type == "function_call" and (call.namespace, call.name) == ("fs", "read")
    stream = StreamTranscoder(base_response(request.source, "resp_3"), request.namespaced)
    delta = {
        "tool_calls": [
            {
                "index": 0,
                "id": "c3",
                "type": "function",
                "function": {"name": "fs__read", "arguments": "{}"},
            }
        ]
    }
    out = stream.start() + stream.chunk({"choices": [{"index": 0, "delta": delta}]})
    out += stream.close() + stream.final()
    added = next(e for e in _events(out) if e["type"] == "response.output_item.added")
    assert (added["item"]["namespace"], added["item"]["name"]) == ("fs", "read")
