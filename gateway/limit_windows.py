"""Counting limits in this process: the embedded default's per-tenant counters (and the
stand-in while Redis is down), what Redis last said of each tenant's windows, and the
requests of each client address that no key accounts for."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gateway.config import LimitsConfig

WINDOW_S = 60.0
CLIENTS_TRACKED = 65_536  # client addresses with a window open at once
FULL_HOLD_S = 0.25  # a tenant Redis found at its in-flight limit is refused here this long


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

    def refusal(self, tenant: str, limits: LimitsConfig) -> Verdict | None:
        """The refusal a request of ``tenant`` gets from the counts alone (its requests in
        flight or a minute all used), or None; counts nothing."""
        now = self._clock()
        r_end, requests = self._window((tenant, "requests"), now)
        if self._inflight.get(tenant, 0) >= limits.concurrent:
            refused = "concurrent"
        elif requests >= limits.requests_per_minute:
            refused = "requests"
        else:
            return None
        t_end, used = self._window((tenant, "tokens"), now)
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
    live after the call was sent, never later than Redis ends it. A tenant Redis found
    with all its requests in flight is refused from here for ``FULL_HOLD_S`` (its 429
    says retry after 1 s): a client hammering at that limit costs a round trip at most
    that often. Anything else is decided by Redis."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._requests: dict[str, tuple[int, float]] = {}  # tenant -> (count, window end)
        self._tokens: dict[str, tuple[int, float]] = {}
        self._full: dict[str, float] = {}  # tenant -> when its in-flight refusals end here

    def note_full(self, tenant: str, asked_at: float) -> None:
        """Redis refused a call sent at ``asked_at``: the tenant's requests were all in flight."""
        self._full[tenant] = asked_at + FULL_HOLD_S

    def note(self, tenant: str, kind: str, count: int, reset_s: float, asked_at: float) -> None:
        """Redis's ``requests`` or ``tokens`` count, for a call sent at ``asked_at``."""
        seen = self._requests if kind == "requests" else self._tokens
        seen[tenant] = (count, asked_at + reset_s)

    def refusal(
        self,
        tenant: str,
        limits: LimitsConfig,
        tokens: int,
        requests: int = 1,
        in_flight: bool = True,
    ) -> Verdict | None:
        """The refusal the counts seen already give ``requests`` more requests and
        ``tokens`` more tokens (``in_flight``: to be counted in flight), or None (ask
        Redis)."""
        now = self._clock()
        used_requests, requests_end = self._requests.get(tenant, (0, now))
        used_tokens, tokens_end = self._tokens.get(tenant, (0, now))
        if in_flight and self._full.get(tenant, now) > now:
            kind = "concurrent"
        elif requests_end > now and used_requests + requests > limits.requests_per_minute:
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


class ClientWindows:
    """Requests a minute per client address, for traffic no key accounts for.

    At most ``capacity`` addresses hold a window at once: while that many do, a request
    from another address counts as over its limit (what is counted here is refused
    anyway, so failing closed costs nobody an answer), and ended windows are swept out
    at most once a second, so a flood from many addresses costs no sweep per request."""

    def __init__(self, clock: Callable[[], float], capacity: int = CLIENTS_TRACKED) -> None:
        self._clock = clock
        self._capacity = capacity
        self._windows: dict[str, tuple[float, int]] = {}  # address -> (end, count)
        self._swept_at = float("-inf")

    def count(self, address: str, limit: int) -> float | None:
        """One more request from ``address``: None while its window holds at most
        ``limit``, else the seconds until that window ends."""
        now = self._clock()
        window = self._windows.get(address)
        if window is None or window[0] <= now:
            if window is None and len(self._windows) >= self._capacity and not self._sweep(now):
                return WINDOW_S
            window = (now + WINDOW_S, 0)
        end, count = window
        if count >= limit:
            return end - now
        self._windows[address] = (end, count + 1)
        return None

    def _sweep(self, now: float) -> bool:
        """Forget ended windows (at most once a second); whether there is room now."""
        if now - self._swept_at >= 1.0:
            self._swept_at = now
            self._windows = {a: w for a, w in self._windows.items() if w[0] > now}
        return len(self._windows) < self._capacity
