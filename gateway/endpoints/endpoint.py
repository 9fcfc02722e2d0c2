"""The Endpoint protocol: what a route hands a request to, whatever serves it.

Every configured endpoint is one object in ``Runtime.endpoints``: a hosted or
self-hosted HTTP upstream (:mod:`gateway.endpoints.hosted`), one verified remotely with
its relay behind it (:class:`gateway.endpoints.hosted.verified.VerifyingEndpoint`), or
the in-process engine (:mod:`gateway.endpoints.local`). The route tries a model's
endpoints in the balancer's order; one that cannot answer and sent nothing raises
:class:`Unavailable` and the next is tried. ``POST /v1/messages/count_tokens`` asks the
model's first endpoint (:meth:`Endpoint.count_tokens`). What each kind is (hosted, its
capability, its URL and headers) is its row of :mod:`gateway.provider_table`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Protocol

import orjson
from starlette.types import Send

from gateway.call import Call
from gateway.config import EndpointConfig
from gateway.errors import GatewayError
from gateway.limits import prompt_tokens
from sdk.wire import ChatCompletionRequest


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


@dataclass(frozen=True)
class CountCall:
    """A request to count a Messages request's prompt tokens: the body as the client sent
    it, its JSON, and the internal request it becomes (translated when first read)."""

    raw: bytes
    data: dict[str, Any]
    translate: Callable[[], dict[str, Any]]  # the internal request's JSON

    @cached_property
    def internal(self) -> dict[str, Any]:
        return self.translate()

    @property
    def request(self) -> ChatCompletionRequest:
        return ChatCompletionRequest.model_validate(self.internal)

    @property
    def estimate(self) -> int:
        """The gateway's estimate of the prompt's tokens: its messages' and tools' JSON
        bytes over four (what the rate limits count)."""
        shown = {"messages": self.internal["messages"], "tools": self.internal.get("tools")}
        return prompt_tokens(len(orjson.dumps(shown)))


@dataclass(frozen=True)
class Relayed:
    """A provider's own answer, passed on as it came."""

    status: int
    body: bytes


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

    async def count_tokens(self, call: CountCall) -> int | Relayed:
        """The prompt tokens ``call`` would have: counted with the model's own tokenizer,
        its provider's answer, or ``call.estimate`` where it has neither."""
        ...

    def capabilities(self) -> dict[str, Any]:
        """What its models honour, for their ``/v1/models`` entries (empty: nothing said)."""
        ...

    async def aclose(self) -> None: ...
