"""``response_format`` on local endpoints: OpenAI's structured-output field to a grammar.

``text`` (or no field) is plain generation; ``json_object`` constrains the answer to a
JSON object and ``json_schema`` to JSON matching ``json_schema.schema`` (with or without
``strict``: the grammar always enforces it). local_verifier is imported lazily.
"""

from __future__ import annotations

from typing import Any

from gateway.errors import InvalidRequest

FIELD = "response_format"
_KINDS = ("text", "json_object", "json_schema")


def grammar_for(value: Any) -> str | None:
    """The engine grammar for a request's ``response_format`` (None: plain text).

    Raises ``InvalidRequest`` (param ``response_format``) naming the part that is wrong.
    """
    from local_verifier.grammar import json_grammar

    if value is None:
        return None
    if not isinstance(value, dict):
        raise _bad(f"{FIELD} must be an object")
    kind = value.get("type")
    if kind not in _KINDS:
        raise _bad(f"{FIELD}.type must be one of {', '.join(_KINDS)}, got {kind!r}")
    if kind == "text":
        return None
    schema = None
    if kind == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
            raise _bad(f"{FIELD}.json_schema must be an object with a string 'name'")
        schema = spec.get("schema", {})
        if not isinstance(schema, dict):
            raise _bad(f"{FIELD}.json_schema.schema must be a JSON schema object")
        if not isinstance(spec.get("strict", False), bool | None):
            raise _bad(f"{FIELD}.json_schema.strict must be a boolean")
    try:
        return json_grammar(schema)
    except ValueError as exc:
        raise _bad(f"{FIELD}.json_schema.schema: {exc}") from None


def _bad(message: str) -> InvalidRequest:
    return InvalidRequest(message, param=FIELD)
