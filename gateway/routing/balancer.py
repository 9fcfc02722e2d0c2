"""Which of a model's endpoints a request tries first, second, ...: the balancer.

Every endpoint is a :class:`Replica` with its requests in flight, a moving average of its
latency and its :class:`~gateway.routing.health.Health`. ``Balancer.plan`` orders a
model's endpoints for one request by the configured strategy:

- ``least-busy``: ascending ``(in_flight + 1) * latency_ewma`` (ties broken at random; an
  endpoint with no latency yet counts as the mean of the others). Only an endpoint's own
  requests update its average, so one slow request (a cold start, a long generation)
  would keep it out for good: each request that goes elsewhere moves a higher average
  ``LATENCY_AGING`` of the way to the chosen endpoint's, so it is tried again within a
  few requests and its latency measured anew;
- ``prefix``: rendezvous (highest-random-weight) hashing of the request's routing key, so a
  key keeps its endpoint while the set of endpoints stays the same and only ``1/n`` of the
  keys move when one is added or removed; an endpoint that already carries more than
  ``load_factor`` times its share of the model's requests in flight (counting this one) is
  passed over (bounded-load consistent hashing, as in SGLang's router);
- ``ordered``: configuration order (models in ``[fallback]`` always use their order).

A half-open endpoint whose trial slot is free comes first (the trial must happen for it to
be re-admitted). Endpoints whose health does not admit a request come last: they are tried
only when every other endpoint failed, so ejection never turns a working request into an
error.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

from gateway.config import EndpointConfig, RoutingConfig, RoutingStrategy
from gateway.routing.health import Clock, Health
from sdk.wire.endpoints import RoutingState

LATENCY_ALPHA = 0.3  # weight of the newest latency in the moving average
LATENCY_AGING = 0.2  # how far a request routed elsewhere moves a higher average down


@dataclass
class Replica:
    """One endpoint as the balancer sees it."""

    name: str
    health: Health
    in_flight: int = 0
    latency_ewma_s: float | None = None
    requests: int = 0

    def passed_over_for(self, chosen: Replica) -> None:
        """Age this replica's average toward ``chosen``'s, which took a request instead."""
        mine, theirs = self.latency_ewma_s, chosen.latency_ewma_s
        if mine is not None and theirs is not None and mine > theirs:
            self.latency_ewma_s = mine - LATENCY_AGING * (mine - theirs)

    def observe_latency(self, seconds: float) -> None:
        previous = self.latency_ewma_s
        self.latency_ewma_s = (
            seconds if previous is None else previous + LATENCY_ALPHA * (seconds - previous)
        )


@dataclass
class Attempt:
    """One request's use of one replica: counted in flight until the block exits."""

    replica: Replica
    outcome: bool | None = field(default=None)

    def succeeded(self, latency_s: float) -> None:
        self.outcome = True
        self.replica.observe_latency(latency_s)
        self.replica.health.succeeded()

    def failed(self) -> None:
        self.outcome = False
        self.replica.health.failed()


def rendezvous_weight(key: str, name: str) -> int:
    """The hash weight of endpoint ``name`` for routing key ``key`` (stable across processes)."""
    digest = hashlib.blake2b(f"{name}\x00{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


class Balancer:
    """Orders endpoints per request and keeps each endpoint's load, latency and health."""

    def __init__(
        self,
        config: RoutingConfig,
        endpoints: Sequence[EndpointConfig],
        clock: Clock,
        *,
        ordered_models: frozenset[str] = frozenset(),
        rng: random.Random | None = None,
    ) -> None:
        self.config = config
        self.replicas = {e.name: Replica(e.name, Health(config, clock)) for e in endpoints}
        self._ordered_models = ordered_models
        self._rng = rng or random.Random()

    def strategy_for(self, model: str) -> RoutingStrategy:
        return "ordered" if model in self._ordered_models else self.config.strategy

    def plan(
        self, model: str, endpoints: Sequence[EndpointConfig], key: str | None = None
    ) -> list[tuple[EndpointConfig, bool]]:
        """``endpoints`` (those serving ``model``) in the order this request tries them,
        each with whether its health admits the request (``False``: tried only as a last
        resort, without claiming a half-open trial)."""
        if len(endpoints) < 2:
            return [(e, True) for e in endpoints]
        strategy = self.strategy_for(model)
        by_load = False
        if strategy == "prefix" and key is not None:
            ordered = self._by_prefix(endpoints, key)
        elif strategy == "ordered":
            ordered = list(endpoints)
        else:
            ordered, by_load = self._by_load(endpoints), True
        admitted = [e for e in ordered if self.replicas[e.name].health.admits()]
        # a half-open endpoint's trial goes first: a stale latency average or a prefix's
        # home elsewhere must not keep it from ever being tried again
        trials = [e for e in admitted if self.replicas[e.name].health.state == "half-open"]
        admitted = trials + [e for e in admitted if e not in trials]
        if by_load and admitted:  # the first takes the request: the others' averages age
            chosen = self.replicas[admitted[0].name]
            for e in ordered:
                if e is not admitted[0]:
                    self.replicas[e.name].passed_over_for(chosen)
        return [(e, True) for e in admitted] + [(e, False) for e in ordered if e not in admitted]

    def _by_load(self, endpoints: Sequence[EndpointConfig]) -> list[EndpointConfig]:
        known = [
            r.latency_ewma_s
            for e in endpoints
            if (r := self.replicas[e.name]).latency_ewma_s is not None
        ]
        default = sum(known) / len(known) if known else 1.0

        def score(e: EndpointConfig) -> tuple[float, float]:
            r = self.replicas[e.name]
            latency = r.latency_ewma_s if r.latency_ewma_s is not None else default
            return ((r.in_flight + 1) * max(latency, 1e-6), self._rng.random())

        return sorted(endpoints, key=score)

    def _by_prefix(self, endpoints: Sequence[EndpointConfig], key: str) -> list[EndpointConfig]:
        ranked = sorted(endpoints, key=lambda e: rendezvous_weight(key, e.name), reverse=True)
        live = [e for e in ranked if self.replicas[e.name].health.admits()] or ranked
        total = sum(self.replicas[e.name].in_flight for e in live) + 1
        bound = math.ceil(self.config.load_factor * total / len(live))
        under = [e for e in ranked if self.replicas[e.name].in_flight + 1 <= bound]
        return under + [e for e in ranked if e not in under]

    def state(self, name: str) -> RoutingState:
        """Endpoint ``name``'s balancing and health state (for ``GET /v1/endpoints``)."""
        r = self.replicas[name]
        return RoutingState(
            state=r.health.state,
            ejected_for_s=r.health.ejected_for_s,
            in_flight=r.in_flight,
            latency_ewma_s=r.latency_ewma_s,
            requests=r.requests,
            ejections=r.health.ejections,
        )

    @contextmanager
    def attempt(self, name: str) -> Iterator[Attempt]:
        """Count one request in flight on ``name``; a claimed half-open trial that ends
        without an outcome (the client left) is released for the next request."""
        replica = self.replicas[name]
        replica.in_flight += 1
        replica.requests += 1
        attempt = Attempt(replica)
        try:
            yield attempt
        finally:
            replica.in_flight -= 1
            if attempt.outcome is None:
                replica.health.released()
