"""``POST /v1/messages`` on the local endpoint (the real SmolLM2-135M), through the real
``anthropic`` client: the same greedy answer as Chat Completions gives, streamed or not,
the endpoint's cap as ``max_tokens``, tool rounds, and Anthropic-shaped refusals."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest

from gateway.app import create_app
from gateway.config import build_settings
from tests.gateway.servers import serve

MODEL = "smollm2-135m"
CAPPED = "smollm2-capped"  # the same model behind an endpoint whose max_tokens_cap is CAP
CAP = 6
CONTEXT = 4096  # the shared model's context (tests/conftest.py)
QUESTION = "Name three colours."
GREEDY = {"temperature": 0}  # the anthropic client 2.x has no temperature argument
READ_TOOL = {
    "name": "Read",
    "description": "Read a file",
    "input_schema": {
        "type": "object",
        "properties": {"file_path": {"type": "string"}},
        "required": ["file_path"],
    },
}


@pytest.fixture(scope="module")
def gateway(engine: Any) -> Iterator[str]:
    settings = build_settings(
        {
            "endpoints": [
                {"name": "local", "kind": "local", "model": MODEL},
                {
                    "name": "capped",
                    "kind": "local",
                    "model": MODEL,
                    "models": [CAPPED],
                    "max_tokens_cap": CAP,
                },
            ],
            "auth": False,
        },
        "test",
    )
    with serve(create_app(settings, engines={"local": engine, "capped": engine})) as url:
        yield url


def client(url: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0)


def test_greedy_answer_matches_chat_completions(gateway: str) -> None:
    message = client(gateway).messages.create(
        model=MODEL,
        max_tokens=8,
        extra_body=GREEDY,
        system="You are brief.",
        messages=[{"role": "user", "content": QUESTION}],
    )
    chat = openai.OpenAI(base_url=f"{gateway}/v1", api_key="x", max_retries=0)
    same = chat.chat.completions.create(
        model=MODEL,
        max_tokens=8,
        temperature=0,
        messages=[
            {"role": "system", "content": "You are brief."},
            {"role": "user", "content": QUESTION},
        ],
    )
    assert message.content[0].type == "text"
    assert message.content[0].text == same.choices[0].message.content
    assert (
        message.stop_reason
        == {"length": "max_tokens", "stop": "end_turn"}[str(same.choices[0].finish_reason)]
    )
    assert same.usage is not None
    assert message.usage.output_tokens == same.usage.completion_tokens
    cached = message.usage.cache_read_input_tokens or 0
    assert message.usage.input_tokens + cached == same.usage.prompt_tokens


def test_stream_matches_the_whole_answer(gateway: str) -> None:
    common: dict[str, Any] = {
        "model": MODEL,
        "max_tokens": 8,
        "extra_body": GREEDY,
        "messages": [{"role": "user", "content": QUESTION}],
    }
    sdk = client(gateway)
    whole = sdk.messages.create(**common)
    with sdk.messages.stream(**common) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == whole.content[0].text == final.content[0].text
    assert final.stop_reason == whole.stop_reason
    assert final.usage.output_tokens == whole.usage.output_tokens


def test_max_tokens_past_the_cap_is_clamped(gateway: str) -> None:
    with client(gateway).messages.stream(  # the client streams past 21,333 max_tokens
        model=CAPPED,
        max_tokens=32000,
        extra_body=GREEDY,
        messages=[{"role": "user", "content": "Count from one to one hundred in words."}],
    ) as stream:
        message = stream.get_final_message()
    assert message.stop_reason == "max_tokens"
    assert message.usage.output_tokens == CAP


def test_prompt_past_the_context_names_both_numbers(gateway: str) -> None:
    long = "word " * (CONTEXT + 500)
    with pytest.raises(anthropic.BadRequestError) as raised:
        client(gateway).messages.create(
            model=MODEL, max_tokens=5, messages=[{"role": "user", "content": long}]
        )
    body = raised.value.body
    assert isinstance(body, dict) and body["type"] == "error"
    assert body["error"]["type"] == "invalid_request_error"
    message = body["error"]["message"]
    assert f"the model's context is {CONTEXT} tokens" in message
    prompt = int(message.split("prompt has ")[1].split(" ")[0])
    assert prompt > CONTEXT


def test_image_on_a_text_model_is_refused(gateway: str) -> None:
    image = {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}
    with pytest.raises(anthropic.BadRequestError) as raised:
        client(gateway).messages.create(
            model=MODEL,
            max_tokens=5,
            messages=[
                {
                    "role": "user",
                    "content": [
                        {"type": "image", "source": image},
                        {"type": "text", "text": "What is this?"},
                    ],
                }
            ],
        )
    body = raised.value.body
    assert isinstance(body, dict) and body["error"]["type"] == "invalid_request_error"
    assert body["error"]["message"].startswith("messages: local models read text only")


def test_count_tokens_is_the_prompt_a_generation_reads(gateway: str) -> None:
    request: dict[str, Any] = {
        "model": MODEL,
        "system": "You are brief.",
        "messages": [{"role": "user", "content": "Count these tokens, please."}],
    }
    counted = client(gateway).messages.count_tokens(**request)
    answer = client(gateway).messages.create(max_tokens=1, **request)
    prompt = answer.usage.input_tokens + (answer.usage.cache_read_input_tokens or 0)
    assert counted.input_tokens == prompt > 0


@pytest.mark.parametrize("stream", [False, True])
def test_tool_round(gateway: str, stream: bool) -> None:
    """``tool_choice: any`` makes the model call Read (its input valid by the grammar); the
    result goes back and the model answers in text."""
    sdk = client(gateway)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Read the file add.py"}]
    common: dict[str, Any] = {"model": MODEL, "extra_body": GREEDY, "tools": [READ_TOOL]}

    def ask(**extra: Any) -> anthropic.types.Message:
        if not stream:
            return sdk.messages.create(messages=messages, **common, **extra)
        with sdk.messages.stream(messages=messages, **common, **extra) as events:
            return events.get_final_message()

    first = ask(tool_choice={"type": "any"}, max_tokens=40)
    assert first.stop_reason == "tool_use"
    calls = [b for b in first.content if b.type == "tool_use"]
    assert calls and all(c.name == "Read" for c in calls)
    assert all(isinstance(c.input, dict) and isinstance(c.input["file_path"], str) for c in calls)
    messages += [
        {"role": "assistant", "content": [b.model_dump() for b in first.content]},
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": c.id, "content": "def add(a, b): ..."}
                for c in calls
            ],
        },
    ]
    second = ask(tool_choice={"type": "none"}, max_tokens=4)
    assert second.stop_reason in ("end_turn", "max_tokens")
    assert [b.type for b in second.content] == ["text"]


def _events(url: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    """The data objects of a streamed Messages answer (asked as Claude Code asks)."""
    with httpx.stream("POST", f"{url}/v1/messages?beta=true", json=body, timeout=60) as r:
        assert r.status_code == 200
        text = r.read().decode()
    return [json.loads(b.split("data: ", 1)[1]) for b in text.strip().split("\n\n")]


def test_stream_events_on_the_local_engine(gateway: str) -> None:
    body = {
        "model": MODEL,
        "max_tokens": 4,
        "temperature": 0,
        "stream": True,
        "messages": [{"role": "user", "content": QUESTION}],
    }
    names = [event["type"] for event in _events(gateway, body)]
    assert names[:3] == ["message_start", "ping", "content_block_start"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(names[3:-3]) == {"content_block_delta"}


def test_message_start_counts_the_prompt_as_the_final_usage_does(gateway: str) -> None:
    body = {
        "model": MODEL,
        "max_tokens": 3,
        "temperature": 0,
        "stream": True,
        "system": "You are brief.",
        "messages": [{"role": "user", "content": "Which colour is the sky at noon?"}],
    }
    for _ in range(2):  # the second finds the prompt's prefix in the cache
        events = _events(gateway, body)
        start = events[0]["message"]["usage"]
        final = next(e for e in events if e["type"] == "message_delta")["usage"]
        assert start["input_tokens"] > 0
        assert start["input_tokens"] == final["input_tokens"]
        assert start["cache_read_input_tokens"] == final["cache_read_input_tokens"]
    assert final["cache_read_input_tokens"] > 0


@pytest.mark.parametrize("stream", [False, True])
def test_a_matched_stop_sequence_is_named(gateway: str, stream: bool) -> None:
    sdk = client(gateway)
    common: dict[str, Any] = {
        "model": MODEL,
        "extra_body": GREEDY,
        "messages": [{"role": "user", "content": QUESTION}],
    }
    whole = sdk.messages.create(max_tokens=12, **common)
    text = whole.content[0].text if whole.content and whole.content[0].type == "text" else ""
    words = text.split()
    assert len(words) >= 3, text
    stop = " " + words[2]  # the model's own third word ends the answer early
    stops = ["never in this answer", stop]
    if stream:
        with sdk.messages.stream(max_tokens=12, stop_sequences=stops, **common) as events:
            answer = events.get_final_message()
    else:
        answer = sdk.messages.create(max_tokens=12, stop_sequences=stops, **common)
    assert answer.stop_reason == "stop_sequence"
    assert answer.stop_sequence == stop
    assert answer.content[0].type == "text"
    assert answer.content[0].text == text[: text.index(stop)]
