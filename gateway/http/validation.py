"""Request bodies into wire types: the one place a bad body becomes a 400.

Bad JSON is :class:`InvalidJSON` (``invalid_json``); a body that fails a wire type's
validation is :class:`InvalidRequest` (``invalid_field``) naming the first bad field.

JSON is read strictly, so that what the gateway validates is what it forwards: an
object with a key twice (providers disagree on which one wins: the gateway could validate
one model and forward another), nesting deeper than ``MAX_DEPTH``, and strings with a
lone surrogate (``"\\ud800"``: valid JSON, but not UTF-8, so a body rewritten for the
upstream could not be encoded) are :class:`InvalidJSON` too. Bodies over
``OFF_LOOP_BYTES`` are parsed on a worker thread so the event loop keeps serving others.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from gateway.errors import InvalidJSON, InvalidRequest

ModelT = TypeVar("ModelT", bound=BaseModel)

MAX_DEPTH = 64
OFF_LOOP_BYTES = 256 << 10
# a \uD800-\uDFFF escape, or a surrogate encoded as (invalid) UTF-8 bytes
_MAYBE_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]|\xed[\xa0-\xbf]")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise InvalidJSON(f"request body has the key {key!r} twice", param=key)
            seen.add(key)
    return obj


def _check_shape(data: Any, check_strings: bool) -> None:
    """Depth bound (and, when asked, lone surrogates) over the parsed value, iteratively."""
    stack: list[tuple[Any, int]] = [(data, 0)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict):
            children: Any = value.values()
            if check_strings:
                children = [*value, *children]
        elif isinstance(value, list):
            children = value
        else:
            if check_strings and isinstance(value, str):
                try:
                    value.encode("utf-8")
                except UnicodeEncodeError:
                    raise InvalidJSON(
                        "request body has a string with a lone surrogate (not valid Unicode)"
                    ) from None
            continue
        if depth >= MAX_DEPTH:
            raise InvalidJSON(f"request body nests deeper than {MAX_DEPTH} levels")
        stack.extend((child, depth + 1) for child in children)


def parse_json(raw: bytes) -> Any:
    """The decoded body; :class:`InvalidJSON` if it is not strict JSON (see above)."""
    try:
        data = json.loads(raw, object_pairs_hook=_no_duplicates)
    except RecursionError:
        raise InvalidJSON(f"request body nests deeper than {MAX_DEPTH} levels") from None
    except ValueError as exc:  # UnicodeDecodeError included
        raise InvalidJSON(f"request body is not valid JSON: {exc}") from None
    _check_shape(data, check_strings=_MAYBE_SURROGATE.search(raw) is not None)
    return data


async def read_json(raw: bytes) -> Any:
    """:func:`parse_json`, on a worker thread for bodies over ``OFF_LOOP_BYTES``."""
    if len(raw) > OFF_LOOP_BYTES:
        return await asyncio.to_thread(parse_json, raw)
    return parse_json(raw)


def validate(model: type[ModelT], data: Any) -> ModelT:
    """``data`` as ``model``; :class:`InvalidRequest` naming the first bad field if not."""
    try:
        return model.model_validate(data)
    except ValidationError as err:
        first = err.errors()[0]
        loc = ".".join(str(p) for p in first["loc"]) or "body"
        raise InvalidRequest(f"{loc}: {first['msg']}", param=loc, code="invalid_field") from None
