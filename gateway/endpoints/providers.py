"""Provider adapters: an endpoint's request URL and credential headers, from its kind's
row of the provider table (:mod:`gateway.provider_table`).

Credentials come only from the gateway's environment (``api_key_env``).
"""

from __future__ import annotations

from collections.abc import Mapping

from gateway.config import ConfigError, EndpointConfig
from gateway.provider_table import PROVIDERS


class MissingCredential(ConfigError):
    """``api_key_env`` names a variable that is not set."""


class Adapter:
    """The URL of an API path and the headers every request carries, for one endpoint."""

    def __init__(self, config: EndpointConfig, environ: Mapping[str, str]) -> None:
        self.config = config
        self.provider = PROVIDERS[config.kind]
        self.base_url = (config.base_url or "").rstrip("/")
        self.api_key: str | None = None
        if config.api_key_env:
            self.api_key = environ.get(config.api_key_env)
            if not self.api_key:
                raise MissingCredential(
                    f"endpoint {config.name!r}: environment variable "
                    f"{config.api_key_env} (api_key_env) is not set"
                )

    def url(self, path: str, upstream_model: str) -> str:
        """The URL for an API path such as ``chat/completions``."""
        return self.provider.url(self.base_url, path, upstream_model, self.config)

    def auth_headers(self) -> list[tuple[bytes, bytes]]:
        """The kind's fixed headers and the key (none without ``api_key_env``)."""
        headers = list(self.provider.headers)
        if self.api_key is not None:
            provider = self.provider
            headers.append((provider.key_header, provider.key_prefix + self.api_key.encode()))
        return headers


def adapter_for(config: EndpointConfig, environ: Mapping[str, str]) -> Adapter:
    """The adapter for an endpoint."""
    return Adapter(config, environ)
