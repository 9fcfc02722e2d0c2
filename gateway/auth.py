"""Gateway API keys -> tenants (the document namespace of a request)."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

from starlette.types import Scope

from gateway.config import ConfigError, Settings
from gateway.errors import AuthenticationFailed
from gateway.http.asgi import header

DEFAULT_TENANT = "default"


class MissingKey(ConfigError):
    """A configured ``key_env`` variable is not set."""


class DuplicateKey(ConfigError):
    """Two ``key_env`` variables hold the same key (one tenant would get the other's)."""


def _digest(key: bytes) -> bytes:
    return hashlib.sha256(key).digest()


class Authenticator:
    """Maps ``Authorization: Bearer <key>`` to a tenant; no keys -> one tenant, no check."""

    def __init__(self, keys: Mapping[str, str] | None) -> None:
        # keys are held as digests: lookups do not compare secrets byte by byte
        self._tenants = {_digest(k.encode()): t for k, t in (keys or {}).items()}
        self.enabled = bool(self._tenants)

    @classmethod
    def from_settings(cls, settings: Settings, environ: Mapping[str, str]) -> Authenticator:
        if not settings.auth:
            return cls(None)
        keys: dict[str, str] = {}
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
        return cls(keys)

    def tenant(self, scope: Scope) -> str:
        """The tenant of a request, from its ``Authorization`` header."""
        if not self.enabled:
            return DEFAULT_TENANT
        authorization = header(scope, b"authorization")
        if authorization is None:
            raise AuthenticationFailed("missing Authorization header (Bearer <gateway key>)")
        scheme, _, key = authorization.partition(b" ")
        tenant = self._tenants.get(_digest(key.strip())) if scheme.lower() == b"bearer" else None
        if tenant is None:
            raise AuthenticationFailed("invalid gateway API key")
        return tenant
