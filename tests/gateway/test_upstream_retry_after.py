"""An upstream's ``Retry-After`` is read by the SDK's one parser: any value gives a bounded wait."""

from __future__ import annotations

import math

import httpx
import pytest

from gateway.config import EndpointConfig
from gateway.endpoints.hosted.upstream import RETRY_AFTER_LIMIT_S, Upstream, UpstreamFailure
from gateway.errors import RateLimited


@pytest.mark.parametrize(
    ("value", "kept"),
    [("inf", RETRY_AFTER_LIMIT_S), ("1e999", RETRY_AFTER_LIMIT_S), ("nan", None), ("-4", 0.0)],
)
async def test_any_retry_after_is_retried_then_reported_finite(
    value: str, kept: float | None
) -> None:
    tries: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        tries.append(request)
        return httpx.Response(
            429, headers={"retry-after": value}, json={"error": {"message": "slow down"}}
        )

    config = EndpointConfig(
        name="up",
        kind="openai_compatible",
        base_url="http://upstream.test/v1",
        models=["m"],
        retries=2,
        backoff_s=0.001,
        retry_after_cap_s=0.01,
    )
    upstream = Upstream(config, {}, transport=httpx.MockTransport(handler))
    with pytest.raises(UpstreamFailure) as failure:
        await upstream.open("chat/completions", b'{"model": "m"}', "m")
    assert len(tries) == 3  # the waits were capped, not infinite or an error
    assert failure.value.retry_after == kept
    error = failure.value.to_error("up")
    assert isinstance(error, RateLimited)
    header = error.headers.get("retry-after")
    assert (header is None) if kept is None else math.isfinite(float(header))
