"""A circuit breaker, so an unreachable store costs requests nothing while it is down."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Literal

State = Literal["closed", "open", "half_open"]


class CircuitBreaker:
    """Opens after ``failure_threshold`` consecutive failures.

    While open it refuses calls; once ``reset_after_s`` has passed it lets one trial call
    through (half-open): success closes it, failure opens it for another cool-down.
    ``clock`` is injectable so tests drive time instead of sleeping.
    """

    def __init__(
        self,
        failure_threshold: int = 3,
        reset_after_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if failure_threshold < 1 or reset_after_s < 0:
            raise ValueError("failure_threshold must be >= 1 and reset_after_s >= 0")
        self.failure_threshold = failure_threshold
        self.reset_after_s = reset_after_s
        self._clock = clock
        self._failures = 0
        self._opened_at: float | None = None
        self._trial = False

    @property
    def state(self) -> State:
        if self._opened_at is None:
            return "closed"
        return "half_open" if self._trial else "open"

    def allow(self) -> bool:
        """Whether a call may go ahead now."""
        if self._opened_at is None:
            return True
        now = self._clock()
        if now - self._opened_at < self.reset_after_s:
            return False
        # One trial per cool-down; re-arming the timer means a lost trial cannot wedge it.
        self._opened_at = now
        self._trial = True
        return True

    def success(self) -> None:
        self._failures = 0
        self._opened_at = None
        self._trial = False

    def failure(self) -> None:
        self._failures += 1
        if self._trial or self._failures >= self.failure_threshold:
            self._opened_at = self._clock()
            self._trial = False
