"""Who is looking at the dashboard: a browser signs in once with its gateway key and then
carries a session token in an HttpOnly, SameSite=Strict cookie (the key never leaves the
sign-in request); API clients may send their key as for the API.

Sessions live in this process (their tokens are held as digests) and end after
``SESSION_S`` or on sign-out. With no keys configured everyone is the admin of the one
tenant: the gateway then serves loopback Host names only."""

from __future__ import annotations

import hashlib
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

from starlette.requests import Request
from starlette.types import Scope

from gateway.auth import DEFAULT_TENANT, Authenticator
from gateway.errors import PermissionDenied

COOKIE = "draftgate_ui"
SESSION_S = 8 * 3600.0
MAX_SESSIONS = 10_000


@dataclass(frozen=True)
class Viewer:
    """A signed-in tenant; ``admin`` sees every tenant and the traffic."""

    tenant: str
    admin: bool

    def may_see(self, tenant: str) -> bool:
        return self.admin or tenant == self.tenant


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


class Sessions:
    """Sign-in sessions of one gateway process."""

    def __init__(self, auth: Authenticator, clock: Callable[[], float] = time.monotonic) -> None:
        self._auth = auth
        self._clock = clock
        self._live: dict[bytes, tuple[Viewer, float]] = {}  # token digest -> viewer, ends at

    @property
    def needed(self) -> bool:
        """Whether a browser must sign in (keys are configured)."""
        return self._auth.enabled

    def _check(self, scope: Scope) -> Viewer:
        """The viewer of a request's key headers (:class:`AuthenticationFailed` if invalid)."""
        tenant = self._auth.tenant(scope)
        try:
            self._auth.admin(scope)
        except PermissionDenied:
            return Viewer(tenant, admin=False)
        return Viewer(tenant, admin=True)

    def key_viewer(self, key: str) -> Viewer:
        """The viewer a gateway key signs in as (:class:`AuthenticationFailed`)."""
        scope: Scope = {"type": "http", "headers": [(b"authorization", b"Bearer " + key.encode())]}
        return self._check(scope)

    def sign_in(self, key: str) -> tuple[str, Viewer]:
        """A new session token for a valid gateway key (:class:`AuthenticationFailed`)."""
        viewer = self.key_viewer(key)
        now = self._clock()
        if len(self._live) >= MAX_SESSIONS:  # drop the ended ones, then the oldest
            self._live = {d: v for d, v in self._live.items() if v[1] > now}
            while len(self._live) >= MAX_SESSIONS:
                del self._live[next(iter(self._live))]
        token = secrets.token_urlsafe(32)
        self._live[_digest(token)] = (viewer, now + SESSION_S)
        return token, viewer

    def sign_out(self, token: str | None) -> None:
        if token:
            self._live.pop(_digest(token), None)

    def viewer(self, request: Request) -> Viewer | None:
        """The request's viewer: from its key headers, else its session cookie; None when
        it has neither (or its session ended). An invalid key is :class:`AuthenticationFailed`."""
        if not self._auth.enabled:
            return Viewer(DEFAULT_TENANT, admin=True)
        if "authorization" in request.headers or "x-api-key" in request.headers:
            return self._check(request.scope)
        token = request.cookies.get(COOKIE)
        if not token:
            return None
        found = self._live.get(_digest(token))
        if found is None:
            return None
        viewer, ends = found
        if ends <= self._clock():
            del self._live[_digest(token)]
            return None
        return viewer


def same_origin(request: Request) -> bool:
    """Whether a state-changing request comes from a page of this gateway: its ``Origin``
    (else ``Referer``) names the host the request was sent to. Browsers send one of them
    on every cross-site POST; a request with neither is refused."""
    source = request.headers.get("origin") or request.headers.get("referer")
    host = request.headers.get("host")
    if not source or not host or source == "null":
        return False
    return urlsplit(source).netloc.lower() == host.lower()
