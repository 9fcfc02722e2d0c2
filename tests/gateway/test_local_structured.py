"""``response_format`` on the local endpoint (real SmolLM2, real ``openai`` client): answers
satisfy the schema, drafts do not change them, bad formats and schemas over the grammar
limits are a 400 naming the field, a schema that exceeds a per-token limit mid-answer is a
400 (or, once streaming, an error event) naming the field, ``n`` answers share one
compile."""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import openai
import pytest
from llguidance import LLMatcher

from gateway.endpoints.response_format import grammar_for
from local_verifier import grammar

MODEL = "smollm2-135m"
MESSAGES: list[Any] = [
    {"role": "user", "content": "Describe a person as JSON: their name, age and favourite color."}
]
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "pattern": "^[A-Za-z ]{1,12}$"},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "color": {"enum": ["red", "green", "blue"]},
    },
    "required": ["name", "age", "color"],
    "additionalProperties": False,
}
SCHEMA_FORMAT = {
    "type": "json_schema",
    "json_schema": {"name": "person", "strict": True, "schema": SCHEMA},
}
# over the grammar's size limit: its compile is refused (a 400), not run to the end
WIDE: dict[str, Any] = {
    "type": "object",
    "properties": {f"p{i}": {"type": "string"} for i in range(3000)},
    "required": [f"p{i}" for i in range(3000)],
}
# 600 optional properties: compiles, but the parser row after its "{" is over
# max_items_in_row, so the answer fails at that token (one key deep: a few tokens in)
OPTIONAL: dict[str, Any] = {
    "type": "object",
    "properties": {f"p{i}": {"type": "string"} for i in range(600)},
}
NESTED_FORMAT = {
    "type": "json_schema",
    "json_schema": {
        "name": "nested",
        "schema": {"type": "object", "properties": {"a": OPTIONAL}, "required": ["a"]},
    },
}
TOP_FORMAT = {"type": "json_schema", "json_schema": {"name": "top", "schema": OPTIONAL}}
TOO_COMPLEX = re.compile(
    r"response_format's grammar exceeded the engine's per-token grammar limits after "
    r"(\d+) output tokens?; simplify the schema \(.*\)"
)
# a draft that is right at first, then breaks the schema (a wrong key, an extra field)
PREDICTION = '{\n  "name": "John",\n  "agee": 30,\n  "color": "red",\n  "x": 1\n}'
MAX_TOKENS = 48


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)


def satisfies(value: Any) -> bool:
    """``value`` matches SCHEMA (checked by hand: the test shares no code with the engine)."""
    if not isinstance(value, dict) or set(value) != {"name", "age", "color"}:
        return False
    name, age = value["name"], value["age"]
    return (
        isinstance(name, str)
        and 1 <= len(name) <= 12
        and all(c.isascii() and (c.isalpha() or c == " ") for c in name)
        and isinstance(age, int)
        and not isinstance(age, bool)
        and 0 <= age <= 120
        and value["color"] in ("red", "green", "blue")
    )


def ask(url: str, response_format: Any, draft: bool, **extra: Any) -> Any:
    return client(url).chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        max_tokens=MAX_TOKENS,
        response_format=response_format,
        prediction={"type": "content", "content": PREDICTION},
        extra_body={"draftgate": {"draft": draft}},
        **extra,
    )


def test_json_schema_greedy_is_valid_and_identical_with_drafts(local_url: str) -> None:
    plain = ask(local_url, SCHEMA_FORMAT, draft=False, temperature=0)
    drafted = ask(local_url, SCHEMA_FORMAT, draft=True, temperature=0)
    text = plain.choices[0].message.content
    assert plain.choices[0].finish_reason == "stop"
    assert satisfies(json.loads(text)), text
    assert drafted.choices[0].message.content == text
    assert (drafted.model_extra or {})["draftgate"]["accepted_tokens"] > 0  # drafts were used


def test_json_object_parses(local_url: str) -> None:
    answer = ask(local_url, {"type": "json_object"}, draft=True, temperature=0)
    assert isinstance(json.loads(answer.choices[0].message.content), dict)


@pytest.mark.parametrize(
    ("response_format", "words"),
    [
        ({"type": "xml"}, "response_format.type"),
        ({"type": "json_schema"}, "response_format.json_schema"),
        (
            {"type": "json_schema", "json_schema": {"name": "p", "schema": {"type": "strin"}}},
            "response_format.json_schema.schema: invalid JSON schema: Invalid type: strin",
        ),
        (
            {"type": "json_schema", "json_schema": {"name": "p", "schema": {"$ref": "#/nope"}}},
            "response_format.json_schema.schema",
        ),
        (
            {"type": "json_schema", "json_schema": {"name": "p", "schema": WIDE}},
            "response_format.json_schema.schema: invalid JSON schema: grammar size (number "
            "of symbols) too big (limit for this grammar: 10000)",
        ),
    ],
)
def test_bad_response_format_is_400_naming_the_field(
    local_url: str, response_format: Any, words: str
) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        ask(local_url, response_format, draft=True)
    assert err.value.param == "response_format"
    assert words in str(err.value.message)


def too_complex(error: dict[str, Any]) -> int:
    """The output tokens an OpenAI-style grammar_too_complex error names."""
    assert error["param"] == "response_format" and error["code"] == "grammar_too_complex"
    assert error["type"] == "invalid_request_error"
    match = TOO_COMPLEX.fullmatch(error["message"])
    assert match is not None, error["message"]
    return int(match.group(1))


@pytest.mark.parametrize(
    ("response_format", "stream"), [(NESTED_FORMAT, False), (TOP_FORMAT, True)]
)
def test_a_grammar_over_a_step_limit_before_any_output_is_400(
    local_url: str, response_format: Any, stream: bool
) -> None:
    """Nothing was sent when the answer failed (not streamed, or at its first token)."""
    body = {
        "model": MODEL,
        "messages": MESSAGES,
        "max_tokens": 16,
        "temperature": 0,
        "response_format": response_format,
        "stream": stream,
    }
    r = httpx.post(f"{local_url}/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 400, r.text
    tokens = too_complex(r.json()["error"])
    assert tokens == 0 if response_format is TOP_FORMAT else tokens > 0
    with pytest.raises(openai.BadRequestError) as err:  # as the openai client sees it
        ask(local_url, response_format, draft=True, temperature=0)
    assert err.value.param == "response_format" and err.value.code == "grammar_too_complex"


def test_a_grammar_over_a_step_limit_mid_stream_ends_with_its_error_event(local_url: str) -> None:
    body = {
        "model": MODEL,
        "messages": MESSAGES,
        "max_tokens": 16,
        "temperature": 0,
        "response_format": NESTED_FORMAT,
        "stream": True,
        "draftgate": {"draft": False},  # one token a step: the first ones are sent
    }
    with httpx.stream("POST", f"{local_url}/v1/chat/completions", json=body, timeout=120) as r:
        assert r.status_code == 200
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert "[DONE]" not in events
    *chunks, last = [json.loads(e) for e in events]
    pieces = [c["choices"][0]["delta"].get("content") for c in chunks]
    text = "".join(p for p in pieces if p)
    assert re.fullmatch(r'\{\s*"a"\s*:?\s*', text), text  # the answer up to the inner "{"
    assert too_complex(last["error"]) == len([p for p in pieces if p]) > 0  # a token a chunk


def test_the_event_loop_checks_only_the_shape() -> None:
    """The schema reaches the engine unchecked: its compile is off the event loop."""
    bad = {"type": "strin"}
    value = {"type": "json_schema", "json_schema": {"name": "p", "schema": bad}}
    assert grammar_for(value) == grammar.JsonSchema(bad)
    assert grammar_for({"type": "json_object"}) == grammar.JsonSchema()
    assert grammar_for({"type": "text"}) is None and grammar_for(None) is None


class CountingMatcher:
    """Stands in for llguidance's LLMatcher in local_verifier.grammar: counts compiles."""

    built = 0
    grammar_from_json_schema = staticmethod(LLMatcher.grammar_from_json_schema)

    def __new__(cls, *args: Any, **kwargs: Any) -> LLMatcher:  # type: ignore[misc]
        cls.built += 1
        return LLMatcher(*args, **kwargs)


def test_n_answers_compile_the_schema_once(local_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(grammar, "LLMatcher", CountingMatcher)
    answer = ask(local_url, SCHEMA_FORMAT, draft=True, temperature=1.0, seed=3, n=3)
    assert CountingMatcher.built == 1
    assert len(answer.choices) == 3
    for choice in answer.choices:
        assert choice.finish_reason == "stop"
        assert satisfies(json.loads(choice.message.content)), choice.message.content


N_SAMPLED = 50


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_sampled_answers_always_satisfy_the_schema(local_url: str) -> None:
    for seed in range(N_SAMPLED):
        answer = ask(local_url, SCHEMA_FORMAT, draft=seed % 2 == 0, temperature=1.0, seed=seed)
        text = answer.choices[0].message.content
        assert answer.choices[0].finish_reason == "stop", text
        assert satisfies(json.loads(text)), text


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("seed", range(4))
def test_sampled_text_identical_with_drafts(local_url: str, seed: int) -> None:
    texts = [
        ask(local_url, SCHEMA_FORMAT, draft=d, temperature=0.9, seed=seed)
        .choices[0]
        .message.content
        for d in (False, True)
    ]
    assert texts[0] == texts[1]
