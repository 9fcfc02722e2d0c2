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
not let the loop run meanwhile, only add a hand-over. The strictness checks count bytes
(with numpy past ``VECTOR_BYTES``: ``bytes.count`` reads about 1.5 GB/s, a vectorised
compare several times that), so they cost a fraction of the parse itself.
"""

from __future__ import annotations

import functools
import itertools
import json
import re
from typing import Any, TypeVar

import numpy as np
import orjson
from pydantic import BaseModel, ValidationError

from gateway.errors import InvalidJSON, InvalidRequest

ModelT = TypeVar("ModelT", bound=BaseModel)

MAX_DEPTH = 64
VECTOR_BYTES = 64 * 1024  # longer texts are counted with numpy
_CONTAINERS = (dict, list)
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


def _check_depth(data: Any) -> None:
    """:class:`InvalidJSON` when containers nest deeper than ``MAX_DEPTH`` (iteratively;
    only containers are visited, so long lists of scalars cost one pass in C)."""
    level = [data] if isinstance(data, _CONTAINERS) else []
    depth = 0
    while level:
        if depth >= MAX_DEPTH:
            raise InvalidJSON(f"request body nests deeper than {MAX_DEPTH} levels")
        nested: list[Any] = []
        for value in level:
            children = value.values() if isinstance(value, dict) else value
            nested += [c for c in children if isinstance(c, _CONTAINERS)]
        level, depth = nested, depth + 1


def byte_counts(text: bytes, chars: bytes) -> list[int]:
    """How many times each byte of ``chars`` occurs in ``text``."""
    if len(text) < VECTOR_BYTES:
        return [text.count(c) for c in chars]
    view = np.frombuffer(text, np.uint8)
    return [int(np.count_nonzero(view == c)) for c in chars]


def _has_duplicate_keys(raw: bytes, data: Any, colons: int) -> bool:
    """Whether an object of ``raw`` (valid JSON, decoded as ``data``) repeats a key.

    Outside strings, every colon of a JSON text separates one member; re-encoded, the
    decoded value has one colon per member it kept, plus the colons of its strings (those
    of ``raw``'s strings, and one per ``\\u003a`` escape). Two byte counts in C, whatever
    the body holds; a repeated key leaves fewer members, so fewer colons. ``colons``: those
    of ``raw``.
    """
    if b"\\u003" in raw:
        colons += len(_COLON_ESCAPE.findall(raw))
    return colons > byte_counts(orjson.dumps(data), b":")[0]


def parse_json(raw: bytes) -> Any:
    """The decoded body; :class:`InvalidJSON` if it is not strict JSON (see above)."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidJSON(f"request body is not valid JSON: {exc}") from None
    colons, brackets, braces = byte_counts(raw, b":[{")
    if brackets + braces > MAX_DEPTH:  # else it cannot nest deeper
        _check_depth(data)
    if _has_duplicate_keys(raw, data, colons):  # rare: parse again, slowly, to name the key
        json.loads(raw, object_pairs_hook=_no_duplicates)
        raise InvalidJSON("request body has a key twice")
    return data


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
