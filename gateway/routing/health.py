"""Passive health of one endpoint: a small state machine on an injectable clock.

States::

    healthy --(``failures`` failures within ``window_s``)--> ejected
    ejected --(back-off elapsed)--> half-open
    half-open --(the one trial request succeeds, or an active check passes)--> healthy
    half-open --(the trial fails)--> ejected, back-off doubled (up to ``max_eject_s``)

An ejected endpoint gets no traffic while another endpoint of the model is available; a
half-open one admits exactly one request (the trial) at a time. A success while healthy
clears the back-off, so only consecutive ejections grow it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Literal

from gateway.config import RoutingConfig

Clock = Callable[[], float]
State = Literal["healthy", "ejected", "half-open"]


class Health:
    """One endpoint's health (not thread-safe: used from the event loop only)."""

    def __init__(self, config: RoutingConfig, clock: Clock) -> None:
        self._config = config
        self._clock = clock
        self._failures: deque[float] = deque()
        self._ejected_until: float | None = None
        self._backoff_s = config.eject_s
        self._trial_in_flight = False
        self.ejections = 0

    @property
    def state(self) -> State:
        if self._ejected_until is None:
            return "healthy"
        if self._clock() < self._ejected_until:
            return "ejected"
        return "half-open"

    @property
    def ejected_for_s(self) -> float:
        """Seconds left of the current back-off (0 unless ejected)."""
        if self._ejected_until is None:
            return 0.0
        return max(0.0, self._ejected_until - self._clock())

    def admits(self) -> bool:
        """Whether a request may go here now (read-only; :meth:`acquire` claims a trial)."""
        state = self.state
        return state == "healthy" or (state == "half-open" and not self._trial_in_flight)

    def acquire(self) -> bool:
        """Claim the right to send one request: always when healthy, the single trial slot
        when half-open, never when ejected."""
        state = self.state
        if state == "healthy":
            return True
        if state == "half-open" and not self._trial_in_flight:
            self._trial_in_flight = True
            return True
        return False

    def succeeded(self) -> None:
        """A request (or an active check) got a good answer."""
        self._trial_in_flight = False
        self._ejected_until = None
        self._failures.clear()
        self._backoff_s = self._config.eject_s

    def failed(self) -> None:
        """A request (or an active check) failed for a reason that is the endpoint's."""
        now = self._clock()
        if self._ejected_until is not None:
            if self._trial_in_flight or now >= self._ejected_until:
                self._eject(now, self._backoff_s * 2)
            return
        window = self._config.window_s
        self._failures.append(now)
        while self._failures and self._failures[0] <= now - window:
            self._failures.popleft()
        if len(self._failures) >= self._config.failures:
            self._eject(now, self._config.eject_s)

    def released(self) -> None:
        """A claimed request never reached the endpoint (an earlier one answered)."""
        self._trial_in_flight = False

    def _eject(self, now: float, backoff_s: float) -> None:
        self._backoff_s = min(backoff_s, self._config.max_eject_s)
        self._ejected_until = now + self._backoff_s
        self._failures.clear()
        self._trial_in_flight = False
        self.ejections += 1
