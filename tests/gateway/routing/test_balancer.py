"""The balancer's orders: least-busy by load and latency, prefix affinity with its load
bound, ordered, and unhealthy endpoints last."""

from __future__ import annotations

import math
import random
from collections import Counter
from contextlib import ExitStack

from gateway.config import EndpointConfig, RoutingConfig
from gateway.routing.balancer import Balancer, rendezvous_weight


def _endpoints(n: int) -> list[EndpointConfig]:
    return [
        EndpointConfig(name=f"r{i}", kind="vllm", base_url=f"http://r{i}/v1", models=("m",))
        for i in range(n)
    ]


def _balancer(n: int, clock: list[float] | None = None, **config: object) -> Balancer:
    now = clock or [0.0]
    return Balancer(
        RoutingConfig(**config),  # type: ignore[arg-type]
        _endpoints(n),
        lambda: now[0],
        rng=random.Random(7),
    )


def _names(balancer: Balancer, key: str | None = None) -> list[str]:
    endpoints = _endpoints(len(balancer.replicas))
    return [e.name for e, _ in balancer.plan("m", endpoints, key)]


def test_least_busy_prefers_fewer_requests_in_flight() -> None:
    balancer = _balancer(3)
    balancer.replicas["r0"].in_flight = 2
    balancer.replicas["r1"].in_flight = 0
    balancer.replicas["r2"].in_flight = 1
    assert _names(balancer) == ["r1", "r2", "r0"]


def test_least_busy_weights_load_by_latency() -> None:
    balancer = _balancer(2)
    balancer.replicas["r0"].observe_latency(1.0)
    balancer.replicas["r1"].observe_latency(3.0)
    balancer.replicas["r0"].in_flight = 1  # (1+1)*1.0 = 2 < (0+1)*3.0
    assert _names(balancer)[0] == "r0"
    balancer.replicas["r0"].in_flight = 3  # (3+1)*1.0 = 4 > 3
    assert _names(balancer)[0] == "r1"


def test_least_busy_spreads_concurrent_requests_evenly() -> None:
    balancer = _balancer(2)
    endpoints = _endpoints(2)
    held = []
    with ExitStack() as in_flight:
        for _ in range(10):
            first = balancer.plan("m", endpoints)[0][0].name
            in_flight.enter_context(balancer.attempt(first))
            held.append(first)
        assert Counter(held) == {"r0": 5, "r1": 5}
    assert balancer.replicas["r0"].in_flight == balancer.replicas["r1"].in_flight == 0


def test_least_busy_tries_again_an_endpoint_one_slow_request_kept_out() -> None:
    balancer = _balancer(2)
    endpoints = _endpoints(2)
    fast, slow = balancer.replicas["r0"], balancer.replicas["r1"]
    fast.observe_latency(0.01)
    slow.observe_latency(2.0)  # one cold request
    fast.in_flight = 3  # a busy fast endpoint: 4 * 0.01 < 2.0 for a while
    firsts = [balancer.plan("m", endpoints)[0][0].name for _ in range(40)]
    back = firsts.index("r1")
    assert 0 < back < 30 and firsts[:back] == ["r0"] * back
    # the average came down only as far as the load made it worth a try
    assert 0.01 < slow.latency_ewma_s < 4 * 0.01  # type: ignore[operator]
    assert fast.latency_ewma_s == 0.01  # a lower average is never raised


def test_latency_moving_average() -> None:
    balancer = _balancer(1)
    replica = balancer.replicas["r0"]
    replica.observe_latency(1.0)
    replica.observe_latency(2.0)
    assert replica.latency_ewma_s == 1.0 + 0.3 * (2.0 - 1.0)


def test_prefix_keeps_a_key_on_one_endpoint_and_spreads_keys() -> None:
    balancer = _balancer(3, strategy="prefix")
    firsts = {key: _names(balancer, key)[0] for key in (f"session-{i}" for i in range(300))}
    for key, first in list(firsts.items())[:20]:
        assert _names(balancer, key)[0] == first
    counts = Counter(firsts.values())
    assert set(counts) == {"r0", "r1", "r2"}
    assert min(counts.values()) > 60  # about a third each


def test_prefix_moves_only_the_removed_endpoints_keys() -> None:
    keys = [f"k{i}" for i in range(200)]
    three = {k: max(("r0", "r1", "r2"), key=lambda n: rendezvous_weight(k, n)) for k in keys}
    two = {k: max(("r0", "r1"), key=lambda n: rendezvous_weight(k, n)) for k in keys}
    assert all(two[k] == three[k] for k in keys if three[k] != "r2")


def test_prefix_load_bound_overflows_a_hot_key() -> None:
    balancer = _balancer(2, strategy="prefix", load_factor=1.25)
    endpoints = _endpoints(2)
    home = balancer.plan("m", endpoints, "hot")[0][0].name
    placed = []
    with ExitStack() as in_flight:
        for n in range(1, 9):  # one hot prefix, eight requests in flight at once
            first = balancer.plan("m", endpoints, "hot")[0][0].name
            in_flight.enter_context(balancer.attempt(first))
            placed.append(first)
            # the bound: no endpoint holds more than ceil(1.25 * n / 2) of n in flight
            assert balancer.replicas[home].in_flight <= math.ceil(1.25 * n / 2)
    assert placed[:2] == [home, home]  # affinity while under the bound
    assert Counter(placed)[home] == 5


def test_prefix_without_a_bound_breach_sends_sequential_turns_home() -> None:
    balancer = _balancer(2, strategy="prefix")
    endpoints = _endpoints(2)
    homes = set()
    for _ in range(10):  # one request at a time: never over the bound
        first = balancer.plan("m", endpoints, "session-a")[0][0].name
        with balancer.attempt(first) as attempt:
            attempt.succeeded(0.1)
        homes.add(first)
    assert len(homes) == 1


def test_ordered_keeps_configuration_order_and_fallback_models_are_ordered() -> None:
    balancer = _balancer(3, strategy="ordered")
    balancer.replicas["r0"].in_flight = 9
    assert _names(balancer) == ["r0", "r1", "r2"]
    pinned = Balancer(RoutingConfig(), _endpoints(2), lambda: 0.0, ordered_models=frozenset({"m"}))
    pinned.replicas["r0"].in_flight = 9
    assert [e.name for e, _ in pinned.plan("m", _endpoints(2))] == ["r0", "r1"]


def test_ejected_endpoints_come_last_and_are_marked() -> None:
    clock = [0.0]
    balancer = _balancer(2, clock, failures=1, eject_s=5, strategy="ordered")
    with balancer.attempt("r0") as attempt:
        attempt.failed()
    plan = balancer.plan("m", _endpoints(2))
    assert [(e.name, admitted) for e, admitted in plan] == [("r1", True), ("r0", False)]
    clock[0] = 5.0
    assert [(e.name, a) for e, a in balancer.plan("m", _endpoints(2))] == [
        ("r0", True),
        ("r1", True),
    ]


def test_an_attempt_without_outcome_releases_a_trial() -> None:
    clock = [0.0]
    balancer = _balancer(2, clock, failures=1, eject_s=5)
    with balancer.attempt("r0") as attempt:
        attempt.failed()
    clock[0] = 5.0
    health = balancer.replicas["r0"].health
    assert health.acquire()
    with balancer.attempt("r0"):
        pass  # the client disconnected: no outcome
    assert health.admits() and balancer.replicas["r0"].in_flight == 0


def test_a_half_open_endpoint_gets_its_trial_first_despite_a_stale_latency() -> None:
    clock = [0.0]
    balancer = _balancer(2, clock, failures=1, eject_s=5)
    balancer.replicas["r0"].observe_latency(60.0)  # slow before it failed
    balancer.replicas["r1"].observe_latency(1.0)
    with balancer.attempt("r0") as attempt:
        attempt.failed()
    assert _names(balancer)[0] == "r1"
    clock[0] = 5.0  # half-open
    assert _names(balancer)[0] == "r0"
    assert balancer.replicas["r0"].health.acquire()  # the trial is claimed
    assert _names(balancer)[0] == "r1"  # meanwhile the others go by load again
