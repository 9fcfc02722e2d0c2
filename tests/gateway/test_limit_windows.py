"""The counts Redis last answered refuse what they already refuse, and nothing else."""

from __future__ import annotations

from gateway.config import LimitsConfig
from gateway.limit_windows import Seen

LIMITS = LimitsConfig(requests_per_minute=3, tokens_per_minute=1000)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_full_request_window_refuses_until_it_ends() -> None:
    clock = Clock()
    seen = Seen(clock)
    assert seen.refusal("t", LIMITS, 10) is None  # nothing seen: ask Redis
    seen.note("t", "requests", 2, 30.0, asked_at=99.0)
    assert seen.refusal("t", LIMITS, 10) is None  # one request left
    seen.note("t", "requests", 3, 30.0, asked_at=99.0)
    refused = seen.refusal("t", LIMITS, 10)
    assert refused is not None and refused.refused == "requests"
    assert refused.requests_reset_s == 29.0  # from when the call was sent, not answered
    assert seen.refusal("t", LIMITS, 10, requests=0) is None  # a charge is no request
    assert seen.refusal("u", LIMITS, 10) is None  # another tenant
    clock.now = 129.0
    assert seen.refusal("t", LIMITS, 10) is None  # the window ended: ask Redis


def test_tokens_seen_refuse_only_what_they_cannot_fit() -> None:
    clock = Clock()
    seen = Seen(clock)
    seen.note("t", "tokens", 900, 10.0, asked_at=100.0)
    assert seen.refusal("t", LIMITS, 100) is None
    refused = seen.refusal("t", LIMITS, 101, requests=0)
    assert refused is not None and refused.refused == "tokens"
    assert (refused.tokens, refused.tokens_reset_s) == (900, 10.0)
    clock.now = 110.0
    assert seen.refusal("t", LIMITS, 101) is None
