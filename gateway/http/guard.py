"""Checks on every HTTP request before any route runs, from its headers alone.

:class:`Door` refuses what costs the most when it floods in: a request without a valid
key, and one of a tenant whose limit this process already knows is spent. Then what a
web page in the operator's browser must not be able to do to a gateway on loopback:

- A ``POST`` must say ``Content-Type: application/json`` (415 otherwise): a page may send
  ``text/plain`` or form bodies cross-origin without a CORS preflight, never JSON.
- With auth off, only loopback ``Host`` values are served (403 otherwise): a page on a
  DNS-rebound name reaches the gateway's address but still sends its own name as Host.
"""

from __future__ import annotations

import ipaddress
import math
import time
from collections.abc import Callable

from starlette.types import Scope

from gateway.auth import Authenticator
from gateway.errors import AuthenticationFailed, GatewayError, RateLimited
from gateway.http.asgi import header
from gateway.limit_windows import ClientWindows
from gateway.limits import RateLimiter

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


def client_address(scope: Scope) -> str:
    """The address a request's limits without a key are counted under: the client's IPv4
    address, or its IPv6 /64 (one host is commonly given a whole /64)."""
    client = scope.get("client")
    if not client:
        return ""
    host: str = client[0]
    if ":" not in host:
        return host
    try:
        address = ipaddress.IPv6Address(host)
    except ValueError:
        return host
    if address.ipv4_mapped is not None:
        return str(address.ipv4_mapped)
    return str(ipaddress.IPv6Network((address, 64), strict=False).network_address)


class _Rendered(GatewayError):
    """An error whose JSON body is rendered once: the door gives the same few answers to
    every refused request."""

    def __init__(self, error: GatewayError) -> None:
        super().__init__(error.message, param=error.param, code=error.code, headers=error.headers)
        self.status, self.type = error.status, error.type
        self._body = error.body()

    def body(self) -> bytes:
        return self._body


class Door:
    """Refusals the headers decide, answered before any route runs (no body read, no JSON
    parsed, no log line, no Redis call): a request without a valid key is a 401, or a 429
    with ``Retry-After`` once its client address sent ``per_minute`` of them in a minute;
    a tenant whose limits this process already knows are spent gets its 429. These 429s
    go to clients already past a limit: :class:`gateway.http.tarpit.Tarpit` holds them."""

    def __init__(
        self,
        auth: Authenticator,
        limiter: RateLimiter,
        *,
        exempt: frozenset[str],
        per_minute: int,
        count: Callable[[int], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._auth = auth
        self._count = count
        self._limiter = limiter
        self._exempt = exempt
        self._per_minute = per_minute
        self._clients = ClientWindows(clock)
        self._answers: dict[str, _Rendered] = {}  # message -> its answer, rendered

    def check(self, scope: Scope) -> GatewayError | None:
        """The error to answer instead of serving this request, or None; each refusal is
        counted by its status (``count``), never logged."""
        refusal = self._refusal(scope)
        if refusal is not None:
            self._count(refusal.status)
        return refusal

    def _refusal(self, scope: Scope) -> GatewayError | None:
        if scope["path"] in self._exempt:
            return None
        try:
            tenant = self._auth.tenant(scope)
        except AuthenticationFailed as failed:
            error: GatewayError = failed
            wait = self._clients.count(client_address(scope), self._per_minute)
            if wait is not None:
                retry = str(max(1, math.ceil(wait)))
                error = RateLimited(
                    "too many requests without a valid key from this address; "
                    f"retry after {retry} s",
                    headers={"retry-after": retry},
                )
            answer = self._answers.get(error.message)
            if answer is None:  # a few messages: missing or invalid key, 429 per second left
                answer = self._answers[error.message] = _Rendered(error)
            return answer
        return self._limiter.known_refusal(tenant)
