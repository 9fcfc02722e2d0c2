"""The ejection state machine on a hand-driven clock."""

from __future__ import annotations

from gateway.config import RoutingConfig
from gateway.routing.health import Health


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _health(**config: float) -> tuple[Health, Clock]:
    clock = Clock()
    return Health(RoutingConfig(**config), clock), clock  # type: ignore[arg-type]


def test_failures_within_the_window_eject() -> None:
    health, clock = _health(failures=3, window_s=10, eject_s=5)
    health.failed()
    health.failed()
    assert health.state == "healthy" and health.admits()
    health.failed()
    assert health.state == "ejected"
    assert not health.admits() and not health.acquire()
    assert health.ejected_for_s == 5
    assert health.ejections == 1


def test_failures_spread_beyond_the_window_do_not_eject() -> None:
    health, clock = _health(failures=3, window_s=10, eject_s=5)
    for _ in range(5):
        health.failed()
        clock.now += 6
    assert health.state == "healthy"


def test_half_open_admits_one_trial_and_success_readmits() -> None:
    health, clock = _health(failures=1, eject_s=5)
    health.failed()
    clock.now += 4.9
    assert health.state == "ejected"
    clock.now += 0.1
    assert health.state == "half-open"
    assert health.acquire()  # the trial
    assert not health.admits() and not health.acquire()  # no second request meanwhile
    health.succeeded()
    assert health.state == "healthy" and health.acquire() and health.acquire()


def test_failed_trial_doubles_the_back_off_up_to_the_cap() -> None:
    health, clock = _health(failures=1, eject_s=5, max_eject_s=12)
    health.failed()
    backoffs = []
    for _ in range(3):
        clock.now += health.ejected_for_s
        assert health.acquire()
        health.failed()
        backoffs.append(health.ejected_for_s)
    assert backoffs == [10, 12, 12]
    clock.now += 12
    assert health.acquire()
    health.succeeded()
    health.failed()  # a fresh ejection starts from eject_s again
    assert health.ejected_for_s == 5


def test_a_released_trial_frees_the_slot() -> None:
    health, clock = _health(failures=1, eject_s=5)
    health.failed()
    clock.now += 5
    assert health.acquire()
    health.released()  # the client went away before an answer
    assert health.state == "half-open" and health.acquire()


def test_late_failures_of_requests_sent_before_ejection_do_not_extend_it() -> None:
    health, clock = _health(failures=1, eject_s=5)
    health.failed()
    health.failed()
    assert health.ejected_for_s == 5 and health.ejections == 1
