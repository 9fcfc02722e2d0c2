"""An ``sglang`` or ``vllm`` endpoint with ``verify = "remote"``: remote verification
(:mod:`gateway.endpoints.remote`) answers what it can; every other request goes to the
endpoint's HTTP relay (:mod:`gateway.endpoints.hosted`), its answer saying why in
``X-Draftgate-Remote-Verify: passthrough:<reason>``; so do token counts. Both salt the
engine's prefix cache with the same per-tenant salt."""

from __future__ import annotations

from typing import Any

from starlette.types import Send

from gateway.call import Call
from gateway.endpoints.endpoint import CountCall, Relayed, Served
from gateway.endpoints.hosted.endpoint import HostedEndpoint
from gateway.endpoints.remote.endpoint import REMOTE_VERIFY_HEADER, RemoteEndpoint


class VerifyingEndpoint:
    """Remote verification in front of the endpoint's relay."""

    def __init__(self, remote: RemoteEndpoint, relay: HostedEndpoint, on_self_test: Any) -> None:
        """``on_self_test(endpoint_name, SelfTest)`` is awaited after each self-test."""
        self.remote = remote
        self.relay = relay
        # one salt per tenant: its relayed and its verified requests share its cache
        relay.salts = remote.salts
        self.config = relay.config
        self._on_self_test = on_self_test

    def start(self) -> None:
        self.remote.start(self._on_self_test)

    def capabilities(self) -> dict[str, Any]:
        return {}

    async def serve(self, call: Call, send: Send) -> Served | None:
        passthrough = await self.remote.serve(call, send)
        if passthrough is None:
            return None
        header = (REMOTE_VERIFY_HEADER, b"passthrough:" + passthrough.encode())
        return await self.relay.serve(call, send, (header,))

    async def count_tokens(self, call: CountCall) -> int | Relayed:
        return await self.relay.count_tokens(call)

    async def aclose(self) -> None:
        await self.relay.aclose()
        await self.remote.aclose()
