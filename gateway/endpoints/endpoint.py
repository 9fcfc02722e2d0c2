"""The Endpoint protocol: what a route hands a request to, whatever serves it.

Every configured endpoint is one object in ``Runtime.endpoints``: a hosted or
self-hosted HTTP upstream (:mod:`gateway.endpoints.hosted`), one verified remotely with
its relay behind it (:class:`gateway.endpoints.hosted.verified.VerifyingEndpoint`), or
the in-process engine (:mod:`gateway.endpoints.local`). The route tries a model's
endpoints in the balancer's order; one that cannot answer and sent nothing raises
:class:`Unavailable` and the next is tried. What each kind is (hosted, its capability,
its URL and headers) is its row of :mod:`gateway.provider_table`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from starlette.types import Send

from gateway.call import Call
from gateway.config import EndpointConfig
from gateway.errors import GatewayError


@dataclass(frozen=True)
class Served:
    """What an answer says of its endpoint's health: ``healthy`` with the seconds it took
    (the balancer's latency sample), or not (it failed after its first byte)."""

    healthy: bool
    latency_s: float = 0.0


class Unavailable(Exception):
    """The endpoint could not answer and sent nothing: the route tries the next one and
    answers ``error`` when none is left. ``endpoint_fault``: the endpoint is unwell
    (unreachable, timed out, 5xx), which counts against its health."""

    def __init__(self, error: GatewayError, *, endpoint_fault: bool = False) -> None:
        super().__init__(error.message)
        self.error = error
        self.endpoint_fault = endpoint_fault


class Endpoint(Protocol):
    """One configured endpoint."""

    @property
    def config(self) -> EndpointConfig: ...

    def start(self) -> None:
        """Begin what runs in the background (a model load, a self-test); returns at once."""
        ...

    async def serve(self, call: Call, send: Send) -> Served | None:
        """Answer ``call`` through ``send`` (errors included), or raise
        :class:`Unavailable` before the first byte. ``None``: the answer says nothing of
        the endpoint's health."""
        ...

    def capabilities(self) -> dict[str, Any]:
        """What its models honour, for their ``/v1/models`` entries (empty: nothing said)."""
        ...

    async def aclose(self) -> None: ...
