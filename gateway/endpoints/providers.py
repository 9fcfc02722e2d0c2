"""Provider adapters: request URL and credential headers for each endpoint kind.

Credentials come only from the gateway's environment (``api_key_env``).
"""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import quote

from gateway.config import ConfigError, EndpointConfig


class MissingCredential(ConfigError):
    """``api_key_env`` names a variable that is not set."""


class Adapter:
    """OpenAI-style provider: ``{base_url}/{path}`` and ``Authorization: Bearer``."""

    def __init__(self, config: EndpointConfig, environ: Mapping[str, str]) -> None:
        self.config = config
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
        """The URL for an OpenAI path such as ``chat/completions``."""
        return f"{self.base_url}/{path}"

    def auth_headers(self) -> list[tuple[bytes, bytes]]:
        if self.api_key is None:
            return []
        return [(b"authorization", f"Bearer {self.api_key}".encode())]


class AzureAdapter(Adapter):
    """Azure OpenAI: deployment in the URL, ``api-version`` query, ``api-key`` header."""

    def url(self, path: str, upstream_model: str) -> str:
        deployment = quote(self.config.deployment or upstream_model, safe="")
        version = quote(self.config.api_version or "", safe="")
        return f"{self.base_url}/openai/deployments/{deployment}/{path}?api-version={version}"

    def auth_headers(self) -> list[tuple[bytes, bytes]]:
        if self.api_key is None:
            return []
        return [(b"api-key", self.api_key.encode())]


class AnthropicAdapter(Adapter):
    """Anthropic: ``{base_url}/{path}``, ``x-api-key`` and the ``anthropic-version`` header."""

    VERSION = b"2023-06-01"

    def auth_headers(self) -> list[tuple[bytes, bytes]]:
        headers = [(b"anthropic-version", self.VERSION)]
        if self.api_key is not None:
            headers.append((b"x-api-key", self.api_key.encode()))
        return headers


def adapter_for(config: EndpointConfig, environ: Mapping[str, str]) -> Adapter:
    """The adapter for an endpoint's kind."""
    if config.kind == "azure":
        return AzureAdapter(config, environ)
    if config.kind == "anthropic":
        return AnthropicAdapter(config, environ)
    return Adapter(config, environ)
