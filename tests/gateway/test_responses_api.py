"""``/v1/responses`` through the real ``openai`` client's Responses API: on the local
SmolLM2 engine, in front of a chat-completions endpoint (the OpenAI stand-in plays the
model, tool calls included), and relayed natively to an ``openai`` endpoint (the
Responses stand-in) with the gateway's own key swapped for the upstream's."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from gateway.app import create_app
from gateway.config import build_settings
from tests.gateway.servers import serve
from tests.openai_standin import ANSWER, Script, StandIn, tokens
from tests.responses_standin import ANSWER as NATIVE_ANSWER
from tests.responses_standin import ResponsesStandIn

UPSTREAM_KEY = "sk-upstream-secret-0123456789"
ENVIRON = {
    "STANDIN_KEY": UPSTREAM_KEY,
    "DRAFTGATE_KEY_ALICE": "alice-key",
    "DRAFTGATE_KEY_BOB": "bob-key",
}
LOCAL = "smollm2"
CHAT = "chat-model"  # a chat-completions upstream (the OpenAI stand-in)
NATIVE = "gpt-5"  # an openai endpoint: the Responses stand-in
READ_TOOL = {
    "type": "function",
    "name": "read_file",
    "description": "Read a file",
    "parameters": {
        "type": "object",
        "properties": {"path": {"type": "string"}},
        "required": ["path"],
    },
    "strict": False,
}
LISTING = "     1\tdef add(a, b):\n     2\t    return a + b\n"
CAP = 2  # the capped hosted endpoints' max_tokens_cap: fewer tokens than the stand-in's answer
LOCAL_CAP = 64  # the local endpoint's


@pytest.fixture(scope="module")
def native_standin() -> Iterator[tuple[ResponsesStandIn, str]]:
    standin = ResponsesStandIn()
    with serve(standin) as url:
        yield standin, url


@pytest.fixture(scope="module")
def gateway(
    engine: Any,
    standin_server: tuple[StandIn, str],
    native_standin: tuple[ResponsesStandIn, str],
) -> Iterator[str]:
    settings = build_settings(
        {
            "endpoints": [
                {
                    "name": "local",
                    "kind": "local",
                    "model": "smollm2-135m",
                    "models": [LOCAL],
                    "max_tokens_cap": LOCAL_CAP,
                },
                {
                    "name": "chat",
                    "kind": "openai_compatible",
                    "base_url": f"{standin_server[1]}/v1",
                    "api_key_env": "STANDIN_KEY",
                    "health_check": False,
                    "retries": 0,
                    "models": [{"name": CHAT, "upstream": "gpt-4o-mini"}, "bad-request"],
                },
                {
                    "name": "native",
                    "kind": "openai",
                    "base_url": f"{native_standin[1]}/v1",
                    "api_key_env": "STANDIN_KEY",
                    "retries": 0,
                    "models": [{"name": NATIVE, "upstream": "gpt-5-2025"}],
                },
                {  # the same upstreams behind endpoints whose max_tokens_cap is CAP
                    "name": "chat-capped",
                    "kind": "openai_compatible",
                    "base_url": f"{standin_server[1]}/v1",
                    "api_key_env": "STANDIN_KEY",
                    "health_check": False,
                    "retries": 0,
                    "max_tokens_cap": CAP,
                    "models": [{"name": "capped-chat", "upstream": "gpt-4o-mini"}],
                },
                {
                    "name": "native-capped",
                    "kind": "openai",
                    "base_url": f"{native_standin[1]}/v1",
                    "api_key_env": "STANDIN_KEY",
                    "retries": 0,
                    "max_tokens_cap": CAP,
                    "models": [{"name": "capped-gpt", "upstream": "gpt-5-2025"}],
                },
            ],
            "keys": [
                {"key_env": "DRAFTGATE_KEY_ALICE", "tenant": "alice"},
                {"key_env": "DRAFTGATE_KEY_BOB", "tenant": "bob"},
            ],
        },
        "test",
    )
    app = create_app(settings, environ=ENVIRON, engines={"local": engine})
    with serve(app) as url:
        yield url


@pytest.fixture
def alice(gateway: str) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{gateway}/v1", api_key="alice-key", max_retries=0) as client:
        yield client


@pytest.fixture
def bob(gateway: str) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{gateway}/v1", api_key="bob-key", max_retries=0) as client:
        yield client


# -- the local engine ------------------------------------------------------------------


def test_local_text_is_the_chat_routes_answer_to_the_same_conversation(
    alice: openai.OpenAI,
) -> None:
    response = alice.responses.create(
        model=LOCAL,
        instructions="You are terse.",
        input="Name a colour.",
        max_output_tokens=12,
        temperature=0,
    )
    chat = alice.chat.completions.create(
        model=LOCAL,
        messages=[
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Name a colour."},
        ],
        max_tokens=12,
        temperature=0,
    )
    assert response.output_text == chat.choices[0].message.content
    assert response.output_text
    assert response.status == (
        "incomplete" if chat.choices[0].finish_reason == "length" else "completed"
    )
    assert response.usage is not None and chat.usage is not None
    assert response.usage.input_tokens == chat.usage.prompt_tokens
    assert response.usage.output_tokens == chat.usage.completion_tokens


def test_local_stream_events_agree_with_the_final_response(alice: openai.OpenAI) -> None:
    plain = alice.responses.create(
        model=LOCAL, input="Count to five.", max_output_tokens=16, temperature=0, store=False
    )
    events = list(
        alice.responses.create(
            model=LOCAL,
            input="Count to five.",
            max_output_tokens=16,
            temperature=0,
            store=False,
            stream=True,
        )
    )
    numbers = [e.sequence_number for e in events]
    assert numbers == list(range(len(events)))
    assert [e.type for e in events[:2]] == ["response.created", "response.in_progress"]
    last = events[-1]
    assert last.type == f"response.{plain.status}"
    assert last.type in ("response.completed", "response.incomplete")
    final = last.response
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == final.output_text == plain.output_text
    done = [e.item.id for e in events if e.type == "response.output_item.done"]
    assert done == [item.id for item in final.output]
    with pytest.raises(openai.NotFoundError):  # store: false keeps nothing
        alice.responses.retrieve(final.id)


def test_previous_response_id_continues_the_tenants_own_conversation_only(
    alice: openai.OpenAI, bob: openai.OpenAI
) -> None:
    first = alice.responses.create(
        model=LOCAL, input="My name is Ada.", max_output_tokens=8, temperature=0, store=True
    )
    second = alice.responses.create(
        model=LOCAL,
        input="What is my name?",
        previous_response_id=first.id,
        max_output_tokens=8,
        temperature=0,
    )
    assert second.previous_response_id == first.id
    assert alice.responses.retrieve(second.id).output_text == second.output_text
    items = alice.responses.input_items.list(second.id, order="asc")
    texts = [
        (item.role, item.content[0].text if not isinstance(item.content, str) else item.content)
        for item in items.data
        if item.type == "message"
    ]
    assert texts == [
        ("user", "My name is Ada."),
        ("assistant", first.output_text),
        ("user", "What is my name?"),
    ]
    # the same answer as the whole conversation sent at once
    whole = alice.responses.create(
        model=LOCAL,
        input=[
            {"role": "user", "content": "My name is Ada."},
            {"role": "assistant", "content": first.output_text},
            {"role": "user", "content": "What is my name?"},
        ],
        max_output_tokens=8,
        temperature=0,
        store=False,
    )
    assert whole.output_text == second.output_text

    for attempt in (
        lambda: bob.responses.retrieve(first.id),
        lambda: bob.responses.input_items.list(first.id),
        lambda: bob.responses.delete(first.id),
        lambda: bob.responses.create(
            model=LOCAL, input="And mine?", previous_response_id=first.id, max_output_tokens=4
        ),
    ):
        with pytest.raises(openai.NotFoundError) as caught:
            attempt()
        assert "Ada" not in str(caught.value.body)
    alice.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        alice.responses.retrieve(first.id)
    assert alice.responses.retrieve(second.id).id == second.id


def test_a_prompt_past_the_context_is_a_400_naming_both_numbers(alice: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        alice.responses.create(model=LOCAL, input="word " * 6000, max_output_tokens=4)
    error = caught.value.body
    assert isinstance(error, dict)
    assert error["param"] == "input" and error["code"] == "context_length_exceeded"
    assert "4096" in error["message"] and "tokens" in error["message"]


@pytest.mark.parametrize("stream", [False, True])
def test_a_custom_tool_on_a_local_model_is_a_400_naming_it(gateway: str, stream: bool) -> None:
    """Codex's ``apply_patch`` (a custom tool with a Lark grammar) beside a function tool:
    a 400 in OpenAI's error shape naming the tool, before any stream starts."""
    body = {
        "model": LOCAL,
        "input": "Edit a.py",
        "stream": stream,
        "tools": [READ_TOOL, APPLY_PATCH],
    }
    headers = {"Authorization": "Bearer alice-key"}
    answer = httpx.post(f"{gateway}/v1/responses", json=body, headers=headers, timeout=60)
    assert answer.status_code == 400
    assert answer.headers["content-type"].startswith("application/json")
    error = answer.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert (error["type"], error["param"], error["code"]) == (
        "invalid_request_error",
        "tools",
        "unsupported_parameter",
    )
    assert error["message"].startswith("tools: the custom tool 'apply_patch' is not supported")


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input.0"),
        ({"input": [{"type": "function_call_output", "output": "x"}]}, "input.0.call_id"),
        ({"input": "x", "text": {"format": {"type": "yaml"}}}, "text.format"),
        ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
    ],
)
def test_malformed_bodies_are_400s_in_openais_shape(
    gateway: str, body: dict[str, Any], param: str
) -> None:
    answer = httpx.post(
        f"{gateway}/v1/responses",
        json={"model": LOCAL, **body},
        headers={"Authorization": "Bearer alice-key"},
    )
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param


# -- a chat-completions upstream ---------------------------------------------------------


def test_a_function_tool_round_through_a_chat_upstream(
    alice: openai.OpenAI, standin: StandIn
) -> None:
    standin.script = Script(
        calls=lambda body: (
            [] if body["messages"][-1]["role"] == "tool" else [("read_file", {"path": "a.py"})]
        )
    )
    first = alice.responses.create(model=CHAT, input="Read a.py", tools=[READ_TOOL])
    (call,) = first.output
    assert call.type == "function_call" and call.name == "read_file"
    assert json.loads(call.arguments) == {"path": "a.py"}
    sent = standin.bodies()[-1]
    assert sent["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "read_file",
                "description": "Read a file",
                "parameters": READ_TOOL["parameters"],
                "strict": False,
            },
        }
    ]
    with alice.responses.stream(
        model=CHAT,
        input=[
            {"role": "user", "content": "Read a.py"},
            {
                "type": "function_call",
                "call_id": call.call_id,
                "name": call.name,
                "arguments": call.arguments,
            },
            {"type": "function_call_output", "call_id": call.call_id, "output": LISTING},
        ],
        tools=[READ_TOOL],
    ) as stream:
        second = stream.get_final_response()
    assert second.output_text == ANSWER
    messages = standin.bodies()[-1]["messages"]
    assert messages[1]["tool_calls"][0]["id"] == call.call_id
    assert messages[2] == {"role": "tool", "tool_call_id": call.call_id, "content": LISTING}


def test_a_streamed_call_keeps_its_ids_from_the_first_event_to_the_last(
    alice: openai.OpenAI, standin: StandIn
) -> None:
    standin.script = Script(calls=lambda body: [("read_file", {"path": "b.py"})])
    with alice.responses.stream(model=CHAT, input="Read b.py", tools=[READ_TOOL]) as stream:
        events = list(stream)
        final = stream.get_final_response()
    added = next(e for e in events if e.type == "response.output_item.added")
    arguments = next(e for e in events if e.type == "response.function_call_arguments.done")
    (item,) = final.output
    assert item.type == "function_call" and added.item.type == "function_call"
    assert added.item.id == arguments.item_id == item.id
    assert added.item.call_id == item.call_id and item.call_id.startswith("call_standin_")
    assert json.loads(arguments.arguments) == {"path": "b.py"}


APPLY_PATCH = {
    "type": "custom",
    "name": "apply_patch",
    "description": "Edit files. This is a FREEFORM tool, so do not wrap the patch in JSON.",
    "format": {
        "type": "grammar",
        "syntax": "lark",
        "definition": 'start: begin_patch hunk+ end_patch\nbegin_patch: "*** Begin Patch" LF\n',
    },
}


@pytest.mark.parametrize("model_tools", ["unknown-model", "gpt-5.5"])
def test_a_codex_shaped_request_is_answered(
    gateway: str, standin: StandIn, model_tools: str
) -> None:
    """What Codex CLI 0.171 sends (recorded): for a model name it does not know, function
    tools, a ``namespace`` and ``web_search``; for ``gpt-5.5``, ``apply_patch`` as a custom
    tool with a Lark grammar and ``tool_search``. Tools no other model can run are
    dropped, the rest goes on."""
    exec_command = {
        "type": "function",
        "name": "exec_command",
        "description": "Runs a command",
        "strict": False,
        "parameters": {
            "type": "object",
            "properties": {"cmd": {"type": "string"}},
            "required": ["cmd"],
            "additionalProperties": False,
        },
    }
    hosted: list[dict[str, Any]] = [
        {"type": "web_search", "external_web_access": False},
        {
            "type": "namespace",
            "name": "multi_agent_v1",
            "description": "Tools for spawning and managing sub-agents.",
            "tools": [{**exec_command, "name": "close_agent"}],
        },
    ]
    if model_tools == "gpt-5.5":
        tools = [exec_command, APPLY_PATCH, {"type": "tool_search", "execution": "client"}]
    else:
        tools = [exec_command, *hosted]
    text = "<environment_context><cwd>/w</cwd></environment_context>"
    body = {
        "model": CHAT,
        "input": [
            {
                "type": "message",
                "role": "developer",
                "content": [{"type": "input_text", "text": "You are Codex."}],
            },
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
            {"type": "reasoning", "summary": [], "encrypted_content": "gAAAAB"},
        ],
        "tools": tools,
        "tool_choice": "auto",
        "parallel_tool_calls": True,
        "reasoning": {"effort": "medium", "summary": "auto"},
        "store": False,
        "stream": True,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "019a-session",
        "client_metadata": {"session_id": "019a-session", "x-codex-turn-metadata": "{}"},
        "text": {"verbosity": "low"},
    }
    with httpx.stream(
        "POST",
        f"{gateway}/v1/responses",
        json=body,
        headers={"Authorization": "Bearer alice-key"},
    ) as answer:
        assert answer.status_code == 200
        lines = [line for line in answer.iter_lines() if line]
    assert "data: [DONE]" not in lines
    events = [json.loads(line[6:]) for line in lines if line.startswith("data: ")]
    assert events[-1]["type"] == "response.completed"
    assert events[-1]["response"]["output"][0]["content"][0]["text"] == ANSWER
    sent = standin.bodies()[-1]
    names = [t[t["type"]]["name"] for t in sent["tools"]]
    assert names == (
        ["exec_command", "apply_patch"]
        if model_tools == "gpt-5.5"
        else ["exec_command", "multi_agent_v1__close_agent"]
    )
    assert sent["messages"] == [
        {"role": "system", "content": "You are Codex."},
        {"role": "user", "content": text},
        {"role": "user", "content": "hi"},
    ]


def test_an_upstream_failure_mid_stream_is_an_error_then_response_failed(
    alice: openai.OpenAI, standin: StandIn
) -> None:
    standin.script = Script(error_after=1)
    stream = alice.responses.create(model=CHAT, input="Say hello", stream=True)
    events = list(stream)
    assert [e.type for e in events][-2:] == ["error", "response.failed"]
    failed = events[-1]
    assert failed.type == "response.failed" and failed.response.error is not None


# -- an openai endpoint: the Responses API itself ---------------------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_max_output_tokens_past_a_cap_is_clamped(
    alice: openai.OpenAI,
    standin: StandIn,
    native_standin: tuple[ResponsesStandIn, str],
    stream: bool,
) -> None:
    """Past an endpoint's cap ``max_output_tokens`` is clamped, never refused: a chat
    upstream is asked for the cap and the answer it cut is ``incomplete``
    (``max_output_tokens``); an ``openai`` endpoint gets the body with the cap in it."""
    common: dict[str, Any] = {"input": "Hi", "store": False, "max_output_tokens": 32000}
    if stream:  # the SDK's stream helper waits for response.completed: the events as sent
        last = list(alice.responses.create(model="capped-chat", stream=True, **common))[-1]
        assert last.type == "response.incomplete"
        cut = last.response
    else:
        cut = alice.responses.create(model="capped-chat", **common)
    assert standin.bodies()[-1]["max_tokens"] == CAP
    assert cut.status == "incomplete"
    assert cut.incomplete_details is not None
    assert cut.incomplete_details.reason == "max_output_tokens"
    assert cut.output_text == "".join(tokens(ANSWER)[:CAP])
    alice.responses.create(model="capped-gpt", stream=stream, **common)
    assert native_standin[0].requests[-1].body["max_output_tokens"] == CAP


def test_max_output_tokens_past_the_local_cap_is_clamped(alice: openai.OpenAI) -> None:
    response = alice.responses.create(
        model=LOCAL,
        input="Tell me a long story about a dragon and a knight.",
        max_output_tokens=100_000,
        temperature=0,
        store=False,
    )
    assert response.status == "incomplete"
    assert response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.usage is not None and response.usage.output_tokens == LOCAL_CAP


def test_an_openai_endpoint_gets_the_body_as_sent_with_its_own_key(
    alice: openai.OpenAI, native_standin: tuple[ResponsesStandIn, str]
) -> None:
    standin = native_standin[0]
    response = alice.responses.create(
        model=NATIVE, input="Hi", store=False, metadata={"k": "v"}, max_output_tokens=9
    )
    assert response.output_text == NATIVE_ANSWER
    seen = standin.requests[-1]
    assert seen.path == "/v1/responses"
    assert seen.headers["authorization"] == f"Bearer {UPSTREAM_KEY}"
    assert seen.body == {
        "model": "gpt-5-2025",
        "input": "Hi",
        "store": False,
        "metadata": {"k": "v"},
        "max_output_tokens": 9,
    }
    with alice.responses.stream(model=NATIVE, input="Hi", store=False) as stream:
        final = stream.get_final_response()
    assert (
        final.output_text == NATIVE_ANSWER and final.id == f"resp_standin_{len(standin.requests)}"
    )


def test_a_function_tool_round_on_the_local_model(alice: openai.OpenAI) -> None:
    """``tool_choice`` required: the grammar makes the model's answer one call matching
    the tool's schema; the call and its output then go back as the next turn's input."""
    plain = alice.responses.create(
        model=LOCAL,
        input="Read the file a.py.",
        tools=[READ_TOOL],
        tool_choice="required",
        max_output_tokens=48,
        temperature=0,
        store=False,
    )
    with alice.responses.stream(
        model=LOCAL,
        input="Read the file a.py.",
        tools=[READ_TOOL],
        tool_choice="required",
        max_output_tokens=48,
        temperature=0,
        store=False,
    ) as stream:
        events = list(stream)
        first = stream.get_final_response()
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert [e.arguments for e in done] == [item.arguments for item in plain.output]
    (call,) = first.output
    assert call.type == "function_call" and call.name == "read_file"
    arguments = json.loads(call.arguments)
    assert isinstance(arguments, dict) and isinstance(arguments["path"], str)
    with alice.responses.stream(
        model=LOCAL,
        input=[
            {"role": "user", "content": "Read the file a.py."},
            {
                "type": "function_call",
                "call_id": call.call_id,
                "name": call.name,
                "arguments": call.arguments,
            },
            {"type": "function_call_output", "call_id": call.call_id, "output": LISTING},
        ],
        tools=[READ_TOOL],
        tool_choice="none",
        max_output_tokens=8,
        temperature=0,
        store=False,
    ) as stream:
        events = list(stream)
    last = events[-1]
    assert last.type in ("response.completed", "response.incomplete")
    assert [item.type for item in last.response.output] == ["message"]
    assert last.response.output_text


@pytest.fixture
def redis_gateway(
    redis_url: str,
    redis_prefix: str,
    redis_client: Any,
    standin_server: tuple[StandIn, str],
    native_standin: tuple[ResponsesStandIn, str],
) -> Iterator[str]:
    """The chat and openai endpoints, responses stored in a real Redis."""
    settings = build_settings(
        {
            "endpoints": [
                {
                    "name": "chat",
                    "kind": "openai_compatible",
                    "base_url": f"{standin_server[1]}/v1",
                    "health_check": False,
                    "models": [{"name": CHAT, "upstream": "gpt-4o-mini"}],
                },
                {
                    "name": "native",
                    "kind": "openai",
                    "base_url": f"{native_standin[1]}/v1",
                    "api_key_env": "STANDIN_KEY",
                    "models": [{"name": NATIVE, "upstream": "gpt-5-2025"}],
                },
            ],
            "keys": [
                {"key_env": "DRAFTGATE_KEY_ALICE", "tenant": "alice"},
                {"key_env": "DRAFTGATE_KEY_BOB", "tenant": "bob"},
            ],
            "redis": {"url": redis_url, "prefix": redis_prefix},
        },
        "test",
    )
    with serve(create_app(settings, environ=ENVIRON)) as url:
        yield url


def test_a_conversation_stored_in_redis_continues_on_an_openai_endpoint_and_back(
    redis_gateway: str,
    redis_client: Any,
    redis_prefix: str,
    standin: StandIn,
    native_standin: tuple[ResponsesStandIn, str],
) -> None:
    alice = openai.OpenAI(base_url=f"{redis_gateway}/v1", api_key="alice-key", max_retries=0)
    bob = openai.OpenAI(base_url=f"{redis_gateway}/v1", api_key="bob-key", max_retries=0)
    first = alice.responses.create(model=CHAT, input="Hello?")
    assert first.output_text == ANSWER
    assert any(b"resp:" in key for key in redis_client.scan_iter(match=f"{redis_prefix}*"))
    seen = len(native_standin[0].requests)
    with pytest.raises(openai.NotFoundError):
        bob.responses.create(model=NATIVE, input="Go on.", previous_response_id=first.id)
    assert len(native_standin[0].requests) == seen  # nothing went upstream
    second = alice.responses.create(model=NATIVE, input="Go on.", previous_response_id=first.id)
    assert second.output_text == NATIVE_ANSWER
    sent = native_standin[0].requests[-1].body
    assert "previous_response_id" not in sent
    assert sent["input"] == [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hello?"}]},
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": ANSWER, "annotations": [], "logprobs": []}],
        },
        {"type": "message", "role": "user", "content": "Go on."},
    ]
    # the provider's answer is kept too (its own id), for alice only
    assert alice.responses.retrieve(second.id).output_text == NATIVE_ANSWER
    with pytest.raises(openai.NotFoundError):
        bob.responses.retrieve(second.id)
    with alice.responses.stream(
        model=NATIVE, input="More.", previous_response_id=second.id
    ) as stream:
        third = stream.get_final_response()
    assert alice.responses.retrieve(third.id).output_text == NATIVE_ANSWER
    sent = native_standin[0].requests[-1].body
    assert [item["role"] for item in sent["input"]] == ["user", "assistant"] * 2 + ["user"]
    assert sent["input"][3]["content"][0]["text"] == NATIVE_ANSWER


def test_text_format_json_schema_is_enforced_on_the_local_model(alice: openai.OpenAI) -> None:
    schema = {
        "type": "object",
        "properties": {"colour": {"type": "string", "enum": ["red", "green", "blue"]}},
        "required": ["colour"],
        "additionalProperties": False,
    }
    response = alice.responses.create(
        model=LOCAL,
        input="Pick a colour.",
        text={"format": {"type": "json_schema", "name": "pick", "schema": schema, "strict": True}},
        max_output_tokens=48,
        temperature=0,
        store=False,
    )
    assert response.status == "completed"
    assert json.loads(response.output_text)["colour"] in ("red", "green", "blue")


def test_input_items_are_listed_by_page_in_either_order(
    alice: openai.OpenAI, standin: StandIn, gateway: str
) -> None:
    stored = alice.responses.create(
        model=CHAT,
        input=[
            {"role": "developer", "content": "Be brief."},
            {"role": "user", "content": "one"},
            {"role": "user", "content": "two"},
        ],
    )
    newest = alice.responses.input_items.list(stored.id, limit=2)
    assert [item.content[0].text for item in newest.data] == ["two", "one"]
    assert newest.has_more and newest.first_id == newest.data[0].id
    rest = alice.responses.input_items.list(stored.id, limit=2, after=newest.last_id)
    assert [item.role for item in rest.data] == ["developer"] and not rest.has_more
    oldest = alice.responses.input_items.list(stored.id, order="asc", limit=100)
    assert [item.id for item in oldest.data] == [item.id for item in [*newest.data, *rest.data]][
        ::-1
    ]
    answer = httpx.get(
        f"{gateway}/v1/responses/{stored.id}/input_items?limit=101",
        headers={"Authorization": "Bearer alice-key"},
    )
    assert answer.status_code == 400 and answer.json()["error"]["param"] == "limit"


@pytest.mark.parametrize("stream", [False, True])
def test_an_upstreams_400_is_the_clients_in_openais_shape(
    alice: openai.OpenAI, standin: StandIn, stream: bool
) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        alice.responses.create(model="bad-request", input="x", temperature=1.5, stream=stream)
    assert isinstance(caught.value.body, dict)
    assert caught.value.body["param"] == "temperature"
    assert UPSTREAM_KEY not in str(caught.value.body)


def test_a_continued_conversation_is_paid_for_as_if_sent(
    standin_server: tuple[StandIn, str], standin: StandIn
) -> None:
    """A small body continuing a long stored conversation spends the tenant's token
    budget by the conversation's size: 8,000 bytes stored, then about 2,000 tokens more
    for a 3,000-token budget."""
    settings = build_settings(
        {
            "endpoints": [
                {
                    "name": "chat",
                    "kind": "openai_compatible",
                    "base_url": f"{standin_server[1]}/v1",
                    "health_check": False,
                    "models": [CHAT],
                }
            ],
            "keys": [{"key_env": "DRAFTGATE_KEY_ALICE", "tenant": "alice"}],
            "limits": {"tokens_per_minute": 3000},
        },
        "test",
    )
    with serve(create_app(settings, environ=ENVIRON)) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="alice-key", max_retries=0)
        first = client.responses.create(model=CHAT, input="a" * 8000)
        with pytest.raises(openai.RateLimitError):
            client.responses.create(model=CHAT, input="more", previous_response_id=first.id)
