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
not let the loop run meanwhile, only add a hand-over.
"""

from __future__ import annotations

import json
import re
from typing import Any, TypeVar

import orjson
from pydantic import BaseModel, ValidationError

from gateway.errors import InvalidJSON, InvalidRequest

ModelT = TypeVar("ModelT", bound=BaseModel)

MAX_DEPTH = 64
_CONTAINERS = (dict, list)
# a ``\u003a`` escape (a colon) in a string: an odd run of backslashes before ``u003a``
_COLON_ESCAPE = re.compile(rb"(?<!\\)(?:\\\\)*\\u003[aA]")


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


def _has_duplicate_keys(raw: bytes, data: Any) -> bool:
    """Whether an object of ``raw`` (valid JSON, decoded as ``data``) repeats a key.

    Outside strings, every colon of a JSON text separates one member; re-encoded, the
    decoded value has one colon per member it kept, plus the colons of its strings (those
    of ``raw``'s strings, and one per ``\\u003a`` escape). Two byte counts in C, whatever
    the body holds; a repeated key leaves fewer members, so fewer colons.
    """
    colons = raw.count(b":")
    if b"u003" in raw:
        colons += len(_COLON_ESCAPE.findall(raw))
    return colons > orjson.dumps(data).count(b":")


def parse_json(raw: bytes) -> Any:
    """The decoded body; :class:`InvalidJSON` if it is not strict JSON (see above)."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidJSON(f"request body is not valid JSON: {exc}") from None
    if raw.count(b"[") + raw.count(b"{") > MAX_DEPTH:  # else it cannot nest deeper
        _check_depth(data)
    if _has_duplicate_keys(raw, data):  # rare: parse again, slowly, to name the key
        json.loads(raw, object_pairs_hook=_no_duplicates)
        raise InvalidJSON("request body has a key twice")
    return data


def validate(model: type[ModelT], data: Any) -> ModelT:
    """``data`` as ``model``; :class:`InvalidRequest` naming the first bad field if not."""
    try:
        return model.model_validate(data)
    except ValidationError as err:
        first = err.errors()[0]
        loc = ".".join(str(p) for p in first["loc"]) or "body"
        raise InvalidRequest(f"{loc}: {first['msg']}", param=loc, code="invalid_field") from None
