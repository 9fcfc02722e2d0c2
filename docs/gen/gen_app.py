"""What the gateway app says about itself: the HTTP API from its ``GET /openapi.json``
and its Prometheus series from ``GET /metrics``. The app (the embedded default settings)
is built in process and asked through an in-memory transport: no socket, no network, no
model load."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx

from gateway.app import create_app
from gateway.config import build_settings

METHODS = ("get", "post", "put", "patch", "delete")


async def _fetch(path: str) -> httpx.Response:
    app = create_app(build_settings({}))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
        response = await client.get(path)
        response.raise_for_status()
        return response


def get(path: str) -> httpx.Response:
    """The app's answer to ``GET path``."""
    return asyncio.run(_fetch(path))


def _schema_type(schema: dict[str, Any]) -> str:
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return f"[{name}](#{name.lower()})"
    if "anyOf" in schema:
        kinds = [s for s in schema["anyOf"] if s.get("type") != "null"]
        return " or ".join(_schema_type(s) for s in kinds) or "null"
    kind = schema.get("type")
    if kind == "array":
        return f"array of {_schema_type(schema.get('items', {}))}"
    if isinstance(kind, list):
        return " or ".join(kind)
    if "enum" in schema:
        return " \\| ".join(f"`{json.dumps(v)}`" for v in schema["enum"])
    if "const" in schema:
        return f"`{json.dumps(schema['const'])}`"
    return kind or "any"


_BOUNDS = {
    "minimum": ">=",
    "exclusiveMinimum": ">",
    "maximum": "<=",
    "exclusiveMaximum": "<",
    "minLength": "length >=",
    "maxLength": "length <=",
    "minItems": "items >=",
    "maxItems": "items <=",
}


def _bounds(schema: dict[str, Any]) -> str:
    found = [schema, *schema.get("anyOf", [])]
    return ", ".join(f"{sign} {s[key]}" for s in found for key, sign in _BOUNDS.items() if key in s)


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _schema_section(name: str, schema: dict[str, Any]) -> list[str]:
    lines = [f"### {name}", ""]
    if schema.get("description"):
        lines += [_cell(schema["description"]), ""]
    properties = schema.get("properties", {})
    if not properties:
        return [*lines, f"Type: {_schema_type(schema)}.", ""]
    required = set(schema.get("required", ()))
    lines += [
        "| field | type | required | bounds | default | description |",
        "|---|---|---|---|---|---|",
    ]
    for field, spec in properties.items():
        default = f"`{json.dumps(spec['default'])}`" if "default" in spec else ""
        lines.append(
            f"| `{field}` | {_schema_type(spec)} | {'yes' if field in required else ''} "
            f"| {_bounds(spec)} | {default} | {_cell(spec.get('description', ''))} |"
        )
    if schema.get("additionalProperties") is True:
        lines += [
            "",
            "Fields not listed are accepted here; what an endpoint does with them is in "
            "[Local models](local-models.md#request-fields) and [Providers](providers.md).",
        ]
    return [*lines, ""]


def http_reference() -> str:
    """The routes, then the schemas of their request bodies."""
    document: dict[str, Any] = get("/openapi.json").json()
    lines = [
        "## Routes",
        "",
        "| method | path | what | key | body | success |",
        "|---|---|---|---|---|---|",
    ]
    for path, item in document["paths"].items():
        for method in METHODS:
            operation = item.get(method)
            if operation is None:
                continue
            body = operation.get("requestBody", {}).get("content", {}).get("application/json", {})
            body_type = _schema_type(body["schema"]) if body else ""
            key = "no" if operation.get("security") == [] else "yes"
            ok = next(code for code in operation["responses"] if code != "default")
            lines.append(
                f"| `{method.upper()}` | `{path}` | {_cell(operation['summary'])} | {key} "
                f"| {body_type} | {ok} |"
            )
    lines += ["", "## Schemas", ""]
    for name, schema in document["components"]["schemas"].items():
        lines += _schema_section(name, schema)
    return "\n".join(lines)


def metrics_reference() -> str:
    """Every series ``GET /metrics`` describes: name, type and help text."""
    kinds: dict[str, str] = {}
    helps: dict[str, str] = {}
    for line in get("/metrics").text.splitlines():
        if line.startswith("# HELP "):
            name, _, text = line[len("# HELP ") :].partition(" ")
            helps[name] = text
        elif line.startswith("# TYPE "):
            name, _, kind = line[len("# TYPE ") :].partition(" ")
            kinds[name] = kind
    lines = ["| series | type | what |", "|---|---|---|"]
    for name, kind in kinds.items():
        if not name.endswith("_created"):  # the counters' creation times
            lines.append(f"| `{name}` | {kind} | {_cell(helps.get(name, ''))} |")
    return "\n".join(lines)
