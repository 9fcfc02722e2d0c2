"""``POST /v1/messages`` through the real ``anthropic`` client: in front of a chat-completions
endpoint (the OpenAI stand-in plays the model), and relayed natively to an ``anthropic``
endpoint (the Messages stand-in) with the gateway's own key swapped in."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import pytest

from gateway.app import create_app
from gateway.config import build_settings
from tests.anthropic_standin import AnthropicStandIn
from tests.anthropic_standin import Script as MessagesScript
from tests.gateway.servers import serve
from tests.openai_standin import ANSWER, Script, StandIn, tokens

UPSTREAM_KEY = "sk-upstream-secret-0123456789"
ANTHROPIC_KEY = "sk-ant-upstream-secret-0123456789"
ENVIRON = {
    "STANDIN_KEY": UPSTREAM_KEY,
    "ANTHROPIC_STANDIN_KEY": ANTHROPIC_KEY,
    "DRAFTGATE_KEY_ALICE": "alice-key",
}
CHAT_MODEL = "gpt-4o-mini"
NATIVE_MODEL = "claude-sonnet"
NATIVE_UPSTREAM = "claude-sonnet-4-5-20250929"
READ_TOOL = {
    "name": "Read",
    "description": "Read a file",
    "input_schema": {
        "type": "object",
        "properties": {"file_path": {"type": "string"}},
        "required": ["file_path"],
    },
}
LISTING = "1\tdef add(a, b):\n2\t    return a + b\n"
MAX_BODY = 1 << 20
CAP = 2  # the capped endpoints' max_tokens_cap: fewer tokens than ANSWER's


@pytest.fixture(scope="module")
def anthropic_standin() -> Iterator[tuple[AnthropicStandIn, str]]:
    standin = AnthropicStandIn(ANTHROPIC_KEY)
    with serve(standin) as url:
        yield standin, url


@pytest.fixture(scope="module")
def gateway(
    standin_server: tuple[StandIn, str], anthropic_standin: tuple[AnthropicStandIn, str]
) -> Iterator[str]:
    fast = {"backoff_s": 0.01, "max_backoff_s": 0.05, "retries": 1}
    settings = build_settings(
        {
            "endpoints": [
                {
                    "name": "openai",
                    "kind": "openai",
                    "base_url": f"{standin_server[1]}/v1",
                    "api_key_env": "STANDIN_KEY",
                    **fast,
                    "models": [CHAT_MODEL, "always-500", "always-429", "stream-cut"],
                },
                {
                    "name": "anthropic",
                    "kind": "anthropic",
                    "base_url": f"{anthropic_standin[1]}/v1",
                    "api_key_env": "ANTHROPIC_STANDIN_KEY",
                    **fast,
                    "models": [{"name": NATIVE_MODEL, "upstream": NATIVE_UPSTREAM}],
                },
                {  # the same upstreams behind endpoints whose max_tokens_cap is CAP
                    "name": "openai-capped",
                    "kind": "openai",
                    "base_url": f"{standin_server[1]}/v1",
                    "api_key_env": "STANDIN_KEY",
                    "max_tokens_cap": CAP,
                    **fast,
                    "models": [{"name": "capped-chat", "upstream": CHAT_MODEL}],
                },
                {
                    "name": "anthropic-capped",
                    "kind": "anthropic",
                    "base_url": f"{anthropic_standin[1]}/v1",
                    "api_key_env": "ANTHROPIC_STANDIN_KEY",
                    "max_tokens_cap": CAP,
                    **fast,
                    "models": [{"name": "capped-claude", "upstream": NATIVE_UPSTREAM}],
                },
            ],
            "keys": [{"key_env": "DRAFTGATE_KEY_ALICE", "tenant": "alice"}],
            "max_body_bytes": MAX_BODY,
        },
        "test",
    )
    with serve(create_app(settings, environ=ENVIRON)) as url:
        yield url


@pytest.fixture
def chat(standin_server: tuple[StandIn, str]) -> StandIn:
    standin_server[0].reset()
    return standin_server[0]


@pytest.fixture
def native(anthropic_standin: tuple[AnthropicStandIn, str]) -> AnthropicStandIn:
    anthropic_standin[0].reset()
    return anthropic_standin[0]


def client(url: str, **options: Any) -> anthropic.Anthropic:
    options.setdefault("api_key", "alice-key")
    return anthropic.Anthropic(base_url=url, max_retries=0, **options)


def events(url: str, body: dict[str, Any], path: str = "/v1/messages") -> list[tuple[str, Any]]:
    """The (event name, data) pairs of a streamed answer, as sent."""
    headers = {"x-api-key": "alice-key", "anthropic-version": "2023-06-01"}
    with httpx.stream("POST", url + path, json=body, headers=headers, timeout=30) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        text = response.read().decode()
    out = []
    for block in text.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines())
        out.append((lines["event"], json.loads(lines["data"])))
    return out


def read_then_answer(body: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The model's part in a tool round: call Read first, answer once the result came."""
    if body["messages"][-1]["role"] == "tool":
        return []
    return [("Read", {"file_path": "add.py"})]


def echo_tool_result(body: dict[str, Any]) -> str:
    last = body["messages"][-1]
    return f"The file says: {last['content']}" if last["role"] == "tool" else ANSWER


# -- a chat-completions endpoint behind the door ---------------------------------------------


def test_text_answer_is_a_message(gateway: str, chat: StandIn) -> None:
    message = client(gateway).messages.create(
        model=CHAT_MODEL,
        max_tokens=50,
        system="Be brief.",
        messages=[{"role": "user", "content": "Say hello."}],
    )
    assert message.type == "message" and message.role == "assistant"
    assert message.model == CHAT_MODEL
    assert [b.type for b in message.content] == ["text"]
    assert message.content[0].text == ANSWER
    assert message.stop_reason == "end_turn" and message.stop_sequence is None
    assert message.usage.output_tokens == len(tokens(ANSWER))
    usage = message.usage
    assert usage.input_tokens + (usage.cache_read_input_tokens or 0) == len(tokens("Say hello."))
    sent = chat.bodies()[-1]
    assert sent["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Say hello."},
    ]
    assert sent["max_tokens"] == 50 and sent["temperature"] == 1.0
    assert chat.requests[-1].headers["authorization"] == f"Bearer {UPSTREAM_KEY}"


def test_cached_prompt_tokens_are_cache_reads(gateway: str, chat: StandIn) -> None:
    request: dict[str, Any] = {
        "model": CHAT_MODEL,
        "max_tokens": 20,
        "messages": [{"role": "user", "content": "Cache this prompt, please."}],
    }
    client(gateway).messages.create(**request)
    again = client(gateway).messages.create(**request)
    prompt = len(tokens("Cache this prompt, please."))
    assert again.usage.cache_read_input_tokens == prompt
    assert again.usage.input_tokens == 0
    assert again.usage.cache_creation_input_tokens == 0


def test_stream_has_anthropics_event_sequence(gateway: str, chat: StandIn) -> None:
    body = {
        "model": CHAT_MODEL,
        "max_tokens": 50,
        "stream": True,
        "messages": [{"role": "user", "content": "Say hello."}],
    }
    seen = events(gateway, body)
    names = [name for name, _ in seen]
    pieces = tokens(ANSWER)
    assert names == [
        "message_start",
        "ping",
        "content_block_start",
        *["content_block_delta"] * len(pieces),
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert all(data["type"] == name for name, data in seen)
    start = seen[0][1]["message"]
    assert start["id"].startswith("msg_") and start["content"] == []
    assert start["stop_reason"] is None and start["model"] == CHAT_MODEL
    assert seen[2][1] == {
        "type": "content_block_start",
        "index": 0,
        "content_block": {"type": "text", "text": ""},
    }
    deltas = [data["delta"] for name, data in seen if name == "content_block_delta"]
    assert [d["text"] for d in deltas] == pieces
    assert {d["type"] for d in deltas} == {"text_delta"}
    end = seen[-2][1]
    assert end["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}
    assert end["usage"]["output_tokens"] == len(pieces)
    usage = end["usage"]
    assert usage["input_tokens"] + usage["cache_read_input_tokens"] == len(tokens("Say hello."))
    assert chat.bodies()[-1]["stream_options"] == {"include_usage": True}


def test_stream_through_the_sdk(gateway: str, chat: StandIn) -> None:
    with client(gateway).messages.stream(
        model=CHAT_MODEL, max_tokens=50, messages=[{"role": "user", "content": "Hi"}]
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == ANSWER == final.content[0].text
    assert final.stop_reason == "end_turn"
    assert final.usage.output_tokens == len(tokens(ANSWER))


def test_max_tokens_ends_the_answer(gateway: str, chat: StandIn) -> None:
    message = client(gateway).messages.create(
        model=CHAT_MODEL, max_tokens=2, messages=[{"role": "user", "content": "Hi"}]
    )
    assert message.stop_reason == "max_tokens"
    assert message.content[0].text == "".join(tokens(ANSWER)[:2])


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("model", ["capped-chat", "capped-claude"])
def test_max_tokens_past_a_hosted_cap_is_clamped(
    gateway: str, chat: StandIn, native: AnthropicStandIn, model: str, stream: bool
) -> None:
    """Claude Code's 32,000 max_tokens on an endpoint capped at CAP: the upstream is asked
    for CAP (translated to chat or relayed as Messages), and the answer it cut ends with
    ``max_tokens``."""
    request: dict[str, Any] = {
        "model": model,
        "max_tokens": 32000,
        "messages": [{"role": "user", "content": "Hi"}],
    }
    if stream:
        with client(gateway).messages.stream(**request) as events:
            message = events.get_final_message()
    else:  # a timeout of its own: the client refuses 32,000 max_tokens unstreamed without one
        message = client(gateway).messages.create(**request, timeout=30)
    upstream = chat.bodies()[-1] if model == "capped-chat" else native.requests[-1].body
    assert upstream["max_tokens"] == CAP
    assert message.stop_reason == "max_tokens"
    assert message.content[0].type == "text"
    assert message.content[0].text == "".join(tokens(ANSWER)[:CAP])


@pytest.mark.parametrize("stream", [False, True])
def test_tool_round(gateway: str, chat: StandIn, stream: bool) -> None:
    chat.reset(Script(calls=read_then_answer, reply=echo_tool_result))
    sdk = client(gateway)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "What is in add.py?"}]
    common: dict[str, Any] = {"model": CHAT_MODEL, "max_tokens": 200, "tools": [READ_TOOL]}

    def ask() -> anthropic.types.Message:
        if not stream:
            return sdk.messages.create(messages=messages, **common)
        with sdk.messages.stream(messages=messages, **common) as events:
            return events.get_final_message()

    first = ask()
    assert first.stop_reason == "tool_use"
    [call] = first.content
    assert call.type == "tool_use" and call.name == "Read"
    assert call.input == {"file_path": "add.py"}
    sent = chat.bodies()[-1]
    assert sent["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "Read",
                "parameters": READ_TOOL["input_schema"],
                "description": "Read a file",
            },
        }
    ]
    messages += [
        {"role": "assistant", "content": [block.model_dump() for block in first.content]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": call.id, "content": LISTING}],
        },
    ]
    second = ask()
    assert second.stop_reason == "end_turn"
    assert second.content[0].text == f"The file says: {LISTING}"
    history = chat.bodies()[-1]["messages"]
    assert history[-2] == {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": "Read", "arguments": '{"file_path":"add.py"}'},
            }
        ],
    }
    assert history[-1] == {"role": "tool", "tool_call_id": call.id, "content": LISTING}


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        ({"type": "auto"}, "auto"),
        ({"type": "any"}, "required"),
        ({"type": "none"}, "none"),
        ({"type": "tool", "name": "Read"}, {"type": "function", "function": {"name": "Read"}}),
    ],
)
def test_tool_choice_is_translated(
    gateway: str, chat: StandIn, choice: dict[str, Any], expected: Any
) -> None:
    client(gateway).messages.create(
        model=CHAT_MODEL,
        max_tokens=20,
        tools=[READ_TOOL],
        tool_choice={**choice, "disable_parallel_tool_use": True},
        messages=[{"role": "user", "content": "Read add.py"}],
    )
    sent = chat.bodies()[-1]
    assert sent["tool_choice"] == expected
    assert sent["parallel_tool_calls"] is False


def claude_code_body(tools: int = 12) -> dict[str, Any]:
    """A request shaped as Claude Code sends one: system blocks with cache_control, a
    system turn mid-conversation, thinking, context_management, output_config, metadata,
    a dozen tools, max_tokens 32000, no temperature, no tool_choice."""
    return {
        "model": CHAT_MODEL,
        "max_tokens": 32000,
        "stream": True,
        "system": [
            {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.332"},
            {
                "type": "text",
                "text": "You are Claude Code, Anthropic's official CLI for Claude.",
                "cache_control": {"type": "ephemeral"},
            },
        ],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Fix the bug in add.py"}]},
            {"role": "system", "content": "<env>Working directory: /repo</env>"},
            {
                "role": "user",
                "content": [
                    {
                        "type": "text",
                        "text": "Be quick.",
                        "cache_control": {"type": "ephemeral"},
                    }
                ],
            },
        ],
        "tools": [
            {**READ_TOOL, "name": f"Tool{i}", "cache_control": {"type": "ephemeral"}}
            for i in range(tools)
        ],
        "metadata": {"user_id": "user_0123_account__session_4567"},
        "thinking": {"type": "adaptive"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "output_config": {"effort": "medium"},
        "some_future_beta_field": {"on": True},
    }


def test_claude_code_request_is_accepted(gateway: str, chat: StandIn) -> None:
    seen = events(gateway, claude_code_body(), "/v1/messages?beta=true")
    assert seen[-1][0] == "message_stop"
    text = "".join(d["delta"]["text"] for n, d in seen if n == "content_block_delta")
    assert text == ANSWER
    sent = chat.bodies()[-1]
    assert [m["role"] for m in sent["messages"]] == ["system", "user", "system", "user"]
    assert sent["messages"][0]["content"] == (
        "x-anthropic-billing-header: cc_version=2.1.332\n\n"
        "You are Claude Code, Anthropic's official CLI for Claude."
    )
    assert sent["messages"][2]["content"] == "<env>Working directory: /repo</env>"
    assert len(sent["tools"]) == 12 and "tool_choice" not in sent
    assert sent["max_tokens"] == 32000 and sent["temperature"] == 1.0
    for ignored in ("thinking", "context_management", "output_config", "metadata", "system"):
        assert ignored not in sent
    assert "cache_control" not in json.dumps(sent)


# -- errors in Anthropic's shape ---------------------------------------------------------------


def post(url: str, body: Any, **headers: str) -> httpx.Response:
    headers.setdefault("x-api-key", "alice-key")
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(
        url + "/v1/messages",
        content=content,
        headers={"content-type": "application/json", **headers},
        timeout=30,
    )


def error_of(response: httpx.Response, status: int, kind: str) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["type"] == "error" and body["error"]["type"] == kind
    assert set(body) == {"type", "error"} and set(body["error"]) == {"type", "message"}
    return str(body["error"]["message"])


def test_malformed_body_is_invalid_request(gateway: str) -> None:
    message = error_of(post(gateway, b'{"model": "x",'), 400, "invalid_request_error")
    assert "JSON" in message


def test_missing_max_tokens_is_named(gateway: str) -> None:
    body = {"model": CHAT_MODEL, "messages": [{"role": "user", "content": "Hi"}]}
    assert error_of(post(gateway, body), 400, "invalid_request_error") == (
        "max_tokens: Field required"
    )


def test_unknown_block_type_is_named(gateway: str, chat: StandIn) -> None:
    with pytest.raises(anthropic.BadRequestError) as raised:
        client(gateway).messages.create(
            model=CHAT_MODEL,
            max_tokens=10,
            messages=[{"role": "user", "content": [{"type": "hologram", "data": "x"}]}],
        )
    body = raised.value.body
    assert isinstance(body, dict) and body["error"]["type"] == "invalid_request_error"
    assert body["error"]["message"].startswith("messages.0.content.0: Input tag 'hologram'")
    assert chat.requests == []


def test_server_tools_are_refused(gateway: str) -> None:
    body = {
        "model": CHAT_MODEL,
        "max_tokens": 10,
        "messages": [{"role": "user", "content": "Search the web"}],
        "tools": [{"type": "web_search_20250305", "name": "web_search"}],
    }
    message = error_of(post(gateway, body), 400, "invalid_request_error")
    assert message.startswith("tools.0.type: ") and "web_search_20250305" in message


def test_keys(gateway: str, chat: StandIn) -> None:
    with pytest.raises(anthropic.AuthenticationError) as raised:
        client(gateway, api_key="wrong-key").messages.create(
            model=CHAT_MODEL, max_tokens=5, messages=[{"role": "user", "content": "Hi"}]
        )
    assert raised.value.status_code == 401
    assert isinstance(raised.value.body, dict)
    assert raised.value.body["error"]["type"] == "authentication_error"
    error_of(post(gateway, {}, **{"x-api-key": ""}), 401, "authentication_error")
    bearer = anthropic.Anthropic(base_url=gateway, auth_token="alice-key", max_retries=0)
    answer = bearer.messages.create(
        model=CHAT_MODEL, max_tokens=50, messages=[{"role": "user", "content": "Hi"}]
    )
    assert answer.content[0].text == ANSWER


def test_body_over_the_limit_is_request_too_large(gateway: str, chat: StandIn) -> None:
    body = {
        "model": CHAT_MODEL,
        "max_tokens": 5,
        "messages": [{"role": "user", "content": "x" * MAX_BODY}],
    }
    assert str(MAX_BODY) in error_of(post(gateway, body), 413, "request_too_large")
    assert chat.requests == []


def test_unknown_model_is_not_found(gateway: str) -> None:
    body = {
        "model": "no-such-model",
        "max_tokens": 5,
        "messages": [{"role": "user", "content": "x"}],
    }
    assert "no-such-model" in error_of(post(gateway, body), 404, "not_found_error")


@pytest.mark.parametrize(
    ("model", "status", "kind"),
    [("always-500", 502, "api_error"), ("always-429", 429, "rate_limit_error")],
)
def test_upstream_failures(gateway: str, chat: StandIn, model: str, status: int, kind: str) -> None:
    body = {"model": model, "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}
    error_of(post(gateway, body), status, kind)


def test_stream_cut_is_an_error_event(gateway: str, chat: StandIn) -> None:
    body = {
        "model": "stream-cut",
        "max_tokens": 50,
        "stream": True,
        "messages": [{"role": "user", "content": "Say hello."}],
    }
    seen = events(gateway, body)
    assert seen[0][0] == "message_start"
    name, data = seen[-1]
    assert name == "error" and data["type"] == "error"
    assert data["error"]["type"] == "api_error"
    assert "message_stop" not in [n for n, _ in seen]


# -- the anthropic endpoint kind: the body relayed as it came ------------------------------


def test_native_relay_swaps_the_key(gateway: str, native: AnthropicStandIn) -> None:
    body = claude_code_body()
    body["model"] = NATIVE_MODEL
    body["stream"] = False
    beta = "context-management-2025-06-27,interleaved-thinking-2025-05-14"
    response = post(gateway, body, **{"anthropic-version": "2023-06-01", "anthropic-beta": beta})
    assert response.status_code == 200, response.text
    message = response.json()
    assert message["type"] == "message"
    assert message["content"] == [{"type": "text", "text": "Hello from the Messages stand-in."}]
    [seen] = native.requests
    assert seen.headers["x-api-key"] == ANTHROPIC_KEY
    assert "authorization" not in seen.headers
    assert seen.headers["anthropic-version"] == "2023-06-01"
    assert seen.headers["anthropic-beta"] == beta
    assert "alice-key" not in json.dumps(seen.headers)
    assert seen.body == {**body, "model": NATIVE_UPSTREAM}


def read_until_a_result(body: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The Messages model's part in a tool round: Read, until a tool result came back."""
    if isinstance(body["messages"][-1]["content"], list):
        return []
    return [("Read", {"file_path": "add.py"})]


def test_native_stream_and_tool_round(gateway: str, native: AnthropicStandIn) -> None:
    native.reset(MessagesScript(calls=read_until_a_result, reply=lambda body: "done"))
    sdk = client(gateway)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "What is in add.py?"}]
    with sdk.messages.stream(
        model=NATIVE_MODEL,
        max_tokens=100,
        tools=[READ_TOOL],
        messages=messages,
    ) as stream:
        first = stream.get_final_message()
    assert first.stop_reason == "tool_use"
    [call] = first.content
    assert call.type == "tool_use" and call.input == {"file_path": "add.py"}
    messages += [
        {"role": "assistant", "content": [block.model_dump() for block in first.content]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": call.id, "content": LISTING}],
        },
    ]
    second = sdk.messages.create(model=NATIVE_MODEL, max_tokens=100, messages=messages)
    assert second.content[0].text == "done" and second.stop_reason == "end_turn"
    assert [s.body["model"] for s in native.requests] == [NATIVE_UPSTREAM] * 2
    assert all(s.headers["x-api-key"] == ANTHROPIC_KEY for s in native.requests)


@pytest.mark.parametrize(
    ("failure", "status", "kind"),
    [
        ((400, "invalid_request_error"), 400, "invalid_request_error"),
        ((529, "overloaded_error"), 502, "api_error"),
    ],
)
def test_native_errors_in_anthropics_shape(
    gateway: str, native: AnthropicStandIn, failure: tuple[int, str], status: int, kind: str
) -> None:
    native.reset(MessagesScript(error=failure))
    body = {"model": NATIVE_MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}
    assert f"scripted {failure[1]}" in error_of(post(gateway, body), status, kind)


# -- token counts ----------------------------------------------------------------------------


def test_count_tokens_relayed_to_the_anthropic_endpoint(
    gateway: str, native: AnthropicStandIn
) -> None:
    messages: list[Any] = [{"role": "user", "content": "Count me."}]
    counted = client(gateway).messages.count_tokens(
        model=NATIVE_MODEL, messages=messages, system="Be brief."
    )
    [seen] = native.requests
    assert seen.path == "/v1/messages/count_tokens"
    assert seen.headers["x-api-key"] == ANTHROPIC_KEY
    assert seen.body == {"model": NATIVE_UPSTREAM, "messages": messages, "system": "Be brief."}
    assert counted.input_tokens == len(tokens(json.dumps(["Be brief.", messages, None])))


def test_count_tokens_estimated_without_a_tokenizer(gateway: str, chat: StandIn) -> None:
    def count(text: str) -> int:
        messages: list[Any] = [{"role": "user", "content": text}]
        return (
            client(gateway).messages.count_tokens(model=CHAT_MODEL, messages=messages).input_tokens
        )

    short, long = count("Hi"), count("Hi " * 400)
    assert 0 < short < long and long >= 1200 // 4
    assert chat.requests == []


def test_count_tokens_errors_in_anthropics_shape(gateway: str) -> None:
    url = gateway + "/v1/messages/count_tokens"
    body = {"model": CHAT_MODEL, "messages": [{"role": "user", "content": "x"}]}
    bad_key = httpx.post(url, json=body, headers={"x-api-key": "wrong"}, timeout=30)
    error_of(bad_key, 401, "authentication_error")
    unknown = httpx.post(
        url, json={**body, "model": "nope"}, headers={"x-api-key": "alice-key"}, timeout=30
    )
    error_of(unknown, 404, "not_found_error")
    no_messages = httpx.post(
        url, json={"model": CHAT_MODEL}, headers={"x-api-key": "alice-key"}, timeout=30
    )
    assert error_of(no_messages, 400, "invalid_request_error") == "messages: Field required"


def test_native_relay_carries_what_the_translation_cannot(
    gateway: str, native: AnthropicStandIn
) -> None:
    body = {
        "model": NATIVE_MODEL,
        "max_tokens": 20,
        "messages": [{"role": "user", "content": "Search the web for draftgate."}],
        "tools": [{"type": "web_search_20250305", "name": "web_search", "max_uses": 2}],
    }
    response = post(gateway, body)
    assert response.status_code == 200, response.text
    assert native.requests[-1].body == {**body, "model": NATIVE_UPSTREAM}


def test_native_stream_cut_is_an_anthropic_error_event(
    gateway: str, native: AnthropicStandIn
) -> None:
    native.reset(MessagesScript(break_after=4))
    body = {
        "model": NATIVE_MODEL,
        "max_tokens": 50,
        "stream": True,
        "messages": [{"role": "user", "content": "Say hello."}],
    }
    seen = events(gateway, body)
    assert [name for name, _ in seen][:4] == [
        "message_start",
        "ping",
        "content_block_start",
        "content_block_delta",
    ]
    name, data = seen[-1]
    assert name == "error" and data["type"] == "error"
    assert data["error"]["type"] == "api_error" and "interrupted" in data["error"]["message"]
