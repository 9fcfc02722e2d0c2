"""Strict JSON reading: a repeated key anywhere is refused, whatever the strings hold."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.errors import InvalidJSON
from gateway.http.validation import MAX_DEPTH, parse_json

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
    try:
        assert parse_json(text.encode()) == json.loads(text)
    except InvalidJSON as exc:
        assert refused and "twice" in exc.message
    else:
        assert not refused


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
