"""Gateway API keys -> tenants (the document namespace of a request)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping

from starlette.types import Scope

from gateway.config import ConfigError, Settings
from gateway.errors import AuthenticationFailed, PermissionDenied
from gateway.http.asgi import header

DEFAULT_TENANT = "default"


class MissingKey(ConfigError):
    """A configured ``key_env`` variable is not set."""


class DuplicateKey(ConfigError):
    """Two ``key_env`` variables hold the same key (one tenant would get the other's)."""


def _digest(key: bytes) -> bytes:
    return hashlib.sha256(key).digest()


def _key_digest(scope: Scope) -> bytes | None:
    """The digest of the request's key: ``Authorization: Bearer <key>`` (OpenAI clients)
    or, without an ``Authorization`` header, ``x-api-key: <key>`` (Anthropic clients);
    None for another scheme or no key."""
    authorization = header(scope, b"authorization")
    if authorization is None:
        key = header(scope, b"x-api-key")
        return None if key is None else _digest(key.strip())
    scheme, _, key = authorization.partition(b" ")
    return _digest(key.strip()) if scheme.lower() == b"bearer" else None


class Authenticator:
    """Maps a request's key (``Authorization: Bearer <key>`` or ``x-api-key: <key>``) to a
    tenant; no keys -> one tenant, no check.

    ``admins`` are the keys that may run audits and probes (with no keys, everyone may:
    the single-tenant gateway binds loopback only unless told otherwise)."""

    def __init__(self, keys: Mapping[str, str] | None, admins: Iterable[str] = ()) -> None:
        # keys are held as digests: lookups do not compare secrets byte by byte
        self._tenants = {_digest(k.encode()): t for k, t in (keys or {}).items()}
        self._admins = {_digest(k.encode()) for k in admins}
        self.enabled = bool(self._tenants)

    @classmethod
    def from_settings(cls, settings: Settings, environ: Mapping[str, str]) -> Authenticator:
        if not settings.auth:
            return cls(None)
        keys: dict[str, str] = {}
        admins: list[str] = []
        key_envs: dict[str, str] = {}
        for entry in settings.keys:
            value = environ.get(entry.key_env)
            if not value:
                raise MissingKey(
                    f"keys: environment variable {entry.key_env} (tenant {entry.tenant!r}) is not set"
                )
            if value in keys:
                raise DuplicateKey(
                    f"keys: {key_envs[value]} and {entry.key_env} hold the same key; "
                    "every tenant needs a key of its own"
                )
            keys[value] = entry.tenant
            key_envs[value] = entry.key_env
            if entry.admin:
                admins.append(value)
        return cls(keys, admins)

    def tenant(self, scope: Scope) -> str:
        """The tenant of a request, from its key."""
        if not self.enabled:
            return DEFAULT_TENANT
        if header(scope, b"authorization") is None and header(scope, b"x-api-key") is None:
            raise AuthenticationFailed(
                "missing Authorization header (Bearer <gateway key>) or x-api-key header"
            )
        digest = _key_digest(scope)
        tenant = self._tenants.get(digest) if digest is not None else None
        if tenant is None:
            raise AuthenticationFailed("invalid gateway API key")
        return tenant

    def admin(self, scope: Scope) -> str:
        """The tenant of a request made with an admin key; :class:`PermissionDenied` for
        any other valid key."""
        tenant = self.tenant(scope)
        if self.enabled and _key_digest(scope) not in self._admins:
            raise PermissionDenied("this needs an admin key ([[keys]] admin = true)")
        return tenant
