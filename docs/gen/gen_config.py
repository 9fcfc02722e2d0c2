"""The configuration reference, read from the pydantic models of ``gateway/config.py``:
every TOML key with its type, default, bounds, description and environment override."""

from __future__ import annotations

import inspect
import json
import types
import typing
from collections.abc import Iterator
from typing import Any, Literal

import annotated_types
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from gateway.config import Settings

PREFIX = "DRAFTGATE_"

# What a field means, for the fields whose model gives no description. Keyed by dotted path;
# a key that names no field fails the build, so this cannot outlive the field.
NOTES = {
    "endpoints": "the upstreams; each `[[endpoints]]` table is one",
    "keys": "gateway API keys; none: a single-tenant gateway for loopback clients only",
    "redis": "the shared store; without `url` documents and limits live in the process",
    "documents": "stored documents and captured answers",
    "limits": "per-tenant limits",
    "server": "how `draftgate serve` runs uvicorn",
    "routing": "how a model's endpoints share its traffic",
    "capture": "store answers and request code blocks as documents to draft from",
    "max_body_bytes": "a request body's size limit (413 past it)",
    "allow_public_bind": "allow a non-loopback bind without `[[keys]]` (like `--allow-public`)",
    "endpoints.name": "the endpoint's name in records, audits, `[fallback]` and headers",
    "endpoints.kind": "the provider or engine; it decides the wire dialect and capabilities",
    "endpoints.base_url": "the API root; hosted kinds have a default; a `local` endpoint with "
    "a `base_url` is a `draftgate verifier` process",
    "endpoints.api_key_env": "the variable the upstream's key is read from (never the file)",
    "endpoints.models": "names clients send: strings or `{name, aliases, upstream}` tables",
    "endpoints.device": "local kind: torch device (unset: the best available)",
    "endpoints.dtype": "local kind: `float32`, `bf16` or `native` (a .gguf file's quantized "
    "blocks as they are); each a different target; unset: bf16 on CUDA and on CPUs with bf16 "
    "arithmetic, float32 elsewhere",
    "endpoints.connect_timeout_s": "connect timeout",
    "endpoints.retries": "retries before the first byte only",
    "endpoints.backoff_s": "first retry back-off, doubled per retry",
    "endpoints.max_backoff_s": "longest retry back-off",
    "endpoints.retry_after_cap_s": "longest `Retry-After` honoured from an upstream",
    "endpoints.max_connections": "connection pool size",
    "endpoints.models.name": "the name clients send",
    "endpoints.models.aliases": "other names clients may send",
    "endpoints.models.upstream": "the provider's name for it (Azure: the deployment)",
    "keys.key_env": "the variable the gateway key is read from",
    "keys.tenant": "the tenant: the key's document namespace and limits",
    "redis.url": "`redis://`, `rediss://`, `unix://`, `redis+cluster://` or "
    "`rediss+cluster://`; unset: in memory",
    "redis.prefix": "key prefix of everything the gateway stores",
    "redis.timeout_s": "socket timeout of a Redis call",
    "documents.ttl_s": "a document's lifetime since its last use",
    "limits.requests_per_minute": "requests per fixed minute",
    "routing.strategy": "`least-busy`, `prefix` or `ordered`",
    "routing.prefix_chars": "prefix: how much of a request's opening is hashed",
    "routing.load_factor": "prefix: most an endpoint takes of its fair share of requests",
    "routing.window_s": "the window `failures` are counted in",
    "routing.max_eject_s": "longest ejection",
}


def _type_name(annotation: Any) -> str:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is Literal:
        return " \\| ".join(f'`"{a}"`' for a in args)
    if origin in (typing.Union, types.UnionType):
        names = [_type_name(a) for a in args if a is not type(None)]
        return " \\| ".join(names) + (" (optional)" if type(None) in args else "")
    if origin is tuple:
        return f"list of {_type_name(args[0])}"
    if origin is dict:
        return f"table of {_type_name(args[0])} to {_type_name(args[1])}"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "table"
    return f"`{getattr(annotation, '__name__', str(annotation))}`"


_BOUNDS = {
    annotated_types.Gt: (">", "gt"),
    annotated_types.Ge: (">=", "ge"),
    annotated_types.Lt: ("<", "lt"),
    annotated_types.Le: ("<=", "le"),
}


def _bounds(info: FieldInfo) -> str:
    parts = []
    for item in info.metadata:
        for kind, (sign, attribute) in _BOUNDS.items():
            if isinstance(item, kind):
                parts.append(f"{sign} {getattr(item, attribute)}")
        if isinstance(item, annotated_types.MinLen):
            parts.append("not empty" if item.min_length == 1 else f">= {item.min_length} long")
        pattern = getattr(item, "pattern", None)
        if pattern:
            parts.append(f"matches `{pattern}`")
    return ", ".join(parts)


def _default(info: FieldInfo) -> str:
    if info.is_required():
        return "required"
    value = info.get_default(call_default_factory=True)
    if isinstance(value, BaseModel):
        return "(its keys' defaults)"
    if isinstance(value, tuple) and value and isinstance(value[0], BaseModel):
        return "the embedded default (below)"
    if value is None:
        return "unset"
    if isinstance(value, tuple):
        value = list(value)
    return f"`{json.dumps(value)}`"


def _model_of(annotation: Any) -> type[BaseModel] | None:
    """The model a field holds: itself, or the item of a tuple of models."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) is tuple:
        return _model_of(typing.get_args(annotation)[0])
    return None


def _description(path: str, info: FieldInfo, used: set[str]) -> str:
    if info.description:
        return info.description
    if path in NOTES:
        used.add(path)
        return NOTES[path]
    return ""


def _rows(model: type[BaseModel], path: str, env: str | None, used: set[str]) -> Iterator[str]:
    for name, info in model.model_fields.items():
        dotted = f"{path}.{name}" if path else name
        variable = f"`{env}__{name.upper()}`" if env else "(in the list's JSON)"
        bounds = _bounds(info)
        yield (
            f"| `{name}` | {_type_name(info.annotation)} | {_default(info)} | {bounds} "
            f"| {_description(dotted, info, used)} | {variable} |"
        )


_HEADER = "| key | type | default | bounds | meaning | environment |\n|---|---|---|---|---|---|"


def _section(
    title: str, model: type[BaseModel], path: str, env: str | None, used: set[str]
) -> list[str]:
    doc = inspect.cleandoc(model.__doc__ or "")
    lines = [f"### `{title}`", ""]
    if doc and model.__module__ == "gateway.config":
        lines += [doc.replace("``", "`"), ""]
    lines += [_HEADER, *_rows(model, path, env, used), ""]
    for name, info in model.model_fields.items():
        inner = _model_of(info.annotation)
        if inner is not None:
            nested = None if env is None else f"{env}__{name.upper()}"
            lines += _section(f"{path}.{name}", inner, f"{path}.{name}", nested, used)
    return lines


def _example_default() -> str:
    endpoints = Settings.model_fields["endpoints"].get_default(call_default_factory=True)
    lines = []
    for endpoint in endpoints:
        lines.append("[[endpoints]]")
        for key, value in endpoint.model_dump(exclude_defaults=True).items():
            lines.append(f"{key} = {_toml(value)}")
    return "\n".join(lines)


def _toml(value: Any) -> str:
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + " }"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return json.dumps(value)


def config_reference() -> str:
    """The reference's Markdown; raises if a note names a field that does not exist."""
    used: set[str] = set()
    top = ["| key | type | default | bounds | meaning | environment |", "|---|---|---|---|---|---|"]
    sections: list[str] = []
    for name, info in Settings.model_fields.items():
        model = _model_of(info.annotation)
        env = f"{PREFIX}{name.upper()}"
        if model is None:
            top.append(
                f"| `{name}` | {_type_name(info.annotation)} | {_default(info)} "
                f"| {_bounds(info)} | {_description(name, info, used)} | `{env}` |"
            )
            continue
        listed = typing.get_origin(info.annotation) is tuple
        title = f"[[{name}]]" if listed else f"[{name}]"
        top.append(
            f"| `{name}` | {_type_name(info.annotation)} | {_default(info)} | "
            f"| {_description(name, info, used)} | `{env}` (JSON) |"
        )
        sections += _section(title, model, name, None if listed else env, used)
    unused = sorted(k for k in NOTES if k not in used)
    if unused:
        raise ValueError(f"gen_config.NOTES: no field without a description is named {unused}")
    default = _example_default()
    return "\n".join(
        [
            "### Top level",
            "",
            *top,
            "",
            "With no file the gateway runs the embedded default endpoint:",
            "",
            "```toml",
            default,
            "```",
            "",
            *sections,
        ]
    )
