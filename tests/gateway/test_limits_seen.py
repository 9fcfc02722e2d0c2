"""What Redis last answered decides some refusals without another round trip: a tenant
found with all its requests in flight is refused here for a moment."""

from __future__ import annotations

import pytest

from gateway.errors import RateLimited
from gateway.limit_windows import FULL_HOLD_S
from tests.gateway.test_limits_breaker import Clock, _limiter


@pytest.mark.redis
async def test_a_tenant_at_its_in_flight_limit_is_refused_without_asking_redis(
    redis_url: str, redis_prefix: str, redis_client: object
) -> None:
    clock = Clock()
    limiter, sent = _limiter(redis_url, clock, redis_prefix, concurrent=1)
    lease = await limiter.admit("t", 0)
    assert lease.in_redis and sent == ["admit"]
    for _ in range(4):
        with pytest.raises(RateLimited, match="in flight") as refused:
            await limiter.admit("t", 0)
        assert refused.value.headers["retry-after"] == "1"
    assert sent == ["admit", "admit"]  # the first refusal asked; the rest did not
    assert limiter.known_refusal("t") is not None
    assert limiter.known_refusal("other") is None
    assert (await limiter.admit("other", 0)).in_redis  # another tenant asks Redis
    clock.now += FULL_HOLD_S
    await limiter.release(lease)
    assert limiter.known_refusal("t") is None
    assert (await limiter.admit("t", 0)).in_redis  # asked again once the moment passed
    assert sent == ["admit", "admit", "admit", "release", "admit"]
    await limiter.aclose()
