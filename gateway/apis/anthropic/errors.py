"""Errors in Anthropic's shape: ``{"type": "error", "error": {"type", "message"}}``.

The status stays the gateway's; the ``error.type`` follows it as Anthropic's API does
(400 ``invalid_request_error``, 401 ``authentication_error``, 403 ``permission_error``,
404 ``not_found_error``, 413 ``request_too_large``, 429 ``rate_limit_error``, 503 and 529
``overloaded_error``, 504 ``timeout_error``, other 5xx ``api_error``).
"""

from __future__ import annotations

from typing import Any

import orjson
from pydantic import ValidationError

from gateway.errors import GatewayError, InvalidRequest
from sdk.wire import MessagesError, MessagesErrorDetail

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    504: "timeout_error",
    529: "overloaded_error",
}
# loc parts pydantic adds for a union's branches ("str", "list[...]"): not fields
_BRANCHES = frozenset({"str", "int", "float", "bool", "list", "dict", "none"})


def error_type(status: int) -> str:
    """Anthropic's ``error.type`` for an HTTP status."""
    if status in _TYPES:
        return _TYPES[status]
    return "api_error" if status >= 500 else "invalid_request_error"


def body(status: int, message: str) -> bytes:
    """The error body for ``status`` with ``message``."""
    error = MessagesError(error=MessagesErrorDetail(type=error_type(status), message=message))
    return orjson.dumps(error.model_dump())


def error_body(error: GatewayError) -> bytes:
    """A gateway error as Anthropic's error body."""
    return body(error.status, error.message)


def from_openai(status: int, raw: bytes) -> bytes:
    """An OpenAI error body (``{"error": {"message", ...}}``, from an endpoint) in
    Anthropic's shape; a body that is not one keeps its text as the message."""
    message: Any = None
    try:
        payload = orjson.loads(raw)
    except orjson.JSONDecodeError:
        payload = None
    if isinstance(payload, dict):
        detail = payload.get("error")
        message = detail.get("message") if isinstance(detail, dict) else detail
    if not isinstance(message, str) or not message:
        message = raw.decode(errors="replace")[:1000] or f"HTTP {status}"
    return body(status, message)


def _is_branch(part: Any) -> bool:
    return isinstance(part, str) and ("[" in part or part in _BRANCHES)


def _path(loc: tuple[Any, ...], data: Any) -> str:
    """``loc`` as a dotted path of the body's own fields: pydantic's union branch names and
    tags (``list[tagged-union[...]]``, ``text``) are dropped by walking ``data`` with it."""
    parts: list[str] = []
    node = data
    for i, part in enumerate(loc):
        in_dict = isinstance(node, dict) and isinstance(part, str) and part in node
        in_list = isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node)
        if in_dict or in_list:
            node = node[part]
        elif i < len(loc) - 1 or _is_branch(part):
            continue
        parts.append(str(part))
    return ".".join(parts) or "body"


def invalid(err: ValidationError, data: Any) -> InvalidRequest:
    """A 400 for a body that failed validation: the first field's deepest error (a union
    reports one error per branch; the deepest is the one that says what is wrong)."""
    errors = err.errors()
    first = errors[0]["loc"][:1]
    same = [e for e in errors if e["loc"][:1] == first]
    chosen = max(same, key=lambda e: len(_path(e["loc"], data).split(".")))
    path = _path(chosen["loc"], data)
    return InvalidRequest(f"{path}: {chosen['msg']}", param=path, code="invalid_field")
