"""The gateway's error hierarchy and its OpenAI-style JSON form.

Every error a client sees is one of these, rendered as
``{"error": {"message", "type", "code", "param"}}`` with the class's HTTP status; a
message never carries a stack trace or a credential (:func:`redact`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable

_KEY_PATTERN = re.compile(r"\b(sk|key|pk|fw|csk)[-_][A-Za-z0-9*_\-]{6,}")
MAX_MESSAGE_CHARS = 1000


def redact(message: str, secrets: Iterable[str] = ()) -> str:
    """Remove anything that looks like an API key (and the given secrets) from a message."""
    for secret in secrets:
        if secret:
            message = message.replace(secret, "[redacted]")
    message = _KEY_PATTERN.sub("[redacted]", message)
    return message[:MAX_MESSAGE_CHARS]


class GatewayError(Exception):
    """Base class: an error answered to the client with ``status`` and OpenAI-style JSON."""

    status: int = 500
    type: str = "server_error"
    code: str = "internal_error"

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code
        self.headers = headers or {}

    def payload(self) -> dict[str, object]:
        """The JSON object sent to the client."""
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "code": self.code,
                "param": self.param,
            }
        }

    def body(self) -> bytes:
        return json.dumps(self.payload()).encode()


class InvalidRequest(GatewayError):
    """400: the request body or a field is wrong."""

    status = 400
    type = "invalid_request_error"
    code = "invalid_request"


class InvalidJSON(InvalidRequest):
    code = "invalid_json"


class AuthenticationFailed(GatewayError):
    """401: missing or unknown gateway key."""

    status = 401
    type = "authentication_error"
    code = "invalid_api_key"


class PermissionDenied(GatewayError):
    """403: a valid key that may not do this (audits and probes need an admin key)."""

    status = 403
    type = "permission_error"
    code = "permission_denied"


class Conflict(GatewayError):
    """409: the gateway is already doing this (one audit at a time, one probe per endpoint)."""

    status = 409
    type = "invalid_request_error"
    code = "conflict"


class NotFound(GatewayError):
    """404: an unknown route, document id, or the like."""

    status = 404
    type = "invalid_request_error"
    code = "not_found"


class ModelNotFound(NotFound):
    code = "model_not_found"


class PayloadTooLarge(GatewayError):
    """413: the body (or a document) is over the limit."""

    status = 413
    type = "invalid_request_error"
    code = "payload_too_large"


class RequestTimeout(GatewayError):
    """408: the request body did not arrive in time."""

    status = 408
    type = "invalid_request_error"
    code = "request_timeout"


class RateLimited(GatewayError):
    """429: a tenant's limit is reached, or the upstream kept answering 429 after
    retries and fallbacks."""

    status = 429
    type = "rate_limit_error"
    code = "rate_limit_exceeded"


class ServiceUnavailable(GatewayError):
    """503: a gateway resource (local queue, document store) cannot serve now."""

    status = 503
    type = "server_error"
    code = "service_unavailable"


class InsufficientStorage(GatewayError):
    """507: the document store is full (Redis at ``maxmemory``); nothing was stored."""

    status = 507
    type = "server_error"
    code = "insufficient_storage"


class UpstreamError(GatewayError):
    """502: the upstream failed or answered an error that is not the client's fault."""

    status = 502
    type = "upstream_error"
    code = "bad_gateway"


class UpstreamTimeout(UpstreamError):
    """504: the upstream did not answer in time."""

    status = 504
    code = "gateway_timeout"


class UpstreamRejected(GatewayError):
    """The upstream answered a 4xx that is the client's fault (status passed through)."""

    type = "invalid_request_error"
    code = "upstream_rejected"

    def __init__(self, status: int, message: str, *, param: str | None = None) -> None:
        super().__init__(message, param=param)
        self.status = status
