"""Per-tenant salts for an engine's prefix cache: a tenant's requests hit only its own
cached prefixes, so no tenant can time or count another's prompts through the cache.
Remote verification and the HTTP relay of vLLM and SGLang endpoints send them."""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets


class CacheSalts:
    """HMAC-SHA256 of the tenant under a key drawn at start (no tenant can compute
    another's salt, nor guess it from its name), as 43 base64url characters: the 256 bits
    vLLM's ``cache_salt`` documentation asks for, with none of the characters it refuses
    (``@``, ``/``, ``\\``, NUL)."""

    def __init__(self, key: bytes | None = None) -> None:
        self._key = key if key is not None else secrets.token_bytes(32)

    def __call__(self, tenant: str) -> str:
        digest = hmac.new(self._key, tenant.encode(), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()
