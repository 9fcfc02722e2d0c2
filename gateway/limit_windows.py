"""Counting per-tenant limits in this process: the embedded default's counters (and the
stand-in while Redis is down), and what Redis last said of each tenant's windows."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gateway.config import LimitsConfig

WINDOW_S = 60.0


@dataclass(frozen=True)
class Verdict:
    """One admission's outcome and the counts after it."""

    refused: str | None  # None, "concurrent", "requests", "tokens"
    requests: int
    tokens: int
    requests_reset_s: float
    tokens_reset_s: float


class Windows:
    """This process's counters (the embedded default, and the stand-in while Redis is down)."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._inflight: dict[str, int] = {}
        self._windows: dict[tuple[str, str], tuple[float, int]] = {}  # -> (end, count)

    def _window(self, key: tuple[str, str], now: float) -> tuple[float, int]:
        end, count = self._windows.get(key, (0.0, 0))
        return (end, count) if end > now else (now + WINDOW_S, 0)

    def admit(self, tenant: str, limits: LimitsConfig, tokens: int) -> Verdict:
        now = self._clock()
        if len(self._windows) > 4096:  # forget ended windows now and then
            self._windows = {k: v for k, v in self._windows.items() if v[0] > now}
        r_end, requests = self._window((tenant, "requests"), now)
        t_end, used = self._window((tenant, "tokens"), now)
        refused = None
        if self._inflight.get(tenant, 0) >= limits.concurrent:
            refused = "concurrent"
        elif requests + 1 > limits.requests_per_minute:
            refused = "requests"
        elif used + tokens > limits.tokens_per_minute:
            refused = "tokens"
        else:
            self._inflight[tenant] = self._inflight.get(tenant, 0) + 1
            requests, used = requests + 1, used + tokens
            self._windows[(tenant, "requests")] = (r_end, requests)
            self._windows[(tenant, "tokens")] = (t_end, used)
        return Verdict(refused, requests, used, r_end - now, t_end - now)

    def charge(self, tenant: str, limit: int, tokens: int) -> Verdict:
        now = self._clock()
        end, used = self._window((tenant, "tokens"), now)
        if used + tokens > limit:
            return Verdict("tokens", 0, used, 0.0, end - now)
        self._windows[(tenant, "tokens")] = (end, used + tokens)
        return Verdict(None, 0, used + tokens, 0.0, end - now)

    def release(self, tenant: str) -> None:
        left = self._inflight.get(tenant, 0) - 1
        if left > 0:
            self._inflight[tenant] = left
        else:
            self._inflight.pop(tenant, None)

    def count(self, tenant: str, kind: str, limit: int) -> tuple[bool, int, float]:
        """One more in the ``kind`` window (uploads, requests) unless that passes
        ``limit``: whether it fitted, the count and the seconds left in the window."""
        now = self._clock()
        end, count = self._window((tenant, kind), now)
        if count + 1 > limit:
            return False, count, end - now
        self._windows[(tenant, kind)] = (end, count + 1)
        return True, count + 1, end - now


class Seen:
    """The counts Redis last answered for each tenant, and when their windows end.

    Within a minute window counts only grow (other replicas' requests add to them), so a
    request those counts already refuse (the window's requests all used, or its tokens
    too few) is refused from here, without a Redis call: the requests a refused client
    keeps sending cost the gateway no round trip. A window is taken to end its time to
    live after the call was sent, never later than Redis ends it. Anything else is
    decided by Redis."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._requests: dict[str, tuple[int, float]] = {}  # tenant -> (count, window end)
        self._tokens: dict[str, tuple[int, float]] = {}

    def note(self, tenant: str, kind: str, count: int, reset_s: float, asked_at: float) -> None:
        """Redis's ``requests`` or ``tokens`` count, for a call sent at ``asked_at``."""
        seen = self._requests if kind == "requests" else self._tokens
        seen[tenant] = (count, asked_at + reset_s)

    def refusal(
        self, tenant: str, limits: LimitsConfig, tokens: int, requests: int = 1
    ) -> Verdict | None:
        """The refusal the counts seen already give ``requests`` more requests and
        ``tokens`` more tokens, or None (ask Redis)."""
        now = self._clock()
        used_requests, requests_end = self._requests.get(tenant, (0, now))
        used_tokens, tokens_end = self._tokens.get(tenant, (0, now))
        if requests_end > now and used_requests + requests > limits.requests_per_minute:
            kind = "requests"
        elif tokens and tokens_end > now and used_tokens + tokens > limits.tokens_per_minute:
            kind = "tokens"
        else:
            return None
        return Verdict(
            kind,
            used_requests,
            used_tokens,
            max(requests_end - now, 0.0),
            max(tokens_end - now, 0.0),
        )
