"""What each endpoint kind accepts, as data: the request policy reads it.

Each row follows the provider's own documentation as cited, with its date, in
``gateway/records/documented.toml`` (the documented-speculation table of the records).
``prediction_models`` lists the model name prefixes that accept ``prediction``; ``None``
means every model the endpoint serves (the provider drops or refuses it per model).
The same facts in prose: docs/providers.md.
"""

from __future__ import annotations

from dataclasses import dataclass

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
    """What one endpoint kind accepts."""

    accepts_prediction: bool
    conflicts: frozenset[str] = frozenset()
    prediction_models: tuple[str, ...] | None = None
    min_api_version: str | None = None
    # front-door APIs (``gateway.call.Api``) the kind speaks itself besides chat/completions:
    # a request arriving through one is relayed as the client sent it
    native_apis: frozenset[str] = frozenset()


CAPABILITIES: dict[str, Capability] = {
    "openai": Capability(
        True, OPENAI_CONFLICTS, ("gpt-4o", "gpt-4.1"), native_apis=frozenset({"responses"})
    ),
    # preview; the same conflicts as OpenAI (checked 2026-11-30)
    "azure": Capability(
        True,
        OPENAI_CONFLICTS,
        ("gpt-4o", "gpt-4.1"),
        "2025-01-01-preview",
        native_apis=frozenset({"responses"}),
    ),
    # no predicted outputs; Messages is its own API
    "anthropic": Capability(False, native_apis=frozenset({"messages"})),
    "fireworks": Capability(True, OPENAI_CONFLICTS),
    # public preview, gpt-oss-120b and zai-glm-4.7 (checked 2026-11-30)
    "cerebras": Capability(True, OPENAI_CONFLICTS, ("gpt-oss-120b", "zai-glm-4.7")),
    "mistral": Capability(True, OPENAI_CONFLICTS, ("codestral", "mistral-large")),
    "vllm": Capability(False),
    "sglang": Capability(False),
    "trtllm": Capability(False),
    "llamacpp": Capability(False),
    "openai_compatible": Capability(False),
    # passed on; whether the provider OpenRouter picks honours it is listed per endpoint
    # in its `supported_parameters` (GET /models/{author}/{slug}/endpoints; checked 2026-11-30)
    "openrouter": Capability(True, OPENAI_CONFLICTS),
    # a local endpoint (in-process or a `draftgate verifier` server) takes everything
    "local": Capability(True),
}

# Base URLs used when a hosted endpoint's config leaves `base_url` out.
DEFAULT_BASE_URLS: dict[str, str] = {
    "openai": "https://api.openai.com/v1",
    "anthropic": "https://api.anthropic.com/v1",
    "fireworks": "https://api.fireworks.ai/inference/v1",
    "cerebras": "https://api.cerebras.ai/v1",
    "mistral": "https://api.mistral.ai/v1",
    "openrouter": "https://openrouter.ai/api/v1",
}
