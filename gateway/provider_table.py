"""What each endpoint kind is, as one table: :data:`PROVIDERS`, kind -> :class:`Provider`.

Configuration reads it (the kinds, default base URLs, the fields a kind needs, which
kinds can verify remotely, which are hosted), the prediction policy reads a row's
:class:`Capability`, the HTTP relay its adapter facts (URL, credential headers, the
front-door APIs it speaks itself) and the records whether a kind is an engine to probe.
The capability rows follow the providers' own documentation as cited, with dates, in
``gateway/records/documented.toml`` (the documented-speculation record of each kind, in
prose in docs/providers.md).

Adding a provider is one row here; a provider whose wire differs from OpenAI's beyond
URL and headers also needs one module in ``gateway/endpoints/hosted/`` (CONTRIBUTING.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol
from urllib.parse import quote

# Features OpenAI rejects together with `prediction` (names as used in dropped:<reason>).
OPENAI_CONFLICTS = frozenset(
    {
        "tools",
        "n",
        "logprobs",
        "presence_penalty",
        "frequency_penalty",
        "max_completion_tokens",
        "audio",
        "modalities",
    }
)


@dataclass(frozen=True)
class Capability:
    """Which request fields a kind accepts: whether ``prediction`` is passed on, the
    features it refuses alongside one, the model-name prefixes that take it (``None``:
    every model the endpoint serves; the provider drops or refuses it per model) and the
    lowest API version that does."""

    accepts_prediction: bool
    conflicts: frozenset[str] = frozenset()
    prediction_models: tuple[str, ...] | None = None
    min_api_version: str | None = None


class UrlTarget(Protocol):
    """What a URL needs of an endpoint's configuration (``gateway.config.EndpointConfig``)."""

    @property
    def deployment(self) -> str | None: ...
    @property
    def api_version(self) -> str | None: ...


def base_path_url(base_url: str, path: str, upstream_model: str, config: UrlTarget) -> str:
    """``{base_url}/{path}``: OpenAI and every provider that follows it."""
    return f"{base_url}/{path}"


def azure_url(base_url: str, path: str, upstream_model: str, config: UrlTarget) -> str:
    """Azure OpenAI: the deployment in the path, the ``api-version`` query. The Responses API
    is not under a deployment: ``/openai/responses``, the deployment named by the body's
    ``model`` (the endpoint's upstream model name)."""
    version = quote(config.api_version or "", safe="")
    if path == "responses" or path.startswith("responses/"):
        return f"{base_url}/openai/{path}?api-version={version}"
    deployment = quote(config.deployment or upstream_model, safe="")
    return f"{base_url}/openai/deployments/{deployment}/{path}?api-version={version}"


class UrlBuilder(Protocol):
    def __call__(self, base_url: str, path: str, upstream_model: str, config: UrlTarget) -> str: ...


@dataclass(frozen=True)
class Provider:
    """One endpoint kind."""

    capability: Capability
    hosted: bool = False  # run by a provider: not health-checked unless asked
    engine: bool = False  # a self-hosted engine whose metrics and server info are probed
    verify: bool = False  # its own API scores given tokens (``verify = "remote"``)
    in_process: bool = False  # may run inside the gateway (no ``base_url``)
    base_url: str | None = None  # used when an endpoint's config leaves ``base_url`` out
    needs: tuple[str, ...] = ()  # configuration fields an endpoint of this kind must set
    # front-door APIs (``gateway.call.Api``) spoken besides chat/completions: a request
    # arriving through one is relayed as the client sent it
    native_apis: frozenset[str] = frozenset()
    counts_tokens: bool = False  # its API counts a Messages request's tokens (count_tokens)
    url: UrlBuilder = base_path_url
    key_header: bytes = b"authorization"  # the header carrying ``api_key_env``'s key
    key_prefix: bytes = b"Bearer "
    headers: tuple[tuple[bytes, bytes], ...] = ()  # sent on every request


_OPENAI_STYLE = Capability(True, OPENAI_CONFLICTS)
_ENGINE = Capability(False)

PROVIDERS: dict[str, Provider] = {
    "openai": Provider(
        Capability(True, OPENAI_CONFLICTS, ("gpt-4o", "gpt-4.1")),
        hosted=True,
        base_url="https://api.openai.com/v1",
        native_apis=frozenset({"responses"}),
    ),
    # preview; the same conflicts as OpenAI (checked 2026-11-30)
    "azure": Provider(
        Capability(True, OPENAI_CONFLICTS, ("gpt-4o", "gpt-4.1"), "2025-01-01-preview"),
        hosted=True,
        needs=("api_version",),
        native_apis=frozenset({"responses"}),
        url=azure_url,
        key_header=b"api-key",
        key_prefix=b"",
    ),
    # no predicted outputs; Messages is its own API
    "anthropic": Provider(
        Capability(False),
        hosted=True,
        base_url="https://api.anthropic.com/v1",
        native_apis=frozenset({"messages"}),
        counts_tokens=True,
        key_header=b"x-api-key",
        key_prefix=b"",
        headers=((b"anthropic-version", b"2023-06-01"),),
    ),
    "fireworks": Provider(
        _OPENAI_STYLE, hosted=True, base_url="https://api.fireworks.ai/inference/v1"
    ),
    # public preview, gpt-oss-120b and zai-glm-4.7 (checked 2026-11-30)
    "cerebras": Provider(
        Capability(True, OPENAI_CONFLICTS, ("gpt-oss-120b", "zai-glm-4.7")),
        hosted=True,
        base_url="https://api.cerebras.ai/v1",
    ),
    "mistral": Provider(
        Capability(True, OPENAI_CONFLICTS, ("codestral", "mistral-large")),
        hosted=True,
        base_url="https://api.mistral.ai/v1",
    ),
    # passed on; whether the provider OpenRouter picks honours it is listed per endpoint
    # in its `supported_parameters` (GET /models/{author}/{slug}/endpoints; checked 2026-11-30)
    "openrouter": Provider(_OPENAI_STYLE, hosted=True, base_url="https://openrouter.ai/api/v1"),
    "vllm": Provider(_ENGINE, engine=True, verify=True),
    "sglang": Provider(_ENGINE, engine=True, verify=True),
    "trtllm": Provider(_ENGINE, engine=True),
    "llamacpp": Provider(_ENGINE, engine=True),
    "openai_compatible": Provider(_ENGINE),
    # in process, or a `draftgate verifier` server: takes everything
    "local": Provider(Capability(True), in_process=True),
}
