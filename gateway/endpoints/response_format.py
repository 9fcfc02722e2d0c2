"""``response_format`` on local endpoints: OpenAI's structured-output field to a grammar.

``text`` (or no field) is plain generation; ``json_object`` constrains the answer to a
JSON object and ``json_schema`` to JSON matching ``json_schema.schema`` (with or without
``strict``: the grammar always enforces it). On the event loop only the field's shape is
checked; the engine compiles the schema on the thread that submits the request, and a
schema it rejects is a 400 from :func:`rejected`. local_verifier is imported lazily.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gateway.errors import InvalidRequest

if TYPE_CHECKING:
    from local_verifier.grammar import InvalidGrammar, JsonSchema

FIELD = "response_format"
_KINDS = ("text", "json_object", "json_schema")


def grammar_for(value: Any) -> JsonSchema | None:
    """The engine grammar for a request's ``response_format`` (None: plain text).

    Raises ``InvalidRequest`` (param ``response_format``) naming the part whose shape is
    wrong; the schema itself is checked when the engine compiles it.
    """
    from local_verifier.grammar import JsonSchema

    if value is None:
        return None
    if not isinstance(value, dict):
        raise _bad(f"{FIELD} must be an object")
    kind = value.get("type")
    if kind not in _KINDS:
        raise _bad(f"{FIELD}.type must be one of {', '.join(_KINDS)}, got {kind!r}")
    if kind == "text":
        return None
    if kind == "json_object":
        return JsonSchema()
    spec = value.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
        raise _bad(f"{FIELD}.json_schema must be an object with a string 'name'")
    schema = spec.get("schema", {})
    if not isinstance(schema, dict):
        raise _bad(f"{FIELD}.json_schema.schema must be a JSON schema object")
    if not isinstance(spec.get("strict", False), bool | None):
        raise _bad(f"{FIELD}.json_schema.strict must be a boolean")
    return JsonSchema(schema)


def rejected(grammar: str | JsonSchema | None, error: InvalidGrammar) -> InvalidRequest:
    """The 400 for a request whose ``grammar_for`` grammar the engine could not compile."""
    schema = getattr(grammar, "schema", None)
    part = FIELD if schema is None else f"{FIELD}.json_schema.schema"
    return _bad(f"{part}: {error}")


def _bad(message: str) -> InvalidRequest:
    return InvalidRequest(message, param=FIELD)
