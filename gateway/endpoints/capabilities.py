"""What endpoints accept: each kind's :class:`~gateway.provider_table.Capability` (whether
it takes a ``prediction``, with what), a view of the provider table
(:mod:`gateway.provider_table`), and what a model honours, for ``/v1/models``. The same
facts in prose: docs/providers.md."""

from __future__ import annotations

from typing import Any

from gateway.config import EndpointConfig
from gateway.endpoints.local.request import capabilities as local_capabilities
from gateway.provider_table import PROVIDERS, Capability

CAPABILITIES: dict[str, Capability] = {kind: p.capability for kind, p in PROVIDERS.items()}


def model_extras(config: EndpointConfig) -> dict[str, Any]:
    """The ``draftgate`` object of an endpoint's ``/v1/models`` entries: for a local
    endpoint (in process or a ``draftgate verifier`` server) what its model honours and
    its answer length bounds; nothing for other kinds."""
    if not PROVIDERS[config.kind].in_process:
        return {}
    return local_capabilities() | {
        "max_tokens_default": config.answer_tokens(None),
        "max_tokens_cap": config.max_tokens_cap,
    }
