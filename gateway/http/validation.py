"""Request bodies into wire types: the one place a bad body becomes a 400.

Bad JSON is :class:`InvalidJSON` (``invalid_json``); a body that fails a wire type's
validation is :class:`InvalidRequest` (``invalid_field``) naming the first bad field.

JSON is read strictly (with orjson: a megabyte in a few milliseconds), so that what the
gateway validates is what it forwards: an object with a key twice (providers disagree on
which one wins: the gateway could validate one model and forward another), nesting deeper
than ``MAX_DEPTH``, ``NaN``/``Infinity``, and strings with a lone surrogate (``"\\ud800"``:
valid JSON to some parsers, but not UTF-8, so a body rewritten for the upstream could not
be encoded) are :class:`InvalidJSON`. Integers beyond 64 bits are read as floats. Bodies
are parsed on the event loop: orjson holds the GIL throughout, so a worker thread would
not let the loop run meanwhile, only add a hand-over; :func:`parse_json_async` lets the
loop serve other requests between the steps of a long body's parse instead, its long
strings decoded a slice at a time. The
strictness checks count bytes (with numpy past ``VECTOR_BYTES``: ``bytes.count`` reads
about 1.5 GB/s, a vectorised compare several times that), so they cost a fraction of
the parse itself.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import json
import re
from typing import Any, TypeVar

import numpy as np
import orjson
from pydantic import BaseModel, ValidationError

from gateway.errors import InvalidJSON, InvalidRequest
from gateway.http.json_slices import cut_long_strings, real_quotes

ModelT = TypeVar("ModelT", bound=BaseModel)

MAX_DEPTH = 64
VECTOR_BYTES = 64 * 1024  # longer texts are counted with numpy
YIELD_BYTES = 256 * 1024  # longer bodies let the event loop run between parse steps
WALK_VALUES = 4096  # a body of at most this many JSON values is walked for repeated keys
_QUOTE, _BACKSLASH, _OPEN, _CLOSE = b'"\\{}'
# a ``\u003a`` escape (a colon) in a string: an odd run of backslashes before ``u003a``
_COLON_ESCAPE = re.compile(rb"(?<!\\)(?:\\\\)*\\u003[aA]")
ESCAPED_CHAR_BYTES = 12  # the most JSON text one character takes: ``\ud83d\ude00``
_MEMBERS_LOOKED_AT = 4  # per field, when checking string lengths before a parse


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise InvalidJSON(f"request body has the key {key!r} twice", param=key)
            seen.add(key)
    return obj


def _check_depth(raw: bytes) -> None:
    """:class:`InvalidJSON` when the containers of ``raw`` (valid JSON) nest deeper than
    ``MAX_DEPTH``: its brackets and braces outside strings, counted up and down, in a few
    vectorised passes (walking the decoded value costs a Python step per item)."""
    view = np.frombuffer(raw, np.uint8)
    folded = view | 0x20  # "[" as "{" and "]" as "}"
    marks = np.flatnonzero((folded == _OPEN) | (folded == _CLOSE))
    quotes = real_quotes(view)
    if quotes.size:  # inside a string: after an odd number of quotes
        marks = marks[np.searchsorted(quotes, marks) % 2 == 0]
    steps = np.where(folded[marks] == _OPEN, 1, -1)
    if steps.size and int(np.cumsum(steps).max()) > MAX_DEPTH:
        raise InvalidJSON(f"request body nests deeper than {MAX_DEPTH} levels")


def byte_counts(text: bytes, chars: bytes) -> list[int]:
    """How many times each byte of ``chars`` occurs in ``text``."""
    if len(text) < VECTOR_BYTES:
        return [text.count(c) for c in chars]
    view = np.frombuffer(text, np.uint8)
    return [int(np.count_nonzero(view == c)) for c in chars]


def _has_duplicate_keys(raw: bytes, data: Any, colons: int) -> bool:
    """Whether an object of ``raw`` (valid JSON, decoded as ``data``) repeats a key.

    Outside strings, every colon of a JSON text separates one member; the decoded value
    has one member per key it kept, and its strings hold the colons of ``raw``'s strings
    plus one per ``\\u003a`` escape. A repeated key leaves fewer members, so fewer
    colons. ``colons``: those of ``raw``. A value of at most ``WALK_VALUES`` values (a
    long prompt in a small body) is walked, its strings' colons counted in C; a larger
    one is re-encoded and its colons counted (two byte counts in C, whatever the body
    holds, but a re-encoding of all of it)."""
    if b"\\u003" in raw:
        colons += len(_COLON_ESCAPE.findall(raw))
    decoded = _decoded_colons(data)
    if decoded is None:
        decoded = byte_counts(orjson.dumps(data), b":")[0]
    return colons > decoded


def _decoded_colons(data: Any) -> int | None:
    """The colons ``data`` would have re-encoded (one per object member, plus those of
    every key and string), or None when it holds more than ``WALK_VALUES`` values."""
    colons, left = 0, WALK_VALUES
    pending = [data]
    while pending:
        value = pending.pop()
        if isinstance(value, str):
            colons += value.count(":")
        elif isinstance(value, dict | list):
            left -= len(value)
            if left < 0:
                return None
            if isinstance(value, list):
                pending.extend(value)
                continue
            colons += len(value)
            for key, item in value.items():
                colons += key.count(":")
                pending.append(item)
    return colons


def _decode(raw: bytes) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidJSON(f"request body is not valid JSON: a string: {exc.msg}") from None


def _check_nesting(raw: bytes) -> int:
    """:func:`_check_depth` where ``raw`` has brackets enough to nest too deep; the
    number of colons in ``raw``."""
    colons, brackets, braces = byte_counts(raw, b":[{")
    if brackets + braces > MAX_DEPTH:  # else it cannot nest deeper
        _check_depth(raw)
    return colons


def _check_keys(raw: bytes, data: Any, colons: int) -> None:
    if _has_duplicate_keys(raw, data, colons):  # rare: parse again, slowly, to name the key
        json.loads(raw, object_pairs_hook=_no_duplicates)
        raise InvalidJSON("request body has a key twice")


def parse_json(raw: bytes) -> Any:
    """The decoded body; :class:`InvalidJSON` if it is not strict JSON (see above)."""
    data = _decode(raw)
    _check_keys(raw, data, _check_nesting(raw))
    return data


async def parse_json_async(raw: bytes) -> Any:
    """:func:`parse_json`, letting the event loop run between its steps when ``raw`` is
    longer than ``YIELD_BYTES``: its long string values are cut out and decoded a slice
    at a time, and the rest (decoding, counting, re-encoding: about a millisecond a
    megabyte each) is read a step at a time (:mod:`gateway.http.json_slices`)."""
    if len(raw) <= YIELD_BYTES:
        return parse_json(raw)
    await asyncio.sleep(0)
    long = cut_long_strings(raw)
    text = raw if long is None else long.skeleton
    await asyncio.sleep(0)
    data = _decode(text)
    await asyncio.sleep(0)
    colons = _check_nesting(text)
    await asyncio.sleep(0)
    _check_keys(text, data, colons)
    if long is None:
        return data
    try:
        return await long.fill(data)
    except orjson.JSONDecodeError as exc:
        raise InvalidJSON(f"request body is not valid JSON: a string: {exc.msg}") from None


@functools.cache
def string_bounds(model: type[BaseModel]) -> dict[str, int]:
    """The most characters each string field of ``model`` with a ``max_length`` may hold."""
    return {
        name: meta.max_length
        for name, field in model.model_fields.items()
        for meta in field.metadata
        if isinstance(getattr(meta, "max_length", None), int)
    }


@functools.cache
def _string_members(names: tuple[str, ...]) -> re.Pattern[bytes]:
    alternatives = b"|".join(re.escape(name.encode()) for name in names)
    return re.compile(rb'"(' + alternatives + rb')"\s*:\s*"')


def check_string_lengths(raw: bytes, model: type[BaseModel]) -> None:
    """:class:`InvalidRequest`, as :func:`validate` would answer, when the JSON text
    ``raw`` (a whole body, or the start of one still arriving) has a string member that
    is surely longer than ``model`` allows, before anything is parsed: the bytes from its
    opening quote to the next quote (where it ends, or before) are more than
    ``ESCAPED_CHAR_BYTES`` per character allowed. A key counts only after ``{`` or ``,``
    (in a string a quote is escaped), at any depth: for a flat wire type, a body with
    such a member nested is refused anyway."""
    bounds = string_bounds(model)
    if not bounds:
        return
    found = _string_members(tuple(bounds)).finditer(raw)
    counted: dict[bytes, int] = {}
    for match in itertools.islice(found, _MEMBERS_LOOKED_AT * len(bounds)):
        name = match.group(1)
        counted[name] = counted.get(name, 0) + 1
        before = raw[max(0, match.start() - 64) : match.start()].rstrip()
        if counted[name] > _MEMBERS_LOOKED_AT or before[-1:] not in (b"{", b","):
            continue
        start = match.end()
        end = raw.find(b'"', start)
        most = bounds[name.decode()]
        if (end if end >= 0 else len(raw)) - start > ESCAPED_CHAR_BYTES * most:
            field = name.decode()
            raise InvalidRequest(
                f"{field}: String should have at most {most} characters",
                param=field,
                code="invalid_field",
            )


def validate(model: type[ModelT], data: Any) -> ModelT:
    """``data`` as ``model``; :class:`InvalidRequest` naming the first bad field if not."""
    try:
        return model.model_validate(data)
    except ValidationError as err:
        first = err.errors()[0]
        loc = ".".join(str(p) for p in first["loc"]) or "body"
        raise InvalidRequest(f"{loc}: {first['msg']}", param=loc, code="invalid_field") from None
