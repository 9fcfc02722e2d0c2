"""An upstream's error body is read no further than its cap: an endless one costs 64 KiB."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from gateway.config import EndpointConfig
from gateway.endpoints.hosted.upstream import ERROR_BODY_BYTES, Upstream, UpstreamFailure

CHUNK = 8192


async def test_endless_error_body_is_cut_at_the_cap() -> None:
    sent = 0

    async def endless() -> AsyncIterator[bytes]:
        nonlocal sent
        while True:
            sent += CHUNK
            yield b'{"error": {"message": "' + b"x" * (CHUNK - 24) + b'"}}'

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(400, content=endless())

    config = EndpointConfig(
        name="up", kind="openai_compatible", base_url="http://upstream.test/v1", models=["m"]
    )
    upstream = Upstream(config, {}, transport=httpx.MockTransport(handler))
    with pytest.raises(UpstreamFailure) as failure:
        await upstream.open("chat/completions", b'{"model": "m"}', "m")
    assert sent <= ERROR_BODY_BYTES + CHUNK
    assert failure.value.status == 400
    assert str(failure.value) == "upstream answered HTTP 400"


async def test_short_error_message_is_passed_on() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(400, json={"error": {"message": "bad temperature"}})

    config = EndpointConfig(
        name="up", kind="openai_compatible", base_url="http://upstream.test/v1", models=["m"]
    )
    upstream = Upstream(config, {}, transport=httpx.MockTransport(handler))
    with pytest.raises(UpstreamFailure) as failure:
        await upstream.open("chat/completions", b'{"model": "m"}', "m")
    assert str(failure.value) == "bad temperature"
