"""Strict JSON reading: a repeated key anywhere is refused, whatever the strings hold;
strings too long for a wire type are refused from the raw bytes."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.errors import InvalidJSON, InvalidRequest
from gateway.http import validation
from gateway.http.validation import (
    MAX_DEPTH,
    VECTOR_BYTES,
    YIELD_BYTES,
    check_string_lengths,
    parse_json,
    parse_json_async,
    validate,
)
from sdk.wire import DocumentIn

# key spellings that decode to a colon or look like one: the cases a byte count could miss
KEYS = ["a", "a:", "a\\u003a", "a\\u003A", "a\\\\u003a", ":", "\\u003a", "b\\\\", 'c\\"']
SCALARS = ["1", '"x:y"', '"\\u003a"', '"\\\\u003a"', "null", '"a\\\\"', "2.5"]


def _object(members: list[tuple[str, str]]) -> str:
    return "{" + ",".join(f'"{k}" :{v}' for k, v in members) + "}"


JSON_TEXT = st.recursive(
    st.sampled_from(SCALARS),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4).map(lambda items: "[" + " , ".join(items) + "]"),
        st.lists(st.tuples(st.sampled_from(KEYS), inner), max_size=4).map(_object),
    ),
    max_leaves=12,
)


def _refused_by_stdlib(text: str) -> bool:
    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        if len({k for k, _ in items}) != len(items):
            raise KeyError
        return dict(items)

    try:
        json.loads(text, object_pairs_hook=pairs)
    except KeyError:
        return True
    return False


@settings(max_examples=150, deadline=None)
@given(JSON_TEXT)
def test_repeated_keys_are_refused_exactly_when_there_are_some(text: str) -> None:
    refused = _refused_by_stdlib(text)
    for walk_values in (validation.WALK_VALUES, 0):  # members counted by a walk, re-encoded
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(validation, "WALK_VALUES", walk_values)
            try:
                assert parse_json(text.encode()) == json.loads(text)
            except InvalidJSON as exc:
                assert refused and "twice" in exc.message
            else:
                assert not refused


def test_a_long_prompt_is_not_re_encoded_to_look_for_repeated_keys(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A body of few values (one long string) is walked; many values are re-encoded."""
    encoded: list[int] = []
    real = orjson.dumps

    def dumps(value: Any) -> bytes:
        encoded.append(1)
        return real(value)

    monkeypatch.setattr(validation.orjson, "dumps", dumps)
    prompt = json.dumps({"messages": [{"role": "user", "content": "x: " * YIELD_BYTES}]})
    assert parse_json(prompt.encode()) == json.loads(prompt) and encoded == []
    with pytest.raises(InvalidJSON, match="twice"):
        parse_json(prompt[:-1].encode() + b', "messages": 1}')
    many = json.dumps({"ids": [f"d{i}" for i in range(validation.WALK_VALUES)]})
    assert parse_json(many.encode()) == json.loads(many) and encoded == [1]


def test_a_repeated_key_is_named() -> None:
    with pytest.raises(InvalidJSON) as caught:
        parse_json(b'{"a\\u003a": 1, "b": [{"a:": 1, "a\\u003a": 2}]}')
    assert caught.value.param == "a:"


@pytest.mark.parametrize(
    "raw",
    [
        b'{"a": "\\ud800"}',  # lone surrogate
        b'{"a": "\\udc00x"}',
        b'{"a": "\xed\xa0\x80"}',  # a surrogate encoded as bytes
        b'{"a": NaN}',
        b'{"a": 1e400}',
        b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1),
        b'{"a":' * 100_000 + b"1" + b"}" * 100_000,
        b"\xff{}",
    ],
    ids=["surrogate", "low-surrogate", "surrogate-bytes", "nan", "inf", "deep", "deeper", "utf8"],
)
def test_what_is_not_strict_json_is_refused(raw: bytes) -> None:
    with pytest.raises(InvalidJSON):
        parse_json(raw)


def _big(members: str) -> bytes:
    """A body past ``VECTOR_BYTES`` (counted with numpy) ending with ``members``."""
    return ('{"pad": "' + "x: " * VECTOR_BYTES + '", ' + members + "}").encode()


def test_long_bodies_are_read_as_strictly_as_short_ones() -> None:
    ok = _big('"a": 1, "b": {"a": 2}')
    assert len(ok) > VECTOR_BYTES and parse_json(ok) == json.loads(ok)
    for members in ('"a": 1, "a": 2', '"a\\u003a": 1, "a:": 2', "[" * 65 + "]" * 65):
        raw = _big(members if members[0] != "[" else f'"deep": {members}')
        with pytest.raises(InvalidJSON):
            parse_json(raw)


def test_too_long_strings_are_refused_before_a_parse() -> None:
    head = b'{"id": "a.py", "text": "", "path": "' + b"p/" * 8000
    with pytest.raises(InvalidRequest) as caught:
        check_string_lengths(head, DocumentIn)  # the start of a body is enough
    assert (caught.value.param, caught.value.code) == ("path", "invalid_field")
    assert caught.value.message == "path: String should have at most 1024 characters"


@pytest.mark.parametrize(
    "body",
    [
        {"id": "a.py", "text": "", "path": "\U0001f600" * 1024},  # 12 bytes a character
        {"id": "a.py", "text": '"path": "' + "p" * 20_000},  # a key inside a string
        {"id": "a.py", "text": "x" * 20_000 + '", "path": "' + "p" * 20_000},
    ],
)
def test_strings_within_bounds_pass_the_check_before_a_parse(body: dict[str, Any]) -> None:
    check_string_lengths(json.dumps(body).encode(), DocumentIn)
    validate(DocumentIn, body)


@pytest.mark.parametrize("extra", [0, 1])
def test_depth_is_read_from_the_bytes_whatever_the_strings_hold(extra: int) -> None:
    """Brackets, braces and escaped quotes inside strings neither add nor hide a level."""
    noise = '"[[{\\\\", "\\\\\\"]]}}", "\\"{", '
    lists = MAX_DEPTH - 1 + extra  # in an object
    text = "[" * (lists - 1) + "[" + noise + "1]" + "]" * (lists - 1)
    raw = json.dumps({"pad": "]" * 100, "x": json.loads(text)}).encode()
    if extra:
        with pytest.raises(InvalidJSON):
            parse_json(raw)
    else:
        assert parse_json(raw) == json.loads(raw)
    wide = json.dumps({"x": [[]] * 50_000, "s": "[" * 100}).encode()  # many, not deep
    assert parse_json(wide) == json.loads(wide)


async def test_a_long_body_s_parse_lets_the_event_loop_run_between_its_steps(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    events: list[str] = []
    for step in ("_decode", "_check_nesting", "_check_keys"):
        real = getattr(validation, step)

        def spy(*args: Any, real: Any = real, step: str = step) -> Any:
            events.append(step)
            return real(*args)

        monkeypatch.setattr(validation, step, spy)

    async def other_request() -> None:
        while True:
            events.append("other")
            await asyncio.sleep(0)

    other = asyncio.create_task(other_request())
    await asyncio.sleep(0)
    raw = json.dumps({"pad": "x" * YIELD_BYTES, "a": 1}).encode()
    assert await parse_json_async(raw) == json.loads(raw)
    other.cancel()
    steps = [i for i, e in enumerate(events) if e != "other"]
    assert len(steps) == 3 and all(events[i + 1] == "other" for i in steps[:-1])
