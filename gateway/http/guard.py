"""Checks on every HTTP request before any route runs: what a web page in the operator's
browser must not be able to do to a gateway on loopback.

- A ``POST`` must say ``Content-Type: application/json`` (415 otherwise): a page may send
  ``text/plain`` or form bodies cross-origin without a CORS preflight, never JSON.
- With auth off, only loopback ``Host`` values are served (403 otherwise): a page on a
  DNS-rebound name reaches the gateway's address but still sends its own name as Host.
"""

from __future__ import annotations

import ipaddress

from starlette.types import Scope

from gateway.errors import GatewayError
from gateway.http.asgi import header

_LOOPBACK_NAMES = frozenset({"localhost", "localhost."})


class UnsupportedMediaType(GatewayError):
    """415: a POST body that is not declared as JSON."""

    status = 415
    type = "invalid_request_error"
    code = "unsupported_media_type"


class HostNotAllowed(GatewayError):
    """403: a Host header that does not name this machine while no keys are checked."""

    status = 403
    type = "invalid_request_error"
    code = "host_not_allowed"


def is_json(content_type: bytes | None) -> bool:
    """Whether a Content-Type value is ``application/json`` (parameters allowed)."""
    if content_type is None:
        return False
    return content_type.split(b";", 1)[0].strip().lower() == b"application/json"


def is_loopback_host(value: bytes | None) -> bool:
    """Whether a Host value names a loopback address or ``localhost``, with any port."""
    if not value:
        return False
    try:
        host = value.decode("ascii").strip().lower()
    except UnicodeDecodeError:
        return False
    if host.startswith("["):  # [::1] or [::1]:8000
        end = host.find("]")
        if end < 0 or (host[end + 1 :] and not host[end + 1 :].startswith(":")):
            return False
        host = host[1:end]
    elif host.count(":") == 1:
        host = host.partition(":")[0]
    if host in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check(scope: Scope, *, loopback_only: bool) -> GatewayError | None:
    """The error to answer instead of serving this request, or None."""
    if loopback_only and not is_loopback_host(header(scope, b"host")):
        return HostNotAllowed(
            "this gateway has no keys and serves only loopback Host names "
            "(localhost, 127.0.0.1, [::1]); configure [[keys]] to serve other names"
        )
    if scope["method"] == "POST" and not is_json(header(scope, b"content-type")):
        return UnsupportedMediaType("POST bodies must be sent with Content-Type: application/json")
    return None
