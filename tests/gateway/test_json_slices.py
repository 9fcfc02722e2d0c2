"""Long JSON strings decoded and encoded a slice at a time: the same values and the same
refusals as a whole parse or encoding, and the event loop runs between the slices."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.errors import InvalidJSON
from gateway.http import json_slices, validation
from gateway.http.json_slices import SLICE_BYTES, decode_literal, dumps
from gateway.http.validation import parse_json, parse_json_async

# the bytes a literal's content is made of where a cut could go wrong: escapes, their
# hex digits, surrogate halves, UTF-8 sequences (and their parts), a bare quote
PIECES = [
    "a",
    ":",
    "\\\\",
    "\\",
    '\\"',
    "\\n",
    "\\u00e9",
    "\\u003a",
    "\\ud83d",
    "\\ude00",
    "\\ud83d\\ude00",
    "u",
    "d8",
    "\u00e9",
    "\U0001f600",
    '"',
]
CONTENT = st.lists(st.sampled_from(PIECES), max_size=24).map("".join)
TEXT = st.text(st.characters(codec="utf-8"), max_size=40)


def _whole(content: bytes) -> str | None:
    try:
        return str(orjson.loads(b'"' + content + b'"'))
    except orjson.JSONDecodeError:
        return None


@settings(max_examples=400, deadline=None)
@given(CONTENT, st.integers(1, 9), st.sampled_from([b"", b"\xe9", b"\xc3", b"\x01"]))
def test_a_literal_decodes_in_slices_exactly_as_whole(content: str, size: int, tail: bytes) -> None:
    raw = b'{"a": "' + content.encode() + tail + b'"}'
    start, end = 7, len(raw) - 2
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(json_slices, "SLICE_BYTES", size)
        try:
            sliced: str | None = asyncio.run(decode_literal(raw, start, end))
        except orjson.JSONDecodeError:
            sliced = None
    assert sliced == _whole(raw[start:end])


@settings(max_examples=200, deadline=None)
@given(TEXT, st.booleans(), st.integers(1, 9))
def test_any_string_survives_slices_both_ways(text: str, ascii_only: bool, size: int) -> None:
    value = {"m": [{"content": text, "n": 1}], "k": text}
    raw = json.dumps(value, ensure_ascii=ascii_only).encode()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(json_slices, "SLICE_BYTES", size)
        patch.setattr(validation, "YIELD_BYTES", 0)
        assert asyncio.run(parse_json_async(raw)) == value
        assert asyncio.run(dumps(value)) == orjson.dumps(value)


BODIES = [
    b'{"a": "%s", "b": 1}',
    b'{"%s": 1, "b": "x"}',  # a long key stays in the skeleton
    b'{"a": ["%s", "%s"], "a": 2}',  # a repeated key
    b'{"a": "%s", "b": NaN}',
    b'{"a": "%s" "b": 1}',
    b'{"a": "%s\\ud800", "b": 1}',
    b'["%s", {"x": "%s"}, [[["%s"]]]]',
    b'{"a": "%s\\"}',
    b'{"a": \\"%s"}',
]


@pytest.mark.parametrize("body", BODIES)
@pytest.mark.parametrize("size", [1, 4, 64])
def test_a_body_s_slices_are_read_as_strictly_as_the_whole(body: bytes, size: int) -> None:
    fill = "x: \\u00e9\\\\ \U0001f600".encode() * 8
    raw = body.replace(b"%s", fill)
    try:
        expected: Any = parse_json(raw)
    except InvalidJSON:
        expected = InvalidJSON
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(json_slices, "SLICE_BYTES", size)
        patch.setattr(validation, "YIELD_BYTES", 0)
        try:
            got: Any = asyncio.run(parse_json_async(raw))
        except InvalidJSON:
            got = InvalidJSON
    assert got == expected


async def test_a_6_mb_prompt_is_read_and_written_a_slice_at_a_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No decode or encode takes more than a slice of the prompt, and another task runs
    between every two of them."""
    events: list[tuple[str, int]] = []
    real_loads, real_dumps = orjson.loads, orjson.dumps

    def loads(text: Any) -> Any:
        events.append(("decode", len(text)))
        return real_loads(text)

    def dumps_spy(value: Any, *args: Any) -> bytes:
        out = real_dumps(value, *args)
        events.append(("encode", len(out)))
        return out

    monkeypatch.setattr(orjson, "loads", loads)
    monkeypatch.setattr(orjson, "dumps", dumps_spy)

    async def other_request() -> None:
        while True:
            events.append(("other", 0))
            await asyncio.sleep(0)

    line = "def add(a, b):\n    return a + b  # naïve café \U0001f600\n"
    prompt = line * (6_000_000 // len(line))
    raw = json.dumps({"model": "m", "messages": [{"role": "user", "content": prompt}]}).encode()
    other = asyncio.create_task(other_request())
    await asyncio.sleep(0)
    data = await parse_json_async(raw)
    body = await dumps({**data, "cache_salt": "s"})
    other.cancel()
    assert data["messages"][0]["content"] == prompt
    assert real_loads(body) == {**data, "cache_salt": "s"}
    work = [(i, size) for i, (kind, size) in enumerate(events) if kind != "other"]
    assert len(work) > (len(raw) + len(prompt)) // SLICE_BYTES  # both ways, in slices
    assert max(size for _, size in work) <= 6 * SLICE_BYTES  # a slice, escaped at most 6x
    heavy = [i for i, size in work if size > SLICE_BYTES // 4]
    between = [{kind for kind, _ in events[a:b]} for a, b in zip(heavy, heavy[1:], strict=False)]
    assert all("other" in kinds for kinds in between)
